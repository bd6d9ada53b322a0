// Delta "auto" by cost (src/delta/auto.cpp), white-box: the decision from synthetic
// measurements. decide() and learn() read nothing but their arguments, so every sequence below
// gives the same plans on any machine.
#include <cmath>
#include <string>
#include <vector>

#include "delta/auto.hpp"
#include "whitebox.hpp"

using namespace wsync;
using delta::Plan;

namespace {

constexpr uint64_t kModel = uint64_t(1) << 30;  // 1 GiB

// A host whose dense version costs `dense_s` (the link), whose copy aside of the model costs
// `copy_s`, and whose patch version costs `patch_s`; runs `versions` of "auto" and returns
// what it chose: B (bare), K (keep bases), P (patches).
struct Host {
    double dense_s, copy_s, patch_s;
};
std::string run(const Host &h, int versions, delta::AutoState *out = nullptr) {
    delta::Auto a;
    std::string plans;
    for (int v = 0; v < versions; ++v) {
        const Plan p = a.plan();
        delta::VersionCost c;
        c.plan = p;
        c.bytes = kModel;
        switch (p) {
        case Plan::kBare: c.seconds = h.dense_s; break;
        case Plan::kKeepBases: c.seconds = h.dense_s + h.copy_s, c.encode_seconds = h.copy_s; break;
        case Plan::kPatches: c.seconds = h.patch_s, c.encode_seconds = h.patch_s / 2; break;
        }
        a.measured(c);
        plans += p == Plan::kBare ? 'B' : p == Plan::kKeepBases ? 'K' : 'P';
    }
    if (out) *out = a.state();
    return plans;
}

size_t count(const std::string &s, char c) {
    size_t n = 0;
    for (char x : s) n += x == c;
    return n;
}

}  // namespace

// A link as fast as the compare (shm on one host: dense 0.20 s, the copy aside 0.15 s): the
// gate sees that the compare plus the engine's apply cannot beat dense, and no version pays a
// compare; the bases are kept again at version 3 (the first copy aside also faulted in fresh
// pages) and then only at the backed-off probes (16, 32, 64, ... apart).
static void a_memory_speed_link_never_pays_a_compare(void **) {
    const std::string plans = run({0.20, 0.15, 0.46}, 200);
    assert_int_equal(count(plans, 'P'), 0);
    assert_true(plans.substr(0, 10) == "KBKBBBBBBB");
    assert_true(count(plans, 'K') == 5);  // versions 1, 3 (the second gate), 20, 53, 118
}

// A slow link (ucx over 1 Gbit/s: dense 8.6 s; the copy aside 0.15 s; a patch version 0.6 s):
// the gate lets the second version compare, and every version after it goes as patches but
// for a dense version (keeping bases) every kRemeasureEvery to measure the link again.
static void a_slow_link_sends_patches_from_the_second_version(void **) {
    const std::string plans = run({8.6, 0.15, 0.6}, 70);
    assert_true(plans.substr(0, 35) == "K" + std::string(32, 'P') + "KP");
    assert_true(count(plans, 'K') == 3);
}

// The gate passes (the copy aside is cheap against the link) but the patch version measures
// slower than dense (a high changed fraction): after the trial and the second patch version
// (the run is judged from its second), auto goes back to bare dense and probes
// again later, each time later (15, then 31 bare versions between probes).
static void a_patch_version_that_lost_goes_dense_and_backs_off(void **) {
    delta::AutoState s;
    const std::string plans = run({1.0, 0.1, 1.2}, 40, &s);
    assert_true(plans.substr(0, 21) == "KPP" + std::string(15, 'B') + "KPP");
    assert_true(plans.substr(21) == std::string(19, 'B'));
    assert_true(s.gap == 4 * delta::kFirstGap);
}

// Patches win while few elements change; when the changed fraction rises and a patch version
// costs more than dense, the next version is dense; the estimate of the patch cost follows the
// recent versions (half weight each).
static void rising_change_turns_patches_off_at_the_next_version(void **) {
    delta::Auto a;
    auto step = [&](double seconds) {
        const Plan p = a.plan();
        delta::VersionCost c;
        c.plan = p, c.bytes = kModel, c.seconds = seconds;
        if (p == Plan::kKeepBases) c.encode_seconds = 0.1, c.seconds += 0.1;
        a.measured(c);
        return p;
    };
    assert_true(step(2.0) == Plan::kKeepBases);
    assert_true(step(0.5) == Plan::kPatches);
    assert_true(step(0.5) == Plan::kPatches);
    assert_true(step(1.9) == Plan::kPatches);  // (0.5 + 1.9) / 2 = 1.2 < 2.0: still patches
    assert_true(step(3.5) == Plan::kPatches);  // (1.2 + 3.5) / 2 = 2.35 > 2.0: lost
    assert_true(a.plan() == Plan::kBare);
}

