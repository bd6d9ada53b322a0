// The receiver's version transaction (src/version_state.hpp) as its transition table says:
// every phase, every event, and what each leaves in poll's words. Receiver-level behaviour (which
// request triggers which event) is specified across processes in test_transactions.c and
// test_shm.c; this file pins the state machine those rest on.
#include <cstdint>
#include <string>

#include "version_state.hpp"

#include "whitebox.hpp"

using wsync::VersionState;
using Phase = wsync::VersionState::Phase;
// (s.fail)(...): cmocka defines a fail() macro; the parentheses keep it from expanding.

// A new receiver: nothing begun, nothing open, failed or completed; failing changes nothing.
static void a_new_receiver_has_no_version_and_nothing_fails_it(void **) {
    VersionState s;
    assert_true(s.phase() == Phase::kNone);
    assert_int_equal(s.version(), 0);
    assert_int_equal(s.open_version(), 0);
    assert_false((s.fail)(WSYNC_ERR_PEER));
    assert_true(s.phase() == Phase::kNone);
    assert_int_equal(s.failed_version(), 0);
    assert_int_equal(s.failed_status(), WSYNC_OK);
}

// open(v) -> completed(v): completed and version stay v, expect() says every later chunk of v
// is a replay, and a failure afterwards (the trainer dies, a later version is abandoned) does
// not undo it.
static void a_completed_version_is_never_failed_afterwards(void **) {
    VersionState s;
    s.begin(1);
    s.expect_after(0);
    assert_true(s.open());
    assert_int_equal(s.open_version(), 1);
    assert_int_equal(s.expect(), 1);
    s.complete();
    assert_true(s.phase() == Phase::kCompleted);
    assert_int_equal(s.completed(), 1);
    assert_int_equal(s.version(), 1);
    assert_int_equal(s.open_version(), 0);
    assert_int_equal(s.expect(), UINT32_MAX);
    assert_false((s.fail)(WSYNC_ERR_PEER));
    assert_true(s.phase() == Phase::kCompleted);
    assert_int_equal(s.failed_version(), 0);
}

// open(v) -> failed(v, s): the status and the first reason are kept (explain), a later reason
// replaces it only by set_why, a second failure changes neither status nor failed_version, and
// complete() on a failed version does nothing.
static void a_failed_version_keeps_its_first_status_and_never_completes(void **) {
    VersionState s;
    s.begin(4);
    assert_true((s.fail)(WSYNC_ERR_INTEGRITY));
    s.explain("tensor 'a' corrupt");
    s.explain("later reason");
    assert_true(s.failed());
    assert_int_equal(s.status(), WSYNC_ERR_INTEGRITY);
    assert_string_equal(s.why().c_str(), "tensor 'a' corrupt");
    assert_false((s.fail)(WSYNC_ERR_ABANDONED));
    assert_int_equal(s.status(), WSYNC_ERR_INTEGRITY);
    s.set_why("the sender abandoned version 4");
    assert_string_equal(s.why().c_str(), "the sender abandoned version 4");
    s.complete();
    assert_true(s.failed());
    assert_int_equal(s.completed(), 0);
    assert_int_equal(s.failed_version(), 4);
    assert_int_equal(s.failed_status(), WSYNC_ERR_INTEGRITY);
    assert_int_equal(s.open_version(), 0);
}

// begin(w) from failed or completed opens w with a clean tally and reason; the completed and
// failed versions recorded before stay as poll reports them.
static void beginning_a_newer_version_starts_clean_and_keeps_the_record(void **) {
    VersionState s;
    s.begin(1);
    s.tally().tensors = 7;
    s.complete();
    s.begin(2);
    (s.fail)(WSYNC_ERR_MISMATCH);
    s.explain("lost");
    s.begin(3);
    assert_true(s.open());
    assert_int_equal(s.version(), 3);
    assert_int_equal(s.tally().tensors, 0);
    assert_true(s.why().empty());
    assert_int_equal(s.status(), WSYNC_OK);
    assert_int_equal(s.completed(), 1);
    assert_int_equal(s.failed_version(), 2);
    assert_int_equal(s.failed_status(), WSYNC_ERR_MISMATCH);
}

// skipped(w, s): versions that never began here raise failed_version to the newest of them,
// never lower it, and leave the phase alone.
static void versions_skipped_whole_raise_the_failed_version_only(void **) {
    VersionState s;
    s.begin(2);
    s.complete();
    s.skipped(5, WSYNC_ERR_MISMATCH);
    assert_true(s.phase() == Phase::kCompleted);
    assert_int_equal(s.failed_version(), 5);
    assert_int_equal(s.failed_status(), WSYNC_ERR_MISMATCH);
    s.skipped(3, WSYNC_ERR_ABANDONED);
    assert_int_equal(s.failed_version(), 5);
    assert_int_equal(s.failed_status(), WSYNC_ERR_MISMATCH);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_new_receiver_has_no_version_and_nothing_fails_it),
        cmocka_unit_test(a_completed_version_is_never_failed_afterwards),
        cmocka_unit_test(a_failed_version_keeps_its_first_status_and_never_completes),
        cmocka_unit_test(beginning_a_newer_version_starts_clean_and_keeps_the_record),
        cmocka_unit_test(versions_skipped_whole_raise_the_failed_version_only),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
