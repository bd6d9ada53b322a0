// The acknowledgement board's sender side, white-box: the liveness check's decisions replayed
// one step at a time, where across processes they are races a test cannot time.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <atomic>
#include <chrono>
#include <thread>

#include "transport/local/board.hpp"
#include "error.hpp"
#include "transport/local/segment.hpp"
#include "wsync.h"

#include "whitebox.hpp"

namespace wsync::board {
struct SenderEndProbe {
    static void check_alive(SenderEnd &e, uint64_t mask, const std::vector<uint32_t> &slots,
                            uint64_t max_seq) {
        e.check_alive(mask, slots, max_seq);
    }
    static void withdraw(SenderEnd &e, const std::vector<uint32_t> &slots, uint64_t max_seq) {
        e.withdraw_abandoned(slots, max_seq);
    }
    static uint64_t pending(const SenderEnd &e, const std::vector<uint32_t> &slots,
                            uint64_t max_seq) {
        return e.pending(slots, max_seq);
    }
    static void audit(SenderEnd &e) { e.audit(); }
    static std::vector<Failure> failures(SenderEnd &e) {
        std::vector<Failure> out;
        e.collect_failures(out);
        return out;
    }
};
}  // namespace wsync::board

using namespace wsync;
using namespace wsync::board;

namespace {

// A board for 2 receivers and 2 slots in its own memory file (the liveness locks need one).
struct Fixture {
    int fd = -1;
    void *mem = nullptr;
    Board *b = nullptr;
    std::unique_ptr<SenderEnd> end;
    Fixture() {
        fd = memfd_create("wsync-test-board", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, sizeof(Board)), 0);
        mem = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(mem != MAP_FAILED);
        b = init(mem, 2, 2);
        end = std::make_unique<SenderEnd>(b, fd, 2, 2, "shm");
        b->receiver[0].state.store(kAttached);
        b->receiver[1].state.store(kAttached);
        end->publish(0, 1, 1, 0);  // chunk seq 1 in slot 0 (chunk 0 of version 1)
    }
    ~Fixture() {
        end.reset();
        munmap(mem, sizeof(Board));
        close(fd);
    }
};

// Whether check_alive(mask of receiver 1, slot 0, seq 1) throws; its message if it does, and
// its one failure in *failure.
std::string check_receiver_1(Fixture &f, Failure *failure = nullptr) {
    try {
        SenderEndProbe::check_alive(*f.end, uint64_t(1) << 1, {0}, 1);
    } catch (const Error &e) {
        assert_int_equal(e.failures().size(), 1);
        if (failure) *failure = e.failures()[0];
        return e.what();
    }
    return "";
}

// An engine that acknowledged its last chunk and then destroyed its receiver (or exited) between
// the sender reading who still owed it and the liveness check is no failure: the flush that
// waited for it succeeds. (Seen once in CI: a trainer's flush failed with "receiver 1 detached
// without acknowledging chunk seq 0" after receiver 1 had acknowledged everything.)
void a_receiver_gone_after_its_last_ack_is_no_failure(void **) {
    Fixture f;
    acknowledge(f.b, 1, 0, 1, WSYNC_OK);
    f.b->receiver[1].state.store(kDetached);  // detached after acknowledging
    assert_string_equal(check_receiver_1(f).c_str(), "");
    f.b->receiver[1].state.store(kAttached);  // or exited: attached, its lock gone with it
    assert_string_equal(check_receiver_1(f).c_str(), "");
}

// One that left without acknowledging is named, with the chunk it owes: its index and version
// as the sender published it (in the text and as the failure's fields), and its seq.
void a_receiver_gone_before_its_ack_is_named_with_the_chunk(void **) {
    Fixture f;
    f.b->receiver[1].state.store(kDetached);
    Failure got;
    std::string msg = check_receiver_1(f, &got);
    assert_non_null(std::strstr(msg.c_str(), "receiver 1"));
    assert_non_null(
        std::strstr(msg.c_str(), "detached without acknowledging chunk 0 of version 1 (seq 1)"));
    assert_int_equal(got.what, WSYNC_FAILURE_DETACHED);
    assert_int_equal(got.version, 1);
    assert_int_equal(got.chunk_index, 0);
    f.b->receiver[1].state.store(kAttached);  // its process gone: no lock held
    msg = check_receiver_1(f, &got);
    assert_non_null(
        std::strstr(msg.c_str(), "died without acknowledging chunk 0 of version 1 (seq 1)"));
    assert_int_equal(got.what, WSYNC_FAILURE_DIED);
    assert_int_equal(got.version, 1);
    // A seq this sender did not publish (another sender's) is named by its seq alone.
    Failure other;
    f.end = std::make_unique<SenderEnd>(f.b, f.fd, 2, 2, "shm");  // has published nothing
    msg = check_receiver_1(f, &other);
    assert_non_null(std::strstr(msg.c_str(), "died without acknowledging chunk seq 1"));
    assert_int_equal(other.version, 0);
    assert_int_equal(other.chunk_index, WSYNC_NO_CHUNK);
}

