// Delta "auto" by cost: the decision and what each measured version teaches it
// (src/delta/auto.hpp, docs/delta.md "How auto decides").
#include "delta/auto.hpp"

#include <algorithm>

namespace wsync {
namespace delta {

namespace {
// Recent versions weigh half: a link that changed speed is followed within a few versions, and
// one noisy version moves the estimate by half its error.
double ewma(double old, double now) { return old > 0 ? (old + now) / 2 : now; }

// A reported apply per dense byte, from another process: NaN, negative or 0 is no report, and
// none costs more than kMaxApplyPerByte.
double apply_per_byte(const VersionCost &c) {
    const double a = c.apply_seconds / double(c.bytes);
    return a > 0 ? std::min(a, kMaxApplyPerByte) : 0;
}
}  // namespace

Plan decide(const AutoState &s) {
    if (!(s.dense > 0)) return Plan::kKeepBases;
    if (s.after_keep) {
        // The compare (two streams: about the copy aside) and the engines' apply: as they
        // reported it in an earlier patch version, else modelled as one more copy aside.
        const double apply = s.apply > 0 ? s.apply : s.keep;
        return s.keep + apply < s.dense ? Plan::kPatches : Plan::kBare;
    }
    if (s.patching) return s.patch_run >= kRemeasureEvery ? Plan::kKeepBases : Plan::kPatches;
    return s.since_probe + 1 >= s.gap ? Plan::kKeepBases : Plan::kBare;
}

void learn(AutoState &s, const VersionCost &c) {
    if (c.bytes == 0) return;
    const double bytes = double(c.bytes);
    const bool after_keep = s.after_keep;
    s.after_keep = false;
    switch (c.plan) {
    case Plan::kKeepBases:
        s.first_keep = !(s.dense > 0);
        s.dense = ewma(s.dense, std::max(c.seconds - c.encode_seconds, 0.0) / bytes);
        s.keep = c.encode_seconds / bytes;
        s.after_keep = true;
        s.patching = false;
        s.patch_run = 0;
        break;
    case Plan::kBare:
        s.dense = ewma(s.dense, c.seconds / bytes);
        if (after_keep && s.first_keep) {
            // The first copy aside also faulted in the bases' fresh pages: the gate is asked
            // again after this one bare version, with a copy into pages already there.
            s.first_keep = false;
            s.since_probe = s.gap - 1;
        } else if (after_keep) {  // the gate said a patch could not finish sooner: back off
            s.gap = std::min(2 * s.gap, kMaxGap);
            s.since_probe = 0;
        } else {
            ++s.since_probe;
        }
        break;
    case Plan::kPatches: {
        const double apply = apply_per_byte(c);
        if (apply > 0) s.apply = apply;
        // Without a flush the trainer did not wait for the engines' apply: it is added.
        const double cost = c.seconds / bytes + (c.flushed ? 0 : apply);
        // The first patch version of a run pays one-time costs (the compare's scratch and the
        // patch buffers grow, a transport registers them): it is a trial, which the second
        // replaces; from the third on, an EWMA. So a run is judged lost from its second.
        s.patch = s.patch_run >= 2 ? ewma(s.patch, cost) : cost;
        ++s.patch_run;
        if (s.patch < s.dense || s.patch_run == 1) {
            s.patching = true;
            if (s.patch < s.dense) s.gap = kFirstGap;
        } else {  // delta lost: dense, and the next probe later
            s.patching = false;
            s.patch_run = 0;
            s.gap = std::min(2 * s.gap, kMaxGap);
            s.since_probe = 0;
        }
        break;
    }
    }
}

}  // namespace delta
}  // namespace wsync
