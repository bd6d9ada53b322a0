// Building blocks shared by the GPU strategies (cuda_ipc, nccl_broadcast): the device a handle
// works on, owned device memory, streams and events, deadline-bounded waits on the GPU.
// Everything reaches the driver through gpu/api.hpp; packing chunks is gpu/pack.hpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/api.hpp"
#include "sys.hpp"

namespace wsync::gpu {

// One GPU as a strategy uses it: the ordinal in this process, its UUID, and its primary context
// (retained for the object's life). Make it current around driver calls with Scope.
class Device {
public:
    Device(const CudaApi &api, int ordinal, const std::string &who);
    ~Device();
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
    const CudaApi &api() const { return api_; }
    int ordinal() const { return ordinal_; }
    const CUuuid &uuid() const { return uuid_; }
    std::string uuid_string() const { return uuid_text(uuid_); }
    CUcontext context() const { return ctx_; }
    // Compute capability as 10 * major + minor (90 for an H100/H200), or 0 if the driver did
    // not say. libwsync's kernels are PTX for compute_80 (bfloat16 conversions need sm_80).
    int compute_capability() const { return cc_; }
    // WSYNC_ERR_UNAVAILABLE naming this GPU, its compute capability and `what` (the kernel path
    // asked for) when the GPU is older than 8.0; a capability the driver did not report passes.
    void require_kernels(const std::string &what) const;

    // Makes the device's context current on this thread and restores the previous one after.
    class Scope {
    public:
        explicit Scope(const Device &d);
        ~Scope();
        Scope(const Scope &) = delete;
        Scope &operator=(const Scope &) = delete;

    private:
        const CudaApi &api_;
        CUcontext prev_ = nullptr;
    };

private:
    const CudaApi &api_;
    int ordinal_;
    CUdevice dev_ = 0;
    CUuuid uuid_{};
    CUcontext ctx_ = nullptr;
    int cc_ = 0;
};

// Keeps a device (its primary-context reference) until the process exits, when the driver frees
// its memory: for memory other processes may still map, or that work a wait gave up on may still
// write (releasing the last reference to a primary context frees its memory). Held in a list
// rather than released so leak checkers see it is kept on purpose.
void keep_until_exit(std::unique_ptr<Device> dev);

// Device memory owned by this object (cuMemAlloc / cuMemFree in the device's context).
// Memory kernels reach through a device pointer: device memory of one GPU (cuMemAlloc), or
// pinned host memory mapped into the device's address space (cuMemHostAlloc with DEVICEMAP:
// kernels read and write it across PCIe or NVLink-C2C, and it costs no GPU memory).
class DeviceBuffer {
public:
    enum class Where { kDevice, kPinnedHost };
    DeviceBuffer() = default;
    DeviceBuffer(const Device &d, uint64_t bytes, const std::string &what, Where where = Where::kDevice);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer &&o) noexcept;
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept;
    CUdeviceptr ptr() const { return ptr_; }
    uint64_t size() const { return size_; }
    Where where() const { return where_; }
    void *host() const { return host_; }  // kPinnedHost: the host address; else null
    // Gives the memory up without freeing it: the driver frees it when the process ends. For
    // memory other processes may still map (freeing it then is undefined behaviour).
    void leak() noexcept { ptr_ = 0, host_ = nullptr; }

private:
    void release() noexcept;
    const Device *dev_ = nullptr;
    CUdeviceptr ptr_ = 0;
    uint64_t size_ = 0;
    Where where_ = Where::kDevice;
    void *host_ = nullptr;  // kPinnedHost: the host address cuMemFreeHost takes
};

class Stream {
public:
    explicit Stream(const Device &d);
    ~Stream();
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    CUstream get() const { return s_; }

private:
    const Device &dev_;
    CUstream s_ = nullptr;
};

class Event {
public:
    explicit Event(const Device &d);
    ~Event();
    Event(const Event &) = delete;
    Event &operator=(const Event &) = delete;
    CUevent get() const { return e_; }
    void record(CUstream s);
    bool done() const;  // cuEventQuery: true when complete, false when not yet; throws on error

private:
    const Device &dev_;
    CUevent e_ = nullptr;
};