// Withdrawing chunks of an abandoned version (board.hpp): both sides of the handshake, one
// step at a time. The sole sender published chunk 0 of version 1 as seq 1 in slot 0.
struct Withdrawal : Fixture {
    Withdrawal() { end->set_sole_sender(true); }
    void withdraw() { SenderEndProbe::withdraw(*end, {0}, 1); }
    uint64_t pending() const { return SenderEndProbe::pending(*end, {0}, 1); }
};

// Nobody had begun it: once withdrawn, nobody owes it, and a receiver that gets its request
// late may not read it (take fails: the slot says kWithdrawn).
void a_chunk_nobody_began_is_withdrawn_and_owed_by_nobody(void **) {
    Withdrawal f;
    assert_int_equal(f.pending(), 0b11);
    f.end->abandon(1);
    f.withdraw();
    assert_true(published_seq(f.b, 0) == kWithdrawn);
    assert_int_equal(f.pending(), 0);
    assert_false(take(f.b, 1, 0, 1));
    f.withdraw();  // once only: a receiver's late take does not make it owed again
    assert_int_equal(f.pending(), 0);
}

// Receiver 1 took it before the sender withdrew it (it may be reading): the sender still waits
// for its acknowledgement, and for no one else's.
void a_receiver_that_began_the_chunk_is_still_awaited(void **) {
    Withdrawal f;
    assert_true(take(f.b, 1, 0, 1));
    f.end->abandon(1);
    f.withdraw();
    assert_int_equal(f.pending(), 0b10);
    acknowledge(f.b, 1, 0, 1, WSYNC_ERR_ABANDONED);
    assert_int_equal(f.pending(), 0);
}

// Both sides see each other (review: the receiver wrote taken, the sender wrote kWithdrawn and
// read that taken, the receiver then read kWithdrawn and refused the chunk without answering,
// and the sender waited for it for good): the receiver's failed take answers the chunk
// (acknowledge_taken, what SharedSegment::check_owed does), never moving its answer back.
void a_receiver_and_sender_that_see_each_other_do_not_wedge(void **) {
    Withdrawal f;
    f.b->slot[0].taken[1].store(1);  // the receiver's first step of take()
    f.end->abandon(1);
    f.withdraw();  // sees it: receiver 1 stays awaited
    assert_int_equal(f.pending(), 0b10);
    assert_false(take(f.b, 1, 0, 1));  // its second step reads kWithdrawn
    acknowledge_taken(f.b, 1, 0, 1, WSYNC_ERR_ABANDONED);
    assert_int_equal(f.pending(), 0);
    acknowledge(f.b, 1, 0, 5, WSYNC_OK);  // a later chunk's answer in that slot stays
    acknowledge_taken(f.b, 1, 0, 1, WSYNC_ERR_ABANDONED);
    assert_true(f.b->slot[0].ack[1].load() >> 8 == 5);
}

// Chunks of other versions are never withdrawn: a committed version's (a later version was
// abandoned), and nothing at all when the SenderEnd is not its board's only sender.
void only_a_sole_sender_withdraws_and_only_abandoned_chunks(void **) {
    Withdrawal f;
    f.end->abandon(2);
    f.withdraw();
    assert_true(published_seq(f.b, 0) == 1);
    assert_int_equal(f.pending(), 0b11);
    f.end->set_sole_sender(false);
    f.end->abandon(1);
    f.withdraw();
    assert_true(published_seq(f.b, 0) == 1);
    assert_int_equal(f.pending(), 0b11);
    assert_true(take(f.b, 0, 0, 1));
}

