// Trainer tensors in CUDA device memory on the ucx kind.
//
// UCX registers and serves host memory with any build (Debian's included); device memory only
// with a CUDA-enabled UCX, and a GPU-side hash would be needed to keep the wire's checksums
// (tree hashes, which the GPU kinds' delta kernels already compute for patches). So a chunk with device tensors is staged in host memory, as every other chunk is:
// its staging buffer is pinned host memory mapped into the GPU's address space
// (cuMemHostAlloc PORTABLE|DEVICEMAP), the pack kernel (gpu/pack.hpp, one launch per chunk)
// writes the device tensors straight into it across the bus, and the trainer's CPU then hashes
// those bytes as it hashes the host tensors it packs. Engines pull and verify host bytes as for
// any ucx chunk. One GPU per sender, as for the GPU kinds; host tensors may share the chunk.
//
// Ordering: the pack waits for the work queued on the caller's stream (wsync_sender_set_stream,
// else the legacy default stream) by polling an event recorded there, then for itself, both
// against the send's deadline. A pack that times out may still write its buffer later, and the
// pack table and module it reads: until it has finished the stage is "stuck": later packs fail
// at once (nothing queues behind it), the sender frees no pinned memory (freeing may wait for
// the stuck work; freed buffers wait in a list), and a stage destroyed while stuck leaves its
// machinery and buffers to the driver (freed when the process ends).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/pack.hpp"
#include "sys.hpp"
#include "tensor.hpp"

namespace wsync::ucx {

class GpuStage {
public:
    // Opens the CUDA driver (WSYNC_ERR_UNAVAILABLE naming why when there is none) and the
    // device `ordinal` of this process; loads the pack kernel.
    GpuStage(int ordinal, const char *kind);
    // Bounded: when idle() is false the machinery is kept, not destroyed (see above).
    ~GpuStage();
    GpuStage(const GpuStage &) = delete;
    GpuStage &operator=(const GpuStage &) = delete;

    int ordinal() const;
    std::string uuid() const;

    // Pinned host memory the GPU writes through a device pointer (buffer->host() for the CPU).
    std::unique_ptr<gpu::DeviceBuffer> alloc(uint64_t bytes, const std::string &what);

    // Packs tensors `which` of the chunk (all CUDA memory of this GPU, laid out by
    // table.offsets) into `buf`: after the caller's stream's queued work, one kernel launch,
    // waited for. Returns once the bytes are in `buf`. WSYNC_ERR_TIMEOUT naming `chunk` when
    // either wait passes `deadline` (after a timeout of the pack itself stuck() is true), or at
    // once while an earlier pack that timed out has not finished.
    // WSYNC_ERR_TIMEOUT naming `chunk` while an earlier pack that timed out has not finished
    // (pack() checks it too; a caller checks first to take no buffer for a chunk that cannot go).
    void require_not_stuck(const std::string &chunk);
    void pack(const wsync_tensor_t *tensors, const TensorTable &table,
              const std::vector<std::size_t> &which, gpu::DeviceBuffer &buf,
              const sys::Deadline &deadline, const std::string &chunk);

    // The stream whose queued work packs are ordered after; nullptr: the legacy default stream.
    void set_stream(void *stream) { order_ = gpu::ordering_stream(stream); }

    // A pack was given up on and may still run (it may write the buffer it was given).
    bool stuck() const { return stuck_.load(std::memory_order_acquire); }
    // Nothing this stage gave up on is still queued: no stuck pack, and the caller's stream has
    // passed the point a timed-out wait gave up on. Queries the GPU (clearing what finished);
    // false on a driver error. Pinned memory of this stage may be freed only while idle.
    bool idle() noexcept;

private:
    struct Gpu;  // device, stream, events, packer: kept whole when destroyed while not idle
    const char *kind_;
    std::unique_ptr<Gpu> g_;
    gpu::CUstream order_ = gpu::CU_STREAM_LEGACY;
    std::vector<gpu::PackEntry> entries_;
    std::atomic<bool> stuck_{false};  // a pack timed out and done has not been seen since
    std::atomic<bool> busy_{false};   // a wait for the caller's stream timed out, not seen done
    std::string stuck_chunk_;         // the chunk whose pack timed out, for messages
};

}  // namespace wsync::ucx
