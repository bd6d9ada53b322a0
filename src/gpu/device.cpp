#include "gpu/device.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "error.hpp"

namespace wsync::gpu {

// ---------------------------------------------------------------------------------------------
Device::Device(const CudaApi &api, int ordinal, const std::string &who)
    : api_(api), ordinal_(ordinal) {
    int count = 0;
    WSYNC_CU(api_, cuDeviceGetCount(&count), who + ": cuDeviceGetCount");
    if (ordinal < 0 || ordinal >= count)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             who + ": device " + std::to_string(ordinal) + " does not exist: this process sees " +
                 std::to_string(count) + " GPU(s) (after CUDA_VISIBLE_DEVICES)");
    WSYNC_CU(api_, cuDeviceGet(&dev_, ordinal), who + ": cuDeviceGet");
    WSYNC_CU(api_, cuDeviceGetUuid(&uuid_, dev_), who + ": cuDeviceGetUuid");
    WSYNC_CU(api_, cuDevicePrimaryCtxRetain(&ctx_, dev_), who + ": cuDevicePrimaryCtxRetain");
    int major = 0, minor = 0;
    if (api_.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev_) == CUDA_SUCCESS &&
        api_.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev_) == CUDA_SUCCESS)
        cc_ = 10 * major + minor;
}

void Device::require_kernels(const std::string &what) const {
    if (cc_ == 0 || cc_ >= 80) return;
    fail(WSYNC_ERR_UNAVAILABLE,
         what + ": " + uuid_string() + strf(" has compute capability %d.%d", cc_ / 10, cc_ % 10) +
             "; libwsync's GPU kernels (pack, cast, apply, delta) need 8.0 or newer (A100, H100, "
             "...). Without them: \"cuda_ipc\" with \"packed\": false and no \"dtype\" cast, "
             "and engines copying out of the views");
}

Device::~Device() { api_.cuDevicePrimaryCtxRelease(dev_); }

Device::Scope::Scope(const Device &d) : api_(d.api()) {
    api_.cuCtxGetCurrent(&prev_);
    WSYNC_CU(api_, cuCtxSetCurrent(d.context()), "cuCtxSetCurrent");
}

Device::Scope::~Scope() { api_.cuCtxSetCurrent(prev_); }