// A dropped receiver's records from before it (re)joined are not reported: an engine dropped
// while it read a chunk fails that chunk, re-attaches at once and is admitted at the next
// version (C++ user trial: its old failure reached the trainer's next send as PEER and
// abandoned that version for every engine). Records written after it joined are, and so are
// those of a receiver the sender never dropped.
void records_from_before_a_receiver_joined_are_not_reported(void **) {
    Fixture f;
    f.end->drop(1);
    record_failure(f.b, 1, WSYNC_ERR_PEER, 1, 0, "dropped while it read chunk 0 of version 1");
    f.b->receiver[1].state.store(kJoining);  // re-attached before the sender looked
    assert_true(SenderEndProbe::failures(*f.end).empty());
    record_failure(f.b, 1, WSYNC_ERR_MISMATCH, 1, 0, "joined while version 1 was in flight");
    assert_int_equal(f.end->admit_joiners(5), 1);  // version 2 begins: it owes from seq 5
    assert_true(SenderEndProbe::failures(*f.end).empty());
    record_failure(f.b, 1, WSYNC_ERR_INTEGRITY, 2, 0, "checksum");
    std::vector<Failure> fs = SenderEndProbe::failures(*f.end);
    assert_int_equal(fs.size(), 1);
    assert_int_equal(fs[0].status, WSYNC_ERR_INTEGRITY);
    assert_true(fs[0].version == 2);
    // A receiver the sender did not drop keeps its voice: it failed a chunk and restarted
    // before the sender looked (review: its failure was skipped, and the flush said OK).
    record_failure(f.b, 0, WSYNC_ERR_MISMATCH, 2, 1, "tensor 'x' does not match the model");
    f.b->receiver[0].state.store(kJoining);
    fs = SenderEndProbe::failures(*f.end);
    assert_int_equal(fs.size(), 1);
    assert_int_equal(fs[0].receiver, 0);
    assert_int_equal(fs[0].status, WSYNC_ERR_MISMATCH);
    record_failure(f.b, 0, WSYNC_ERR_INTEGRITY, 2, 1, "checksum");  // before the sender looked
    f.end->admit_joiners(11);
    fs = SenderEndProbe::failures(*f.end);
    assert_int_equal(fs.size(), 1);
    assert_int_equal(fs[0].status, WSYNC_ERR_INTEGRITY);
}

// A receiver's count of failure records only grows; a count that went back (another process
// wrote it) is reported by name, and the records written after it still arrive (hostile-peer
// trial: a rewound count hid the receiver's next failures from the trainer for good).
void a_failure_count_that_went_back_is_reported_and_later_records_still_arrive(void **) {
    Fixture f;
    record_failure(f.b, 0, WSYNC_ERR_INTEGRITY, 1, 0, "checksum");
    assert_int_equal(SenderEndProbe::failures(*f.end).size(), 1);
    f.b->receiver[0].failures.store(0);  // a stray write
    std::vector<Failure> fs = SenderEndProbe::failures(*f.end);
    assert_int_equal(fs.size(), 1);
    assert_int_equal(fs[0].receiver, 0);
    assert_non_null(strstr(fs[0].message.c_str(), "count of failure records went back from 1 to 0"));
    record_failure(f.b, 0, WSYNC_ERR_MISMATCH, 2, 0, "does not hold version 1");
    fs = SenderEndProbe::failures(*f.end);
    assert_int_equal(fs.size(), 1);
    assert_int_equal(fs[0].status, WSYNC_ERR_MISMATCH);
    assert_true(fs[0].version == 2);
}

// The message of the audit's error, or "" when it finds nothing.
std::string audited(Fixture &f, std::vector<Failure> *failures = nullptr) {
    try {
        SenderEndProbe::audit(*f.end);
    } catch (const Error &e) {
        assert_int_equal(e.status(), WSYNC_ERR_PEER);
        if (failures) *failures = e.failures();
        return e.what();
    }
    return "";
}