// The first patch version of a run pays one-time costs (the crossover bench over ucx at 10
// Gbit/s, 5 % changed: its first patch version measured slower than dense, and auto went dense
// where patches took 0.55x): it is a trial, and the second patch version decides.
static void a_first_patch_version_paying_one_time_costs_does_not_end_the_run(void **) {
    delta::Auto a;
    auto step = [&](double seconds) {
        const Plan p = a.plan();
        delta::VersionCost c;
        c.plan = p, c.bytes = kModel, c.seconds = seconds;
        if (p == Plan::kKeepBases) c.encode_seconds = 0.1, c.seconds += 0.1;
        a.measured(c);
        return p;
    };
    assert_true(step(1.4) == Plan::kKeepBases);
    assert_true(step(2.0) == Plan::kPatches);  // the trial: slower than dense
    assert_true(step(0.8) == Plan::kPatches);  // decides: 0.8 < 1.4
    assert_true(step(0.8) == Plan::kPatches);
    assert_true(a.plan() == Plan::kPatches);
}

// The first copy aside also faults in the bases' fresh pages (the crossover bench over ucx at
// 10 Gbit/s, 0.1 % changed: that shut the gate where patches took 0.23x): the gate is asked
// once more, two versions later, with a copy into pages already there.
static void the_first_copy_aside_gets_a_second_gate(void **) {
    delta::AutoState s;
    delta::learn(s, {Plan::kKeepBases, kModel, 1.4 + 0.8, 0.8});  // 2 x 0.8 > 1.4: shut
    assert_true(delta::decide(s) == Plan::kBare);
    delta::learn(s, {Plan::kBare, kModel, 1.4, 0});
    assert_true(delta::decide(s) == Plan::kKeepBases);
    delta::learn(s, {Plan::kKeepBases, kModel, 1.4 + 0.3, 0.3});  // 2 x 0.3 < 1.4: open
    assert_true(delta::decide(s) == Plan::kPatches);
    delta::AutoState t;  // a second copy aside as slow: shut, and backed off
    delta::learn(t, {Plan::kKeepBases, kModel, 2.2, 0.8});
    delta::learn(t, {Plan::kBare, kModel, 1.4, 0});
    delta::learn(t, {Plan::kKeepBases, kModel, 2.2, 0.8});
    assert_true(delta::decide(t) == Plan::kBare);
    delta::learn(t, {Plan::kBare, kModel, 1.4, 0});
    assert_true(t.gap == 2 * delta::kFirstGap && delta::decide(t) == Plan::kBare);
}

// A version that could not carry patches although auto planned them (a receiver re-attached)
// counts as a kept-bases version: it teaches the dense cost and opens the gate again.
static void a_planned_patch_version_sent_dense_reopens_the_gate(void **) {
    delta::AutoState s;
    delta::learn(s, {Plan::kKeepBases, kModel, 2.1, 0.1});
    assert_true(delta::decide(s) == Plan::kPatches);
    delta::learn(s, {Plan::kPatches, kModel, 0.4, 0.2});
    assert_true(delta::decide(s) == Plan::kPatches);
    delta::learn(s, {Plan::kKeepBases, kModel, 2.1, 0.1});  // what the Sender reports then
    assert_true(s.after_keep && s.patch_run == 0);
    assert_true(delta::decide(s) == Plan::kPatches);
}

// The decision reads only its inputs: the same measurements give the same plans; a version of
// no bytes teaches nothing.
static void the_decision_is_a_function_of_the_measurements(void **) {
    delta::AutoState a, b;
    assert_true(run({0.3, 0.2, 0.5}, 300, &a) == run({0.3, 0.2, 0.5}, 300, &b));
    delta::AutoState before = a;
    delta::learn(a, {Plan::kPatches, 0, 99.0, 0});
    assert_true(a.dense == before.dense && a.patch == before.patch && a.gap == before.gap);
    assert_true(delta::decide(a) == delta::decide(before));
    assert_true(delta::decide(delta::AutoState{}) == Plan::kKeepBases);
}

// What the engines report with their acknowledgements (VersionCost::apply_seconds): the gate
// uses the apply per byte of an earlier patch version instead of modelling it as one more copy
// aside. Here the link is 1.0 s a version, the first copy aside 0.3 s (the gate opens either
// way), then a copy aside of 0.55 s: the model (2 x 0.55 > 1.0) shuts the gate, the engines'
// reported apply (0.05 s) opens it (0.55 + 0.05 < 1.0).
static Plan gate_after(double reported_apply, double second_copy) {
    delta::AutoState s;
    delta::learn(s, {Plan::kKeepBases, kModel, 1.0 + 0.3, 0.3});
    assert_true(delta::decide(s) == Plan::kPatches);
    delta::learn(s, {Plan::kPatches, kModel, 0.6, 0.3, reported_apply, true});
    delta::learn(s, {Plan::kKeepBases, kModel, 1.0 + second_copy, second_copy});  // a remeasure
    return delta::decide(s);
}

