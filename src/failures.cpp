// The core's failure reporting (src/failures.hpp).
#include "failures.hpp"

#include <algorithm>
#include <cinttypes>

namespace wsync {

std::string describe_failures(const std::string &kind, const std::vector<Failure> &fs) {
    std::string msg;
    for (const Failure &f : fs) {
        if (!msg.empty()) msg += "; ";
        msg += strf("%s: receiver %" PRIu32, kind.c_str(), f.receiver);
        if (f.pid) msg += strf(" (pid %" PRId32 ")", f.pid);
        switch (f.what) {
        case WSYNC_FAILURE_FAILED:
            msg += " failed";
            if (f.chunk_index != WSYNC_NO_CHUNK)
                msg += strf(" chunk %" PRIu32 " of version %" PRIu64, f.chunk_index, f.version);
            msg += strf(": %s: %s", status_name(f.status), f.message.c_str());
            break;
        default:
            msg += " " + f.message;
        }
    }
    return msg;
}

bool FailureGather::holds(uint32_t receiver) const {
    return std::any_of(held_.begin(), held_.end(), [&](const Failure &f) { return f.receiver == receiver; });
}

void FailureGather::add(const std::vector<Failure> &look) {
    std::vector<uint32_t> before;
    for (const Failure &f : held_) before.push_back(f.receiver);
    for (const Failure &f : look) {
        if (held_.size() >= bound_) return;
        if (std::find(before.begin(), before.end(), f.receiver) != before.end()) continue;
        held_.push_back(f);
    }
}

void FailureGather::withdraw(uint32_t receiver, uint64_t version, uint32_t what) {
    held_.erase(std::remove_if(held_.begin(), held_.end(),
                               [&](const Failure &f) {
                                   return f.receiver == receiver && f.version == version && f.what == what;
                               }),
                held_.end());
}

void FailureGather::withdraw_version(uint64_t version) {
    held_.erase(std::remove_if(held_.begin(), held_.end(), [&](const Failure &f) { return f.version == version; }),
                held_.end());
}

void FailureGather::report(const std::string &kind, std::vector<Failure> more, const std::string &tail) {
    std::vector<Failure> fs;
    fs.swap(held_);
    std::string msg = describe_failures(kind, fs) + tail;
    for (Failure &f : more) fs.push_back(std::move(f));
    throw Error(WSYNC_ERR_PEER, std::move(msg), std::move(fs));
}

}  // namespace wsync