// Words only the sender writes, written by another process (hostile-peer trial: a slot's seq
// changed once made every later flush time out for good; an abandoned version of UINT64_MAX,
// a receiver's from_seq of UINT64_MAX or a forged DROPPED state made engines refuse every
// version while the trainer's flush said OK). The sole sender finds each, puts it back and
// says so (PEER, naming the word; the receiver's part as a failure). Its own writes (a drop,
// an abandon, an admission) are no finding, and with several senders it does not judge.
void words_only_the_sender_writes_are_audited_and_put_back(void **) {
    Fixture f;
    f.end->set_sole_sender(true);
    assert_string_equal(audited(f).c_str(), "");
    f.b->slot[0].seq.store(77);
    std::string msg = audited(f);
    assert_non_null(strstr(msg.c_str(), "shm: words on the board that only this sender writes were "
                                        "written by another process (slot 0 said chunk seq 77, "
                                        "this sender published 1; each put back)"));
    assert_true(f.b->slot[0].seq.load() == 1);
    assert_string_equal(audited(f).c_str(), "");  // once put back, nothing more to say
    f.b->abandoned_version.store(UINT64_MAX);
    msg = audited(f);
    assert_non_null(strstr(msg.c_str(), "abandoned_version said 18446744073709551615, this sender's is 0"));
    assert_true(f.b->abandoned_version.load() == 0);
    f.b->receiver[1].from_seq.store(UINT64_MAX);
    f.b->receiver[0].state.store(kDropped);
    std::vector<Failure> fs;
    msg = audited(f, &fs);
    assert_non_null(strstr(msg.c_str(), "receiver 0: its state said dropped, which this sender did not do"));
    assert_non_null(strstr(msg.c_str(), "receiver 1: its from_seq said 18446744073709551615, this sender wrote 0"));
    assert_int_equal(fs.size(), 2);
    assert_int_equal(fs[0].receiver, 0);
    assert_int_equal(fs[1].receiver, 1);
    assert_true(f.b->receiver[1].from_seq.load() == 0);
    assert_int_equal(f.b->receiver[0].state.load(), kAttached);
    // The sender's own writes are not findings.
    f.end->abandon(1);
    f.end->drop(1);
    assert_string_equal(audited(f).c_str(), "");
    f.b->receiver[1].state.store(kJoining);  // it re-attached
    assert_int_equal(f.end->admit_joiners(9), 1);
    assert_string_equal(audited(f).c_str(), "");
    // Not its board's only sender: another's writes are legitimate.
    f.end->set_sole_sender(false);
    f.b->slot[0].seq.store(99);
    assert_string_equal(audited(f).c_str(), "");
}

// Review of the audit: a second sender made from the same blob beside one still going (a
// Python rebinding makes the new object before the old one goes), which then drops a receiver,
// abandons a version and goes away. Its writes are legitimate: the new sender neither reports
// them nor puts its old view back (it used to throw PEER and un-drop the receiver). Once alone
// and looked again, it audits as before.
void another_senders_writes_are_not_findings_and_not_undone(void **) {
    Fixture f;
    f.end->set_sole_sender(true);
    f.end->register_sender();
    auto second = std::make_unique<SenderEnd>(f.b, f.fd, 2, 2, "cuda_ipc");
    second->set_sole_sender(true);
    second->register_sender();
    SenderEndProbe::audit(*second);  // two senders: it stands aside
    f.end->drop(1);
    f.end->abandon(1);
    f.end->unregister_sender();  // the first goes away
    SenderEndProbe::audit(*second);  // alone now: looks again, judges nothing
    SenderEndProbe::audit(*second);
    assert_int_equal(f.b->receiver[1].state.load(), kDropped);
    assert_true(f.b->abandoned_version.load() == 1);
    f.b->abandoned_version.store(7);  // a stray write, now that it is alone
    try {
        SenderEndProbe::audit(*second);
        fail_msg("the audit did not see the stray write");
    } catch (const Error &e) {
        assert_non_null(strstr(e.what(), "abandoned_version said 7, this sender's is 1"));
    }
    assert_true(f.b->abandoned_version.load() == 1);
    second->unregister_sender();
}