// Polls until `ready()` is true or the deadline passes (then WSYNC_ERR_TIMEOUT with `what`).
// Sleeps grow from 20 us to 1 ms, so short waits stay short and long ones cost no CPU.
// wsync_recv_copy() into device memory for the GPU kinds: checks that `dst` is device memory
// of `dev`'s GPU with [dst, dst + len) inside one allocation (else WSYNC_ERR_INVALID_ARGUMENT
// naming what() and why, nothing queued: a copy past an allocation's end would be an illegal
// address, which poisons the engine's whole context), then queues the copy of `len` bytes from
// `src` on `stream`. Does not wait for it.
void queue_copy_to_device(const Device &dev, CUstream stream, void *dst, const void *src,
                          uint64_t len, const std::function<std::string()> &what, const char *kind);
// The same from host memory `src` (cuMemcpyHtoDAsync: asynchronous when src is pinned, so src
// must stay unchanged until the stream has run the copy).
void queue_copy_host_to_device(const Device &dev, CUstream stream, void *dst, const void *src,
                               uint64_t len, const std::function<std::string()> &what, const char *kind);
// Whether `p` is device memory (of any GPU) to the driver: CU_POINTER_ATTRIBUTE_MEMORY_TYPE.
bool is_device_memory(const Device &dev, const void *p);
// One allocation as the driver knows it: a cuMemAlloc, or one physical handle of a
// virtual-memory mapping; buffer_id is CU_POINTER_ATTRIBUTE_BUFFER_ID (0: the driver gave none).
struct MemPiece {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    unsigned long long buffer_id = 0;
};
// The checks of queue_copy_to_device alone (for a destination a kernel writes): device memory
// of `dev`'s GPU, [dst, dst + len) inside one allocation or a run of allocations mapped one after
// the other (a virtual-memory span). Returns those allocations. Messages begin with `fn`.
std::vector<MemPiece> check_device_destination(const Device &dev, void *dst, uint64_t len,
                                               const std::function<std::string()> &what,
                                               const char *kind, const char *fn = "wsync_recv_copy");
// Whether the allocations check_device_destination returned are still the same ones (same
// base, size and buffer id): WSYNC_ERR_INVALID_ARGUMENT naming what() when one was freed or
// mapped anew. One or two driver calls a piece; no system call.
void recheck_device_destination(const Device &dev, const std::vector<MemPiece> &pieces,
                                const std::function<std::string()> &what, const char *fn);

// The pause between two polls of GPU work (an event's cuEventQuery; the driver has no
// blocking wait with a deadline). A sync's waits are short and on its critical path: the
// engine's last chunk waits for the copies it queued (a few ms), and a wait that oversleeps
// delays the version by what it overslept. So a wait spins (yielding the CPU to any other
// runnable thread) for its first 2 ms, then sleeps 20 us (about 70 us with Linux's default
// 50 us timer slack) until 50 ms, then 200 us until 500 ms, then 1 ms: a wait that long is a
// stuck stream heading for its deadline. H200, 2026-12-04: the sleeping polls (20 us from the
// first, 200 us after 50 polls) cost about 0.1-0.25 ms at the end of every version.
class Backoff {
public:
    Backoff();
    void pause();   // spins or sleeps by how long this wait has lasted
    void restart();  // a new wait begins (something was found)
private:
    int64_t start_ns_;
};
[[noreturn]] void throw_timeout(const std::string &message);

template <class F>
void poll_until(F ready, const sys::Deadline &deadline, const std::string &what) {
    Backoff backoff;
    for (;;) {
        if (ready()) return;
        if (deadline.passed())
            throw_timeout(what + " did not finish within " + std::to_string(deadline.budget_ms()) +
                          " ms");
        backoff.pause();
    }
}

// The stream whose queued work the library orders itself after ("synchronize"): the caller's
// (wsync_sender_set_stream / wsync_receiver_set_stream), else the legacy default stream, where
// PyTorch's default stream queues work. ordering_stream(nullptr) is CU_STREAM_LEGACY.
inline CUstream ordering_stream(void *caller) {
    return caller ? static_cast<CUstream>(caller) : CU_STREAM_LEGACY;
}
// "the legacy default stream" or "the caller's stream 0x7f..." for messages.
std::string stream_text(CUstream s);

}  // namespace wsync::gpu
