// What the GPU micro-benches (pack_bench, delta_bench) share: a clock and a drain.
#pragma once

#include <chrono>

#include "error.hpp"
#include "gpu/device.hpp"

namespace wsync::gpu::bench {

inline double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits for everything queued on `s` so far. Spins (no sleep, so a timed drain ends as soon as
// the GPU does), up to 10 minutes: a bench that hangs fails with WSYNC_ERR_TIMEOUT.
inline void drain(const Device &d, CUstream s) {
    Event e(d);
    e.record(s);
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (!e.done())
        if (std::chrono::steady_clock::now() > end) fail(WSYNC_ERR_TIMEOUT, "bench: the GPU did not drain in 10 minutes");
}

}  // namespace wsync::gpu::bench