// Adversarial trial: a process that wrote one sender_pid word (the trainer's own pid, or its
// own pid while holding that index's lock) made a shm sender stand aside as if a second sender
// were attached: the audit and the withdrawal of abandoned chunks stopped for good, and words
// it forged afterwards (a receiver's from_seq) were adopted as the sender's own. A shm sender is
// its board's only one by design: each such claim is reported (PEER, naming the index and pid)
// and put back, and the audit goes on judging every other word.
void a_forged_sender_claim_is_reported_and_put_back_and_the_audit_goes_on(void **) {
    Fixture f;
    f.end->set_sole_sender(true, /*exclusive=*/true);
    f.end->register_sender();  // index 0
    assert_string_equal(audited(f).c_str(), "");
    const int32_t self = static_cast<int32_t>(getpid());
    f.b->sender_pid[1].store(self);  // claims to be a second sender of this very process
    std::string msg = audited(f);
    const std::string said = "sender index 1 said pid " + std::to_string(self) + ", this board has one sender";
    assert_non_null(strstr(msg.c_str(), said.c_str()));
    assert_int_equal(f.b->sender_pid[1].load(), 0);
    // A live process holding index 2's lock, as a real second sender would.
    // Another process's open file description of the board (reopen_own would close f.fd).
    const int other = open(("/proc/self/fd/" + std::to_string(f.fd)).c_str(), O_RDWR | O_CLOEXEC);
    assert_true(other >= 0);
    assert_true(sys::lock_try(other, kLockBase + kMaxReceivers + 2));  // sender 2's lock byte
    f.b->sender_pid[2].store(424242);
    f.b->receiver[1].from_seq.store(uint64_t(1) << 50);
    msg = audited(f);
    assert_non_null(strstr(msg.c_str(), "sender index 2 said pid 424242, this board has one sender"));
    assert_non_null(strstr(msg.c_str(), "receiver 1: its from_seq said 1125899906842624, this sender wrote 0"));
    assert_true(f.b->receiver[1].from_seq.load() == 0);
    close(other);  // the impostor exits: nothing was adopted from it
    f.b->abandoned_version.store(5);
    assert_non_null(strstr(audited(f).c_str(), "abandoned_version said 5, this sender's is 0"));
    assert_string_equal(audited(f).c_str(), "");
    f.end->unregister_sender();
    // A sender made on a board another one used first takes the board as it finds it at its
    // first audit; a claim found then is still reported (review: it was put back silently).
    f.end = std::make_unique<SenderEnd>(f.b, f.fd, 2, 2, "shm");
    f.end->set_sole_sender(true, /*exclusive=*/true);
    f.end->register_sender();
    f.b->sender_pid[3].store(self);
    assert_non_null(strstr(audited(f).c_str(), "sender index 3 said pid"));
    assert_int_equal(f.b->sender_pid[3].load(), 0);
    assert_string_equal(audited(f).c_str(), "");
    f.end->unregister_sender();
}

// A sender made on a board an earlier one used goes on after the newest version (published or
// abandoned) and seq found there, waits only for its own chunks and reports only failures
// recorded from then on; words past what a sender writes are another process's, and lowered
// words cannot make its seqs restart (review).
void a_sender_made_again_resumes_after_the_newest_version_and_seq_and_refuses_forged_words(void **) {
    Fixture f;  // published chunk seq 1 of version 1
    f.end->publish(1, 2, 2, 0);
    f.end->publish(0, 3, 2, 1);
    f.end->abandon(3);  // a version abandoned before any chunk of it was published
    record_failure(f.b, 0, WSYNC_ERR_MISMATCH, 2, 0, "the loader refused t0");  // reported by f
    SenderEnd again(f.b, f.fd, 2, 2, "cuda_ipc");
    auto [version, seq] = again.resume();
    assert_int_equal(version, 3);
    assert_int_equal(seq, 3);
    // Seqs 2 and 3 (slots 1 and 0) were the earlier sender's: nobody acknowledged them, and
    // they hold no slot of this one; nor is the earlier failure reported again.
    again.wait({0, 1}, sys::Deadline(200), "no free bucket", 3);
    f.end->publish(1, 4, 4, 0);  // the words only grow: an older sender's publish lowers nothing
    f.end->publish(0, 1, 1, 0);
    assert_true(again.resume() == std::make_pair(uint64_t(4), uint64_t(4)));
    // Lowered words: the slots still say seq 4 was published, so no seq restarts at 1.
    f.b->newest_seq.store(0);
    f.b->newest_version.store(0);
    assert_int_equal(again.resume().second, 4);
    acknowledge(f.b, 1, 1, 9, WSYNC_OK);  // an acknowledgement word counts too
    assert_int_equal(again.resume().second, 9);
    f.b->newest_seq.store((uint64_t(1) << 56) - 1);  // the next seq would not fit
    try {
        again.resume();
        fail_msg("a forged seq word was taken");
    } catch (const Error &e) {
        assert_int_equal(e.status(), WSYNC_ERR_PEER);
        assert_non_null(strstr(e.what(), "chunk seq 72057594037927935, beyond what a sender writes"));
    }
}

