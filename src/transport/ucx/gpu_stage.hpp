// Trainer tensors in CUDA device memory on the ucx kind.
//
// UCX registers and serves host memory with any build (Debian's included); device memory only
// with a CUDA-enabled UCX, and a GPU-side hash would be needed to keep the wire's XXH3
// checksums. So a chunk with device tensors is staged in host memory, as every other chunk is:
// its staging buffer is pinned host memory mapped into the GPU's address space
// (cuMemHostAlloc PORTABLE|DEVICEMAP), the pack kernel (gpu/pack.hpp, one launch per chunk)
// writes the device tensors straight into it across the bus, and the trainer's CPU then hashes
// those bytes as it hashes the host tensors it packs. Engines pull and verify host bytes as for
// any ucx chunk. One GPU per sender, as for the GPU kinds; host tensors may share the chunk.
//
// Ordering: the pack waits for the work queued on the caller's stream (wsync_sender_set_stream,
// else the legacy default stream) by polling an event recorded there, then for itself, both
// against the send's deadline. A pack that times out may still write its buffer later: the
// buffer is never reused or freed (see stuck()), and the device is kept until the process ends.
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
    ~GpuStage();
    GpuStage(const GpuStage &) = delete;
    GpuStage &operator=(const GpuStage &) = delete;

    int ordinal() const { return dev_->ordinal(); }
    std::string uuid() const { return dev_->uuid_string(); }

    // Pinned host memory the GPU writes through a device pointer (buffer->host() for the CPU).
    std::unique_ptr<gpu::DeviceBuffer> alloc(uint64_t bytes, const std::string &what);

    // Packs tensors `which` of the chunk (all CUDA memory of this GPU, laid out by
    // table.offsets) into `buf`: after the caller's stream's queued work, one kernel launch,
    // waited for. Returns once the bytes are in `buf`. WSYNC_ERR_TIMEOUT naming `chunk` when
    // either wait passes `deadline`; after a timeout of the pack itself stuck() is true.
    void pack(const wsync_tensor_t *tensors, const TensorTable &table,
              const std::vector<std::size_t> &which, gpu::DeviceBuffer &buf,
              const sys::Deadline &deadline, const std::string &chunk);

    // The stream whose queued work packs are ordered after; nullptr: the legacy default stream.
    void set_stream(void *stream) { order_ = gpu::ordering_stream(stream); }

    // A pack was given up on while queued or running: it may still write the buffer it was
    // given, and later packs queue behind it. Buffers of this stage must then be leaked, not
    // freed (freeing pinned memory may wait for the stuck work).
    bool stuck() const { return stuck_.load(std::memory_order_acquire); }

private:
    const char *kind_;
    std::unique_ptr<gpu::Device> dev_;
    std::unique_ptr<gpu::Stream> stream_;
    std::unique_ptr<gpu::Event> ordered_, done_;
    std::unique_ptr<gpu::Packer> packer_;
    gpu::CUstream order_ = gpu::CU_STREAM_LEGACY;
    std::vector<gpu::PackEntry> entries_;
    std::atomic<bool> stuck_{false};
};

}  // namespace wsync::ucx
