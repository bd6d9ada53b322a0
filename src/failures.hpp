// A version's failures, gathered and reported once: the one policy every kind's sender
// follows (issue 36 item 2, issue 37 item 5). A sender's wait (flush, send_chunk waiting for
// acknowledgements) holds each receiver's failure as it learns of it, stops waiting for that
// receiver, keeps waiting for the others, and reports what it holds together in one Error
// once nobody it still waits for owes anything (or the deadline passes: the receivers still
// owing are added as timeouts). Abandoned versions and withdrawn failures are not reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "error.hpp"

namespace wsync {

// "KIND: receiver R (pid P) failed chunk K of version V: STATUS: text; KIND: receiver ..."
std::string describe_failures(const std::string &kind, const std::vector<Failure> &fs);

class FailureGather {
public:
    // bound: the most failures held (a peer flipping states cannot grow this without limit).
    explicit FailureGather(std::size_t bound) : bound_(bound) {}

    // Adds one look's failures. A receiver already held from an earlier look is not added
    // again (a receiver is reported by the look that first found it failed); several failures
    // of one receiver found by the same look are all kept; nothing past the bound.
    void add(const std::vector<Failure> &look);
    void add(Failure f) { add(std::vector<Failure>{std::move(f)}); }
    // Whether a failure of `receiver` is held (its wait is over for this report).
    bool holds(uint32_t receiver) const;
    // Drops held failures of `receiver` for `version` of kind `what` (a receiver that
    // re-attached and then completed the version it was reported DIED for), or of every
    // receiver for `version` (what 0, receiver UINT32_MAX: a version its sender abandoned).
    void withdraw(uint32_t receiver, uint64_t version, uint32_t what);
    void withdraw_version(uint64_t version);
    bool empty() const { return held_.empty(); }
    const std::vector<Failure> &held() const { return held_; }

    // Throws WSYNC_ERR_PEER naming every held failure, then `tail`; `more` (e.g. the timeouts
    // of receivers still owing) is appended to the failures as data. Empties this gather.
    [[noreturn]] void report(const std::string &kind, std::vector<Failure> more = {},
                             const std::string &tail = "");

private:
    std::size_t bound_;
    std::vector<Failure> held_;
};

}  // namespace wsync
