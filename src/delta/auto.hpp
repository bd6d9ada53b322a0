// Delta "auto" by cost (docs/delta.md, "How auto decides"): per version, the trainer sends it
// dense without keeping bases, dense while keeping bases (so the next version may be compared),
// or compared and sent as patches, from what it measured of its own recent versions. Pure and
// deterministic given the measurements: the Sender times the versions and feeds them in.
#pragma once

#include <cstdint>

namespace wsync {
namespace delta {

// What "auto" does with one version.
enum class Plan : uint8_t {
    kBare,       // dense, the coder not engaged: no compare, no copy of the bases
    kKeepBases,  // dense, the coder copying every tensor aside as the next version's base
    kPatches,    // compared with the bases: a tensor within its budget goes as a patch
};

// One version as the trainer measured it, once it committed and (if the caller flushes) the
// flush after it returned.
struct VersionCost {
    Plan plan = Plan::kBare;  // what the version actually was (kPatches only if it could patch)
    uint64_t bytes = 0;       // the tensors' dense bytes
    double seconds = 0;       // in the library: its send_chunk calls and the flush after it
    double encode_seconds = 0;  // of that, in the delta coder (copy aside, or compare + encode)
    // The engines' verified apply of the version's patches as they reported it with their
    // acknowledgements (per chunk the slowest engine's, summed over the chunks); 0: not
    // reported (engines of 0.7.0 and before, a kind that carries no report, no patches). Untrusted:
    // learn() bounds it (kMaxApplyPerByte).
    double apply_seconds = 0;
    // `seconds` includes a flush after the commit, i.e. the wait for every engine's
    // acknowledgement, which follows its apply. Without one the engines' apply is not in it.
    bool flushed = false;
};

// The most a reported apply may cost per dense byte of its version (1 MB/s; a verified apply
// runs at GB/s): a larger report is taken as this. Engines are other processes, and a wrong
// report can only move "auto" between plans that are each exact (dense, or patches that apply
// only onto their base and only if the result hashes right); the next measured version
// corrects it.
constexpr double kMaxApplyPerByte = 1e-6;

// Probes of delta while dense wins: the first this many versions after the last ended, doubling
// after each probe delta lost, up to kMaxGap; patches re-measure dense every kRemeasureEvery.
constexpr uint64_t kFirstGap = 8;
constexpr uint64_t kMaxGap = 256;
constexpr uint64_t kRemeasureEvery = 32;

// Everything decide() reads (seconds per dense byte; 0: not measured).
struct AutoState {
    double dense = 0;   // a dense version, less the coder's copy aside (EWMA)
    double keep = 0;    // the coder's copy aside in the last kKeepBases version
    double patch = 0;   // a version sent as patches (EWMA over the current run of them)
    double apply = 0;   // the engines' reported apply in the last patch version reporting one
    uint64_t patch_run = 0;    // patch versions since the last kKeepBases
    uint64_t since_probe = 0;  // bare versions since the last probe ended
    uint64_t gap = kFirstGap;  // bare versions between probes
    bool after_keep = false;   // the last version kept bases: the next may compare
    bool patching = false;     // the last patch version finished sooner than dense
    bool first_keep = false;   // the last kKeepBases was the first (it allocated the bases)
};

// The plan for the next version:
// - nothing measured yet: kKeepBases (the first version is dense anyway; it measures the link
//   and the cost of passing over the model once);
// - right after kKeepBases, the gate: a patch version costs at least the compare (two streams
//   over the model, modelled as the copy aside just measured) and the engine's verified apply
//   (the engines' reported apply per byte of an earlier patch version when one is known,
//   else modelled as one more copy aside), so kPatches only if the copy aside plus the apply
//   is below the dense cost, else kBare without paying a compare (after the very first
//   kKeepBases, whose copy also faulted in the bases' pages, the gate is asked once more at
//   the next version but one);
// - while patches finish sooner than dense: kPatches, with a kKeepBases every kRemeasureEvery
//   to measure dense again (the link may have changed); the first patch version of a run is a
//   trial (one-time costs), so a run is judged from its second version;
// - otherwise kBare, and a probe (kKeepBases, then the gate) once `gap` bare versions passed.
Plan decide(const AutoState &s);
// Folds one measured version into the state. A patch version that was not flushed costs its
// `seconds` plus its reported apply (bounded by kMaxApplyPerByte).
void learn(AutoState &s, const VersionCost &c);

// The trainer's "auto": the state, decided and taught one version at a time.
class Auto {
public:
    Plan plan() const { return decide(state_); }
    void measured(const VersionCost &c) { learn(state_, c); }
    const AutoState &state() const { return state_; }

private:
    AutoState state_;
};

}  // namespace delta
}  // namespace wsync