static void a_reported_fast_apply_opens_the_gate_the_model_would_shut(void **) {
    assert_true(gate_after(0, 0.55) == Plan::kBare);       // modelled: 0.55 + 0.55 >= 1.0
    assert_true(gate_after(0.05, 0.55) == Plan::kPatches);  // reported: 0.55 + 0.05 < 1.0
}

// The other way: engines whose verified apply is slow (0.8 s a version: a loaded engine host)
// shut the gate the model would open (0.3 + 0.3 < 1.0, but 0.3 + 0.8 >= 1.0).
static void a_reported_slow_apply_shuts_the_gate_the_model_would_open(void **) {
    assert_true(gate_after(0, 0.3) == Plan::kPatches);
    assert_true(gate_after(0.8, 0.3) == Plan::kBare);
}

// A trainer that does not flush does not wait for the engines' apply: a patch version costs its
// sends plus the apply they reported. Sends of 0.5 s against a 2.0 s dense version win alone;
// with the engines' 1.8 s apply added they lose, and the next version goes bare. The same
// figures from a trainer that flushed (its time already holds the apply) keep patching.
static void a_patch_version_without_a_flush_costs_the_reported_apply_too(void **) {
    auto run_patches = [](bool flushed) {
        delta::AutoState s;
        delta::learn(s, {Plan::kKeepBases, kModel, 2.0 + 0.1, 0.1});
        delta::learn(s, {Plan::kPatches, kModel, 0.5, 0.2, 1.0, flushed});  // the trial
        delta::learn(s, {Plan::kPatches, kModel, 0.5, 0.2, 1.8, flushed});
        return delta::decide(s);
    };
    assert_true(run_patches(true) == Plan::kPatches);
    assert_true(run_patches(false) == Plan::kBare);
    delta::AutoState s;  // nothing reported (older engines): the sends alone, as before
    delta::learn(s, {Plan::kKeepBases, kModel, 2.0 + 0.1, 0.1});
    delta::learn(s, {Plan::kPatches, kModel, 0.5, 0.2, 0, false});
    assert_true(s.patch == 0.5 / double(kModel) && s.apply == 0);
}

// A report comes from another process: NaN, negative and zero are no report; a huge one counts
// as kMaxApplyPerByte. Either way the estimates stay finite and the plans exact.
static void a_reported_apply_is_bounded(void **) {
    for (double bad : {std::nan(""), -1.0, 0.0}) {
        delta::AutoState s;
        delta::learn(s, {Plan::kKeepBases, kModel, 2.0 + 0.1, 0.1});
        delta::learn(s, {Plan::kPatches, kModel, 0.5, 0.2, bad, false});
        assert_true(s.apply == 0 && s.patch == 0.5 / double(kModel));
    }
    delta::AutoState s;
    delta::learn(s, {Plan::kKeepBases, kModel, 2.0 + 0.1, 0.1});
    delta::learn(s, {Plan::kPatches, kModel, 0.5, 0.2, 1e300, false});
    assert_true(s.apply == delta::kMaxApplyPerByte);
    assert_true(s.patch == 0.5 / double(kModel) + delta::kMaxApplyPerByte && std::isfinite(s.patch));
    delta::learn(s, {Plan::kKeepBases, kModel, 2.0 + 0.1, 0.1});
    assert_true(delta::decide(s) == Plan::kBare);  // a lie sends dense: exact, and probed again
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_memory_speed_link_never_pays_a_compare),
        cmocka_unit_test(a_slow_link_sends_patches_from_the_second_version),
        cmocka_unit_test(a_patch_version_that_lost_goes_dense_and_backs_off),
        cmocka_unit_test(rising_change_turns_patches_off_at_the_next_version),
        cmocka_unit_test(a_first_patch_version_paying_one_time_costs_does_not_end_the_run),
        cmocka_unit_test(the_first_copy_aside_gets_a_second_gate),
        cmocka_unit_test(a_planned_patch_version_sent_dense_reopens_the_gate),
        cmocka_unit_test(the_decision_is_a_function_of_the_measurements),
        cmocka_unit_test(a_reported_fast_apply_opens_the_gate_the_model_would_shut),
        cmocka_unit_test(a_reported_slow_apply_shuts_the_gate_the_model_would_open),
        cmocka_unit_test(a_patch_version_without_a_flush_costs_the_reported_apply_too),
        cmocka_unit_test(a_reported_apply_is_bounded),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