// ---------------------------------------------------------------------------------------------
DeviceBuffer::DeviceBuffer(const Device &d, uint64_t bytes, const std::string &what, Where where)
    : dev_(&d), size_(bytes), where_(where) {
    Device::Scope scope(d);
    if (where == Where::kDevice) {
        WSYNC_CU(d.api(), cuMemAlloc(&ptr_, bytes),
                 what + ": cuMemAlloc of " + std::to_string(bytes) + " bytes on " + d.uuid_string());
        return;
    }
    WSYNC_CU(d.api(), cuMemHostAlloc(&host_, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
             what + ": cuMemHostAlloc of " + std::to_string(bytes) + " bytes of pinned host memory");
    const CUresult rc = d.api().cuMemHostGetDevicePointer(&ptr_, host_, 0);
    if (rc != CUDA_SUCCESS) {
        d.api().cuMemFreeHost(host_);
        host_ = nullptr;
        ptr_ = 0;
        cuda_fail(d.api(), rc, what + ": cuMemHostGetDevicePointer for pinned host memory on " + d.uuid_string());
    }
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer &&o) noexcept
    : dev_(o.dev_), ptr_(o.ptr_), size_(o.size_), where_(o.where_), host_(o.host_) {
    o.ptr_ = 0;
    o.host_ = nullptr;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
    if (this != &o) {
        release();
        dev_ = o.dev_, ptr_ = o.ptr_, size_ = o.size_, where_ = o.where_, host_ = o.host_;
        o.ptr_ = 0;
        o.host_ = nullptr;
    }
    return *this;
}

void DeviceBuffer::release() noexcept {
    if (!ptr_ && !host_) return;
    try {
        Device::Scope scope(*dev_);
        if (where_ == Where::kPinnedHost) dev_->api().cuMemFreeHost(host_);
        else dev_->api().cuMemFree(ptr_);
    } catch (...) {
    }
    ptr_ = 0;
    host_ = nullptr;
}

Stream::Stream(const Device &d) : dev_(d) {
    Device::Scope scope(d);
    WSYNC_CU(d.api(), cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

Stream::~Stream() {
    try {
        Device::Scope scope(dev_);
        dev_.api().cuStreamDestroy(s_);
    } catch (...) {
    }
}

Event::Event(const Device &d) : dev_(d) {
    Device::Scope scope(d);
    WSYNC_CU(d.api(), cuEventCreate(&e_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
}

Event::~Event() {
    try {
        Device::Scope scope(dev_);
        dev_.api().cuEventDestroy(e_);
    } catch (...) {
    }
}

void Event::record(CUstream s) {
    Device::Scope scope(dev_);
    WSYNC_CU(dev_.api(), cuEventRecord(e_, s), "cuEventRecord");
}

bool Event::done() const {
    CUresult rc = dev_.api().cuEventQuery(e_);
    if (rc == CUDA_SUCCESS) return true;
    if (rc == CUDA_ERROR_NOT_READY) return false;
    cuda_fail(dev_.api(), rc, "cuEventQuery (a kernel or copy on " + dev_.uuid_string() + " failed)");
}

std::vector<MemPiece> check_device_destination(const Device &dev, void *dst, uint64_t len,
                                               const std::function<std::string()> &what,
                                               const char *kind, const char *fn) {
    const CudaApi &api = dev.api();
    Device::Scope scope(dev);
    const auto d = reinterpret_cast<CUdeviceptr>(dst);
    auto where = [&] {
        return std::string(fn) + ": the destination of " + what() + " (" +
               strf("0x%llx", static_cast<unsigned long long>(d)) + ")";
    };
    unsigned type = 0;
    int ordinal = -1;
    if (api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE ||
        api.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d) != CUDA_SUCCESS)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             where() + " is not device memory; strategy '" + kind +
                 "' copies into memory of this receiver's GPU " + dev.uuid_string() +
                 " (copy into host memory out of the wsync_recv_next view)");
    if (ordinal != dev.ordinal())
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             where() + " is memory of GPU ordinal " + std::to_string(ordinal) +
                 ", not of this receiver's GPU " + dev.uuid_string() + " (ordinal " +
                 std::to_string(dev.ordinal()) + ")");
    // [dst, dst + len) in one allocation, or in a run of mapped allocations that follow each
    // other without a gap: the driver answers cuMemGetAddressRange for one physical handle of a
    // virtual-memory mapping (PyTorch's expandable segments map 20 MiB handles), so a tensor
    // there spans several (the 2026-12-04 H200 run refused every destination over 20 MiB).
    std::vector<MemPiece> pieces;
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (api.cuMemGetAddressRange(&base, &size, d) != CUDA_SUCCESS || d - base >= size)
        fail(WSYNC_ERR_INVALID_ARGUMENT, where() + " is not inside an allocation the driver knows");
    const CUdeviceptr end = d + len;  // len fits: the caller's range of its own memory
    if (end < d) fail(WSYNC_ERR_INVALID_ARGUMENT, where() + strf(": %" PRIu64 " bytes wrap the address space", len));
    const CUdeviceptr first = base;
    const std::size_t first_size = size;
    for (;;) {
        unsigned long long id = 0;
        if (api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base) != CUDA_SUCCESS) id = 0;
        pieces.push_back({base, size, id});
        if (end <= base + size) break;
        const CUdeviceptr next = base + size;
        int next_ordinal = -1;
        CUdeviceptr next_base = 0;
        std::size_t next_size = 0;
        if (api.cuMemGetAddressRange(&next_base, &next_size, next) != CUDA_SUCCESS || next_base != next ||
            api.cuPointerGetAttribute(&next_ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, next) != CUDA_SUCCESS ||
            next_ordinal != dev.ordinal())
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 where() + strf(": %" PRIu64 " bytes do not fit in its allocation (%zu bytes at 0x%llx)",
                                len, first_size, static_cast<unsigned long long>(first)) +
                     (pieces.size() > 1
                          ? strf(" and the %zu mapped after it, which end at 0x%llx", pieces.size() - 1,
                                 static_cast<unsigned long long>(next))
                          : std::string()));
        base = next_base;
        size = next_size;
    }
    return pieces;
}

