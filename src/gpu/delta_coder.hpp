// The trainer's side of delta sync for tensors in GPU memory (docs/delta.md, "On the GPU"): the
// bases live in device memory of the trainer's GPU (or, with "delta_base_memory" "pinned_host",
// in pinned host memory the kernels reach through its device mapping), the compare and
// compaction run as kernels
// (gpu/diff.hpp), and patches carry tree hashes. Same bookkeeping as the host's delta::Encoder:
// what a version stages becomes the base only when it commits (a patch is folded into the base
// by a scatter kernel, a dense tensor's copy is swapped in), an abandoned or failed version
// never touches a base, and the version after one is dense.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "delta/delta.hpp"
#include "gpu/device.hpp"
#include "gpu/diff.hpp"
#include "gpu/pack.hpp"

namespace wsync::gpu {

class DeviceCoder final : public delta::Coder {
public:
    // `kind` names the strategy in messages; every wait is bounded by `timeout_ms`; with
    // `synchronize` the coder first waits for the work queued on the caller's stream (the
    // trainer's writes to its tensors), as the kind's sender does.
    DeviceCoder(const CudaApi &api, const delta::Config &config, const char *kind,
                int64_t timeout_ms, bool synchronize);
    ~DeviceCoder() override;

    void encode(uint64_t version, const wsync_tensor_t *tensors,
                const std::vector<TensorMeta> &metas, std::vector<wsync_tensor_t> &wire,
                std::vector<PatchInfo> &patches) override;
    bool patching() const override { return staging_.patches_allowed(); }
    void chunk_refused() override;
    void chunk_sent() override;
    void commit(uint64_t version) override;
    void abandon() override;
    void dense_next() override;
    void set_stream(void *stream) override { order_stream_ = ordering_stream(stream); }

private:
    struct Entry;
    void start(int ordinal);

    const CudaApi &api_;
    delta::Config config_;
    const char *kind_;
    int64_t timeout_ms_;
    bool synchronize_;
    CUstream order_stream_ = CU_STREAM_LEGACY;
    std::unique_ptr<Device> dev_;  // first: the rest lives on it
    std::unique_ptr<Stream> stream_;
    std::unique_ptr<Event> ordered_;
    std::unique_ptr<DeltaKernels> kernels_;
    std::unique_ptr<Packer> packer_;  // copies dense tensors into their staged bases
    std::unordered_map<std::string, std::unique_ptr<Entry>> entries_;
    // Patch and staging buffers that grew out of use, kept until the coder goes: freeing device
    // memory waits for the whole device, and on a nccl_broadcast sender that includes an earlier
    // broadcast waiting for its receivers, with no deadline (issue 33).
    std::vector<DeviceBuffer> retired_;
    delta::Staging<Entry> staging_;
    std::vector<PackEntry> copies_;
};

}  // namespace wsync::gpu
