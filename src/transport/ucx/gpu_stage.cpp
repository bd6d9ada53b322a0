#include "transport/ucx/gpu_stage.hpp"

#include "error.hpp"
#include "gpu/kernels/pack_abi.hpp"

namespace wsync::ucx {

GpuStage::GpuStage(int ordinal, const char *kind) : kind_(kind) {
    dev_ = std::make_unique<gpu::Device>(gpu::cuda(), ordinal, kind);
    stream_ = std::make_unique<gpu::Stream>(*dev_);
    ordered_ = std::make_unique<gpu::Event>(*dev_);
    done_ = std::make_unique<gpu::Event>(*dev_);
    packer_ = std::make_unique<gpu::Packer>(*dev_);
}

GpuStage::~GpuStage() {
    // The pack machinery goes before the device it lives on. After a pack was given up on, the
    // device stays referenced until the process ends: releasing the last reference to its
    // primary context would free memory the stuck work may still write.
    packer_.reset();
    done_.reset();
    ordered_.reset();
    stream_.reset();
    if (stuck()) gpu::keep_until_exit(std::move(dev_));
}

std::unique_ptr<gpu::DeviceBuffer> GpuStage::alloc(uint64_t bytes, const std::string &what) {
    return std::make_unique<gpu::DeviceBuffer>(*dev_, bytes, what, gpu::DeviceBuffer::Where::kPinnedHost);
}

void GpuStage::pack(const wsync_tensor_t *tensors, const TensorTable &table,
                    const std::vector<std::size_t> &which, gpu::DeviceBuffer &buf,
                    const sys::Deadline &deadline, const std::string &chunk) {
    entries_.clear();
    uint64_t tile = 0;
    for (std::size_t i : which) {
        const uint64_t n = table.metas[i].nbytes;
        if (table.offsets[i] + n > buf.size())
            fail(WSYNC_ERR_INTERNAL, std::string(kind_) + ": tensor '" + table.metas[i].name +
                                         "' placed past its staging buffer");
        gpu::PackEntry e{reinterpret_cast<uint64_t>(tensors[i].data), buf.ptr() + table.offsets[i], n,
                         static_cast<uint32_t>(gpu::kPackCopy), static_cast<uint32_t>(tile)};
        tile += gpu::pack_tiles(e);
        if (tile > UINT32_MAX)
            fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(kind_) + ": " + chunk + " is " +
                                                 std::to_string(tile) +
                                                 " pack tiles, more than one launch can index");
        entries_.push_back(e);
    }
    // The caller's writes first: nothing is queued yet, so giving up here leaves nothing behind.
    ordered_->record(order_);
    gpu::poll_until([&] { return ordered_->done(); }, deadline,
                    std::string(kind_) + ": work queued on " + gpu::stream_text(order_) + " of " +
                        dev_->uuid_string() + " before " + chunk);
    packer_->pack(entries_, stream_->get());
    done_->record(stream_->get());
    try {
        gpu::poll_until([&] { return done_->done(); }, deadline,
                        std::string(kind_) + ": packing the device tensors of " + chunk +
                            " into pinned host memory on " + dev_->uuid_string());
    } catch (const Error &e) {
        if (e.status() == WSYNC_ERR_TIMEOUT) stuck_.store(true, std::memory_order_release);
        throw;
    }
}

}  // namespace wsync::ucx
