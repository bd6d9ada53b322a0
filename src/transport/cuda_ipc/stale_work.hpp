// What a cuda_ipc receiver keeps of loader work a wait gave up on.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "gpu/device.hpp"
#include "transport/local/segment.hpp"

namespace wsync::cuda_ipc {

// Work on a loader's stream that a wait gave up on (its deadline passed): it may still read
// memory mapped from the sender once the stream moves, so no mapping closes until an event
// recorded after it completes. One per receiver; marked by its iterations' acknowledgements.
struct StaleWork {
    explicit StaleWork(const gpu::Device &d) : dev(d), event(d) {}
    void mark(gpu::CUstream stream) noexcept {
        try {
            gpu::Device::Scope scope(dev);
            event.record(stream);
            armed = true;
        } catch (...) {  // no event: the stream is unusable, its work will not run
        }
    }
    // True when nothing is pending: nothing marked, or the marked work completed (or its
    // stream failed, so it never will run). Does not block.
    bool settled() noexcept {
        if (!armed) return true;
        try {
            gpu::Device::Scope scope(dev);
            if (!event.done()) return false;
        } catch (...) {
        }
        armed = false;
        return true;
    }
    const gpu::Device &dev;
    gpu::Event event;
    bool armed = false;
};

// A segment whose receiver left work on a stuck stream (see ~IpcReceiver): never closed.
inline void keep_segment_until_exit(std::shared_ptr<SharedSegment> seg) {
    static std::mutex mu;
    static auto *kept = new std::vector<std::shared_ptr<SharedSegment>>();  // never destroyed
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(std::move(seg));
}

}  // namespace wsync::cuda_ipc
