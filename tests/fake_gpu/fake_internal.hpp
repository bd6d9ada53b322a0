// What fake_cuda.cpp and fake_nccl.cpp share: the error codes, the stream queue, the
// allocation lookup, failure injection and the counters. Not installed, not a public interface.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "gpu/api.hpp"
#include "gpu/kernels/delta_abi.hpp"
#include "gpu/kernels/pack_abi.hpp"

namespace wsync_fake {

using namespace wsync::gpu;

// Driver codes beyond the ones gpu/api.hpp names (values from cuda.h).
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// ncclResult_t values (nccl.h).
constexpr ncclResult_t ncclUnhandledCudaError = 1;
constexpr ncclResult_t ncclSystemError = 2;
constexpr ncclResult_t ncclInternalError = 3;
constexpr ncclResult_t ncclInvalidArgument = 4;
constexpr ncclResult_t ncclInvalidUsage = 5;
constexpr ncclResult_t ncclRemoteError = 6;

// An operation a stream runs in order. Returns CUDA_SUCCESS, or an error that marks the stream
// failed (sticky). It is destroyed, run or not, before the stream counts it complete.
using Op = std::function<CUresult()>;

// The ordered queue behind a CUstream, run by one worker thread (fake_cuda.cpp).
struct Stream;

// Resolves a CUstream handle (0 and the legacy/per-thread handles 1 and 2 name this process's
// NULL stream). CUDA_ERROR_INVALID_HANDLE for anything else that is not a live stream.
CUresult get_stream(CUstream handle, std::shared_ptr<Stream> *out);
// The visible device a stream belongs to; -1 for the NULL stream (it serves every device).
int stream_device(const Stream &s);
// Appends `op`; never blocks on the queue.
void enqueue(Stream &s, Op op);

// The device of the calling thread's current context: CUDA_ERROR_NOT_INITIALIZED before cuInit,
// CUDA_ERROR_INVALID_CONTEXT when no context is current or its device's primary context is not
// retained.
CUresult current_device(int *device);

// The fake allocation (from cuMemAlloc or an IPC open) holding [p, p + n): its shm name (the
// owner's name for an IPC mapping), base address and size. False if no single allocation holds
// the whole range, or p is 0.
struct Region {
    std::string name;
    uint64_t base = 0;
    uint64_t size = 0;
};
bool find_region(uint64_t p, uint64_t n, Region *out);

// Failure injection (wsync_fake_set_fail): true, with the result to return, when the call of
// `symbol` now is the one to fail. inject_async is consulted when an operation is enqueued and
// says whether that operation is to fail when it runs.
bool inject(const char *symbol, int *result);
bool inject_async(const char *symbol, int *result);

// Counters kept by the NCCL part, read by wsync_fake_stats.
extern std::atomic<long long> g_broadcasts;
long long nccl_live_comms();

// One polling step of a waiting operation (~100 us), as NCCL's proxy threads spin and yield.
void poll_sleep();

}  // namespace wsync_fake

// Fails the entry point at once when wsync_fake_set_fail says so.
#define WSYNC_FAKE_FAIL_POINT(symbol)                                                            \
    do {                                                                                         \
        int wsync_fake_rc_ = 0;                                                                  \
        if (::wsync_fake::inject(symbol, &wsync_fake_rc_)) return wsync_fake_rc_;              \
    } while (0)
