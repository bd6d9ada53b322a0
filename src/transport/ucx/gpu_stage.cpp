#include "transport/ucx/gpu_stage.hpp"

#include <mutex>

#include "error.hpp"
#include "gpu/kernels/pack_abi.hpp"
#include "gpu/pack.hpp"

namespace wsync::ucx {

struct GpuStage::Gpu {
    std::unique_ptr<gpu::Device> dev;
    std::unique_ptr<gpu::Stream> stream;
    std::unique_ptr<gpu::Event> ordered, done;
    std::unique_ptr<gpu::Packer> packer;
    ~Gpu() {  // the pack machinery before the device it lives on
        packer.reset();
        done.reset();
        ordered.reset();
        stream.reset();
        dev.reset();
    }
};

namespace {
// Stages destroyed while work they gave up on may still run: kept reachable until the process
// ends (the driver frees their memory then), so leak checkers see they are kept on purpose.
template <class T>
void keep_until_exit(std::unique_ptr<T> p) {
    static std::mutex mu;
    static auto *kept = new std::vector<std::unique_ptr<T>>();  // never destroyed
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(std::move(p));
}
}  // namespace

GpuStage::GpuStage(int ordinal, const char *kind) : kind_(kind), g_(std::make_unique<Gpu>()) {
    g_->dev = std::make_unique<gpu::Device>(gpu::cuda(), ordinal, kind);
    g_->stream = std::make_unique<gpu::Stream>(*g_->dev);
    g_->ordered = std::make_unique<gpu::Event>(*g_->dev);
    g_->done = std::make_unique<gpu::Event>(*g_->dev);
    // Kernel only: the stage is pinned host memory, which the kernel writes across the bus.
    g_->packer = std::make_unique<gpu::Packer>(*g_->dev, UINT64_MAX);
}

GpuStage::~GpuStage() {
    // Destroying the stream, the pack table or the module, or releasing the device's primary
    // context, could wait for (or pull memory from under) the work given up on.
    if (!idle()) keep_until_exit(std::move(g_));
}

int GpuStage::ordinal() const { return g_->dev->ordinal(); }
std::string GpuStage::uuid() const { return g_->dev->uuid_string(); }

bool GpuStage::idle() noexcept {
    try {
        gpu::Device::Scope scope(*g_->dev);
        if (stuck() && g_->done->done()) stuck_.store(false, std::memory_order_release);
        if (busy_.load(std::memory_order_acquire) && g_->ordered->done()) busy_.store(false, std::memory_order_release);
        return !stuck() && !busy_.load(std::memory_order_acquire);
    } catch (...) {
        return false;
    }
}

std::unique_ptr<gpu::DeviceBuffer> GpuStage::alloc(uint64_t bytes, const std::string &what) {
    return std::make_unique<gpu::DeviceBuffer>(*g_->dev, bytes, what, gpu::DeviceBuffer::Where::kPinnedHost);
}

// Nothing queues behind a pack that timed out: it would wait for it, and a larger pack table
// would free the one it still reads.
void GpuStage::require_not_stuck(const std::string &chunk) {
    if (!stuck()) return;
    gpu::Device::Scope scope(*g_->dev);
    if (!g_->done->done())
        fail(WSYNC_ERR_TIMEOUT, std::string(kind_) + ": packing " + stuck_chunk_ + " on " + g_->dev->uuid_string() +
                                    " timed out and has still not finished; " + chunk + " is not sent");
    stuck_.store(false, std::memory_order_release);
}

void GpuStage::pack(const wsync_tensor_t *tensors, const TensorTable &table,
                    const std::vector<std::size_t> &which, gpu::DeviceBuffer &buf,
                    const sys::Deadline &deadline, const std::string &chunk) {
    const std::string gpu_name = g_->dev->uuid_string();
    require_not_stuck(chunk);
    for (std::size_t i : which)  // a kernel that faults ends this process's CUDA context
        gpu::check_source(*g_->dev, tensors[i].data, table.metas[i].nbytes, table.metas[i].name, kind_);
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
    // The caller's writes first: nothing is queued yet, so giving up here leaves nothing of ours
    // behind (but the caller's stream is busy: pinned memory is not freed until it moves on).
    g_->ordered->record(order_);
    try {
        gpu::poll_until([&] { return g_->ordered->done(); }, deadline,
                        std::string(kind_) + ": work queued on " + gpu::stream_text(order_) + " of " +
                            gpu_name + " before " + chunk);
    } catch (const Error &e) {
        if (e.status() == WSYNC_ERR_TIMEOUT) busy_.store(true, std::memory_order_release);
        throw;
    }
    busy_.store(false, std::memory_order_release);
    g_->packer->pack(entries_, g_->stream->get());
    // From the launch on, any failure leaves a pack that may still run.
    try {
        g_->done->record(g_->stream->get());
        gpu::poll_until([&] { return g_->done->done(); }, deadline,
                        std::string(kind_) + ": packing the device tensors of " + chunk +
                            " into pinned host memory on " + gpu_name);
    } catch (...) {
        stuck_chunk_ = chunk;
        stuck_.store(true, std::memory_order_release);
        throw;
    }
}

}  // namespace wsync::ucx