// A flush against a process that keeps rewriting receiver 0's failure count (any engine maps
// the board) while receiver 1, alive, never answers: receiver 0 is reported by the look that
// first finds it, and what later looks find of it is not added; the flush ends at its deadline
// with that and receiver 1's TIMEOUT (review: every pass added records, 284550 of them and a
// 33 MB message in 2 s).
void a_flush_against_a_flipping_failure_count_holds_each_receiver_once(void **) {
    Fixture f;  // seq 1 in slot 0
    const int other = open(("/proc/self/fd/" + std::to_string(f.fd)).c_str(), O_RDWR | O_CLOEXEC);
    assert_true(other >= 0);
    assert_true(sys::lock_try(other, kLockBase + 0) && sys::lock_try(other, kLockBase + 1));
    acknowledge(f.b, 0, 0, 1, WSYNC_OK);
    std::atomic<bool> stop{false};
    std::thread forger([&] {
        while (!stop.load()) {
            for (uint64_t n : {uint64_t(5), uint64_t(0)}) {
                f.b->receiver[0].failures.store(n);
                f.b->ack_futex.fetch_add(1);
                sys::futex_wake_all(&f.b->ack_futex);
            }
        }
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
        f.end->wait({0}, sys::Deadline(500), "flush timed out", 1, /*gather=*/true);
        fail_msg("the flush said OK");
    } catch (const Error &e) {
        const auto took = std::chrono::steady_clock::now() - t0;
        assert_int_equal(e.status(), WSYNC_ERR_PEER);
        assert_true(took >= std::chrono::milliseconds(450) && took < std::chrono::milliseconds(3000));
        std::size_t of0 = 0, of1 = 0;
        for (const Failure &x : e.failures()) (x.receiver == 0 ? of0 : of1) += 1;
        assert_true(of0 >= 1 && of0 <= kFailureRing + 1);
        assert_int_equal(of1, 1);
        assert_true(std::strlen(e.what()) < 8192);
        assert_non_null(strstr(e.what(), "and receivers [1] did not acknowledge within 500 ms"));
    }
    stop = true;
    forger.join();
    close(other);
}

// Adversarial trial: another process set abandoned_version to the version in flight and put it
// back before the trainer's audit looked. The engine refused the version's later chunk as
// abandoned (an acknowledgement with status ABANDONED, which completes nobody's wait) and held
// a mix of two versions; the trainer's flush said OK. Now the sender, which never abandoned
// that version, fails the wait with PEER naming the receiver, the chunk and the forged word,
// once; an ABANDONED answer to a version it did abandon is as before no failure.
void an_abandoned_answer_to_a_version_the_sender_kept_fails_the_flush(void **) {
    Fixture f;
    f.end->set_sole_sender(true, /*exclusive=*/true);
    acknowledge(f.b, 0, 0, 1, WSYNC_OK);
    acknowledge(f.b, 1, 0, 1, WSYNC_ERR_ABANDONED);
    try {
        f.end->wait({0}, sys::Deadline(1000), "flush timed out", 1);
        fail_msg("the flush said OK though receiver 1 refused version 1 as abandoned");
    } catch (const Error &e) {
        assert_int_equal(e.status(), WSYNC_ERR_PEER);
        assert_non_null(strstr(e.what(), "shm: receiver 1 failed chunk 0 of version 1: WSYNC_ERR_PEER: "
                                         "refused chunk 0 of version 1 as abandoned, which this "
                                         "sender never abandoned"));
        assert_int_equal(e.failures().size(), 1);
        assert_int_equal(e.failures()[0].receiver, 1);
        assert_true(e.failures()[0].version == 1);
    }
    f.end->wait({0}, sys::Deadline(1000), "flush timed out", 1);  // reported once
    // A flush (gather) reports it the same way once every other receiver has answered, and
    // says which words may have been forged.
    Fixture h;
    h.end->set_sole_sender(true, /*exclusive=*/true);
    acknowledge(h.b, 1, 0, 1, WSYNC_ERR_ABANDONED);
    // Receiver 0's process: its own open file description of the board, holding its lock.
    const int alive = open(("/proc/self/fd/" + std::to_string(h.fd)).c_str(), O_RDWR | O_CLOEXEC);
    assert_true(alive >= 0);
    assert_true(sys::lock_try(alive, kLockBase + 0));
    std::thread late([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        acknowledge(h.b, 0, 0, 1, WSYNC_OK);
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
        h.end->wait({0}, sys::Deadline(2000), "flush timed out", 1, /*gather=*/true);
        fail_msg("the flush said OK though receiver 1 refused version 1 as abandoned");
    } catch (const Error &e) {
        assert_int_equal(e.status(), WSYNC_ERR_PEER);
        assert_non_null(strstr(e.what(), "the board's abandoned_version word or this chunk's slot word"));
        assert_int_equal(e.failures().size(), 1);
        // It waited for receiver 0's answer (100 ms), not for the deadline.
        const auto waited = std::chrono::steady_clock::now() - t0;
        assert_true(waited >= std::chrono::milliseconds(90) && waited < std::chrono::milliseconds(1500));
    }
    late.join();
    close(alive);
    Fixture g;
    g.end->set_sole_sender(true, /*exclusive=*/true);
    g.end->abandon(1);
    acknowledge(g.b, 0, 0, 1, WSYNC_ERR_ABANDONED);
    acknowledge(g.b, 1, 0, 1, WSYNC_ERR_ABANDONED);
    g.end->wait({0}, sys::Deadline(1000), "flush timed out", 1);
}

// The board of a real shm segment, mapped read-write as any attached process can map it.
struct MappedBoard {
    void *mem = MAP_FAILED;
    std::size_t len = 0;
    Board *b = nullptr;
    explicit MappedBoard(const wsync_blob_t &init) {
        char *json = nullptr;
        assert_int_equal(wsync_blob_describe(init.data, init.size, &json), WSYNC_OK);
        const std::string text(json);
        wsync_string_free(json);
        const std::size_t at = text.find("\"/wsync-");
        assert_true(at != std::string::npos);
        const std::string name = text.substr(at + 1, text.find('"', at + 1) - at - 1);
        const int fd = shm_open(name.c_str(), O_RDWR, 0);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        len = static_cast<std::size_t>(st.st_size);
        mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        assert_true(mem != MAP_FAILED);
        b = reinterpret_cast<Board *>(static_cast<char *>(mem) + board_offset());
    }
    ~MappedBoard() { munmap(mem, len); }
};

// Another process writes a healthy engine's acknowledgement while the engine still reads the
// chunk through views (hostile-peer trial: one 8-byte write; the trainer then packed the next
// version into the bucket, and the engine's wsync_recv_end said OK with every byte of the next
// version). Engine 0: its end fails with PEER naming the forged acknowledgement, and nothing is
// completed there. Engine 1, untouched, completes both versions.
void a_forged_acknowledgement_never_completes_the_reader_s_version(void **) {
    wsync_strategy_t *st = nullptr, *rs = nullptr;
    assert_int_equal(wsync_strategy_create("shm", "{\"receivers\": 2, \"buckets\": 1, "
                                           "\"bucket_bytes\": 65536, \"timeout_ms\": 1000}", &st),
                     WSYNC_OK);
    wsync_blob_t init{};
    assert_int_equal(wsync_strategy_create_init_info(st, &init), WSYNC_OK);
    MappedBoard board(init);
    wsync_sender_t *tx = nullptr;
    assert_int_equal(wsync_sender_create(st, init.data, init.size, &tx), WSYNC_OK);
    assert_int_equal(wsync_strategy_create("shm", nullptr, &rs), WSYNC_OK);
    wsync_receiver_t *r[2] = {};
    for (uint32_t i = 0; i < 2; ++i)
        assert_int_equal(wsync_receiver_create(rs, init.data, init.size, i, &r[i]), WSYNC_OK);
    float x[256];
    int64_t shape = 256;
    wsync_tensor_t t{};
    t.name = "w";
    t.data = x;
    t.shape = &shape;
    t.ndim = 1;
    t.dtype = {WSYNC_DTYPE_FLOAT, 32, 1};
    t.device = {WSYNC_DEVICE_CPU, 0};
    wsync_chunk_t c{&t, 1, WSYNC_CHUNK_LAST, 0};
    auto load = [&](wsync_receiver_t *rx, const wsync_blob_t &q) {
        wsync_recv_t *it = nullptr;
        float got[256];
        assert_int_equal(wsync_receiver_receive(rx, q.data, q.size, &it), WSYNC_OK);
        assert_int_equal(wsync_recv_copy(it, 0, 0, got, sizeof got), WSYNC_OK);
        assert_int_equal(wsync_recv_end(it), WSYNC_OK);
        assert_memory_equal(got, x, sizeof x);
    };
    for (int k = 0; k < 256; ++k) x[k] = static_cast<float>(k);
    wsync_blob_t q1{}, q2{};
    assert_int_equal(wsync_sender_send_chunk(tx, &c, &q1), WSYNC_OK);  // seq 1, bucket 0
    wsync_recv_t *slow = nullptr;
    wsync_tensor_t view{};
    bool has = false;
    assert_int_equal(wsync_receiver_receive(r[0], q1.data, q1.size, &slow), WSYNC_OK);
    assert_int_equal(wsync_recv_next(slow, &view, &has), WSYNC_OK);
    assert_true(has);
    load(r[1], q1);
    board.b->slot[0].ack[0].store(uint64_t(1) << 8 | WSYNC_OK);  // the forged answer
    for (int k = 0; k < 256; ++k) x[k] = -1.0f - static_cast<float>(k);
    assert_int_equal(wsync_sender_send_chunk(tx, &c, &q2), WSYNC_OK);  // into bucket 0
    load(r[1], q2);
    assert_int_equal(wsync_recv_end(slow), WSYNC_ERR_PEER);
    assert_non_null(strstr(wsync_last_error(),
                           "another process wrote this receiver's acknowledgement of chunk seq 1"));
    assert_non_null(strstr(wsync_last_error(), "version 1 is not completed here"));
    uint64_t done = 99;
    assert_int_equal(wsync_receiver_completed_version(r[0], &done), WSYNC_OK);
    assert_true(done == 0);
    assert_int_equal(wsync_receiver_completed_version(r[1], &done), WSYNC_OK);
    assert_true(done == 2);
    wsync_blob_free(&q1);
    wsync_blob_free(&q2);
    for (auto *rx : r) wsync_receiver_destroy(rx);
    wsync_strategy_destroy(rs);
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(st);
    wsync_blob_free(&init);
}

// The apply time receivers report before their OK acknowledgement (slot[s].applied): the
// sender reads the largest report of the chunk it published, per version; a word of another
// chunk (an earlier one in the slot, or a board whose engines write nothing: 0.7.0 and before) reads
// as no report; a report is capped to what the word holds.
void the_largest_apply_report_of_a_chunk_counts_for_its_version(void **) {
    Fixture f;  // seq 1 (version 1, chunk 0) in slot 0
    assert_true(reported_apply(f.b, 0, 1) == 0);  // nobody reported: older engines' board
    report_apply(f.b, 0, 1, 3000);                // receiver 0
    report_apply(f.b, 0, 1, 5000);                // receiver 1, slower
    report_apply(f.b, 0, 1, 4000);                // a smaller one does not lower it
    assert_true(reported_apply(f.b, 0, 1) == 5000);
    assert_true(reported_apply(f.b, 0, 3) == 0);  // the word is seq 1's
    f.end->publish(1, 2, 1, 1);                   // chunk 1 of version 1 in slot 1
    report_apply(f.b, 1, 2, 1000);
    assert_true(f.end->applied_ns(1) == 6000);
    assert_true(f.end->applied_ns(1) == 6000);  // counted once however often it is asked
    f.end->publish(0, 3, 2, 0);  // version 2 in slot 0: seq 1's report stays version 1's
    assert_true(f.end->applied_ns(2) == 0);
    report_apply(f.b, 0, 3, 700);  // replaces the word of seq 1
    assert_true(reported_apply(f.b, 0, 1) == 0 && reported_apply(f.b, 0, 3) == 700);
    assert_true(f.end->applied_ns(2) == 700 && f.end->applied_ns(1) == 6000);
    report_apply(f.b, 1, 2, UINT64_MAX);  // capped: 2^40 - 1 ns
    assert_true(reported_apply(f.b, 1, 2) == (uint64_t(1) << kApplyNsBits) - 1);
    // The word lies in what was the slot's padding: nothing else moved (layout version 5).
    static_assert(sizeof(ChunkSlot) == 1088 && offsetof(ChunkSlot, applied) == 1032, "");
}

}  // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_receiver_gone_after_its_last_ack_is_no_failure),
        cmocka_unit_test(a_receiver_gone_before_its_ack_is_named_with_the_chunk),
        cmocka_unit_test(a_chunk_nobody_began_is_withdrawn_and_owed_by_nobody),
        cmocka_unit_test(a_receiver_that_began_the_chunk_is_still_awaited),
        cmocka_unit_test(a_receiver_and_sender_that_see_each_other_do_not_wedge),
        cmocka_unit_test(only_a_sole_sender_withdraws_and_only_abandoned_chunks),
        cmocka_unit_test(records_from_before_a_receiver_joined_are_not_reported),
        cmocka_unit_test(a_failure_count_that_went_back_is_reported_and_later_records_still_arrive),
        cmocka_unit_test(a_forged_acknowledgement_never_completes_the_reader_s_version),
        cmocka_unit_test(words_only_the_sender_writes_are_audited_and_put_back),
        cmocka_unit_test(another_senders_writes_are_not_findings_and_not_undone),
        cmocka_unit_test(a_forged_sender_claim_is_reported_and_put_back_and_the_audit_goes_on),
        cmocka_unit_test(an_abandoned_answer_to_a_version_the_sender_kept_fails_the_flush),
        cmocka_unit_test(a_sender_made_again_resumes_after_the_newest_version_and_seq_and_refuses_forged_words),
        cmocka_unit_test(a_flush_against_a_flipping_failure_count_holds_each_receiver_once),
        cmocka_unit_test(the_largest_apply_report_of_a_chunk_counts_for_its_version),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