void recheck_device_destination(const Device &dev, const std::vector<MemPiece> &pieces,
                                const std::function<std::string()> &what, const char *fn) {
    const CudaApi &api = dev.api();
    Device::Scope scope(dev);
    for (const MemPiece &p : pieces) {
        CUdeviceptr base = 0;
        std::size_t size = 0;
        unsigned long long id = 0;
        const bool same =
            api.cuMemGetAddressRange(&base, &size, p.base) == CUDA_SUCCESS && base == p.base &&
            size == p.size &&
            (p.buffer_id == 0 ||
             (api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p.base) == CUDA_SUCCESS &&
              id == p.buffer_id));
        if (!same)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 std::string(fn) + ": the destination of " + what() +
                     strf(" lies in memory that was freed or mapped anew since the table was made "
                          "(the allocation of %zu bytes at 0x%llx is gone or another); make the "
                          "destination table again from the tensors as they are now",
                          p.size, static_cast<unsigned long long>(p.base)));
    }
}

void queue_copy_host_to_device(const Device &dev, CUstream stream, void *dst, const void *src,
                               uint64_t len, const std::function<std::string()> &what, const char *kind) {
    check_device_destination(dev, dst, len, what, kind);
    const CudaApi &api = dev.api();
    Device::Scope scope(dev);
    WSYNC_CU(api, cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, len, stream),
             "queuing the copy of " + what() + " on " + stream_text(stream));
}

bool is_device_memory(const Device &dev, const void *p) {
    Device::Scope scope(dev);
    unsigned type = 0;
    return dev.api().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
}

void queue_copy_to_device(const Device &dev, CUstream stream, void *dst, const void *src,
                          uint64_t len, const std::function<std::string()> &what, const char *kind) {
    check_device_destination(dev, dst, len, what, kind);
    const CudaApi &api = dev.api();
    Device::Scope scope(dev);
    const auto d = reinterpret_cast<CUdeviceptr>(dst);
    WSYNC_CU(api, cuMemcpyDtoDAsync(d, reinterpret_cast<CUdeviceptr>(src), len, stream),
             "queuing the copy of " + what() + " on " + stream_text(stream));
}

void keep_until_exit(std::unique_ptr<Device> dev) {
    static std::mutex mu;
    static auto *kept = new std::vector<std::unique_ptr<Device>>();  // never destroyed
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(std::move(dev));
}

namespace {
int64_t monotonic_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
}  // namespace

Backoff::Backoff() : start_ns_(monotonic_ns()) {}

void Backoff::restart() { start_ns_ = monotonic_ns(); }

void Backoff::pause() {
    const int64_t waited = monotonic_ns() - start_ns_;
    if (waited < 2'000'000) {
        std::this_thread::yield();
        return;
    }
    const int us = waited < 50'000'000 ? 20 : (waited < 500'000'000 ? 200 : 1000);
    std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void throw_timeout(const std::string &message) { fail(WSYNC_ERR_TIMEOUT, message); }

std::string stream_text(CUstream s) {
    if (s == CU_STREAM_LEGACY || s == nullptr) return "the legacy default stream";
    char buf[48];
    std::snprintf(buf, sizeof buf, "the caller's stream %p", static_cast<void *>(s));
    return buf;
}

}  // namespace wsync::gpu
