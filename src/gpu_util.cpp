#include <cstdio>
#include "gpu_util.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include "error.hpp"

namespace wsync::gpu {

namespace {
const char kPackPtx[] =
#include "kernels/pack_ptx.inc"
    ;
constexpr uint64_t kTensorAlign = 256;
uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
}  // namespace

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
}

Device::~Device() { api_.cuDevicePrimaryCtxRelease(dev_); }

Device::Scope::Scope(const Device &d) : api_(d.api()) {
    api_.cuCtxGetCurrent(&prev_);
    WSYNC_CU(api_, cuCtxSetCurrent(d.context()), "cuCtxSetCurrent");
}

Device::Scope::~Scope() { api_.cuCtxSetCurrent(prev_); }

int ordinal_of(const CudaApi &api, const CUuuid &uuid) {
    int count = 0;
    WSYNC_CU(api, cuDeviceGetCount(&count), "cuDeviceGetCount");
    for (int i = 0; i < count; ++i) {
        CUdevice dev;
        CUuuid u;
        if (api.cuDeviceGet(&dev, i) == CUDA_SUCCESS && api.cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS &&
            std::memcmp(u.bytes, uuid.bytes, 16) == 0)
            return i;
    }
    return -1;
}

// ---------------------------------------------------------------------------------------------
DeviceBuffer::DeviceBuffer(const Device &d, uint64_t bytes, const std::string &what)
    : dev_(&d), size_(bytes) {
    Device::Scope scope(d);
    WSYNC_CU(d.api(), cuMemAlloc(&ptr_, bytes),
             what + ": cuMemAlloc of " + std::to_string(bytes) + " bytes on " + d.uuid_string());
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer &&o) noexcept : dev_(o.dev_), ptr_(o.ptr_), size_(o.size_) {
    o.ptr_ = 0;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
    if (this != &o) {
        release();
        dev_ = o.dev_, ptr_ = o.ptr_, size_ = o.size_;
        o.ptr_ = 0;
    }
    return *this;
}

void DeviceBuffer::release() noexcept {
    if (!ptr_) return;
    try {
        Device::Scope scope(*dev_);
        dev_->api().cuMemFree(ptr_);
    } catch (...) {
    }
    ptr_ = 0;
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

void poll_sleep(int round) {
    int us = round < 50 ? 20 : (round < 200 ? 200 : 1000);
    std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void throw_timeout(const std::string &message) { fail(WSYNC_ERR_TIMEOUT, message); }

// ---------------------------------------------------------------------------------------------
Cast parse_cast(const std::string &option) {
    if (option == "bfloat16") return Cast::BFloat16;
    if (option == "float16") return Cast::Float16;
    return Cast::None;  // the options table admits only "", "bfloat16" and "float16"
}

wsync_dtype_t cast_dtype(Cast cast, wsync_dtype_t in, PackOp *op) {
    *op = kPackCopy;
    bool f32 = in.code == WSYNC_DTYPE_FLOAT && in.bits == 32 && in.lanes == 1;
    if (!f32 || cast == Cast::None) return in;
    *op = cast == Cast::BFloat16 ? kPackF32ToBf16 : kPackF32ToF16;
    return wsync_dtype_t{static_cast<uint8_t>(cast == Cast::BFloat16 ? WSYNC_DTYPE_BFLOAT
                                                                     : WSYNC_DTYPE_FLOAT),
                         16, 1};
}

uint64_t layout_bucket(TensorTable &table, Cast cast, uint64_t capacity, std::vector<PackOp> *ops,
                       const std::string &who) {
    table.offsets.resize(table.metas.size());
    ops->resize(table.metas.size());
    uint64_t end = 0;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        TensorMeta &m = table.metas[i];
        PackOp op;
        wsync_dtype_t out = cast_dtype(cast, m.dtype, &op);
        if (op != kPackCopy) {
            m.nbytes = m.nbytes / 2;  // 4-byte elements become 2-byte ones
            m.dtype = out;
        }
        (*ops)[i] = op;
        uint64_t off = round_up(end, kTensorAlign);
        if (m.nbytes > capacity || off > capacity - m.nbytes)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 who + ": chunk does not fit in one bucket of " + std::to_string(capacity) +
                     " bytes (tensor '" + m.name + "' of " + std::to_string(m.nbytes) +
                     " bytes would end past it); raise bucket_bytes or plan smaller chunks");
        table.offsets[i] = off;
        end = off + m.nbytes;
    }
    return end;
}

// ---------------------------------------------------------------------------------------------
Packer::Packer(const Device &d) : dev_(d) {
    Device::Scope scope(d);
    WSYNC_CU(d.api(), cuModuleLoadData(&module_, kPackPtx),
             "loading the pack kernel (PTX for compute_80) on " + d.uuid_string());
    CUresult rc = d.api().cuModuleGetFunction(&fn_, module_, kPackKernel);
    if (rc != CUDA_SUCCESS) {
        d.api().cuModuleUnload(module_);
        cuda_fail(d.api(), rc, "cuModuleGetFunction(wsync_pack)");
    }
}

Packer::~Packer() {
    try {
        Device::Scope scope(dev_);
        dev_.api().cuModuleUnload(module_);
    } catch (...) {
    }
}

void Packer::pack(const std::vector<PackEntry> &entries, CUstream stream) {
    if (entries.empty()) return;
    const uint64_t bytes = entries.size() * sizeof(PackEntry);
    if (table_.size() < bytes)
        table_ = DeviceBuffer(dev_, std::max<uint64_t>(bytes * 2, 64 * sizeof(PackEntry)),
                              "pack table");
    // The host copy must outlive the asynchronous upload; callers wait for the stream before
    // the next pack, so one staging vector suffices.
    staged_ = entries;
    Device::Scope scope(dev_);
    WSYNC_CU(dev_.api(), cuMemcpyHtoDAsync(table_.ptr(), staged_.data(), bytes, stream),
             "uploading the pack table");
    uint64_t largest = 0;
    for (const auto &e : entries) largest = std::max(largest, e.count);
    // Each block row walks entries; enough blocks per row to cover the largest entry in a few
    // grid-stride steps of 16 bytes per thread, capped so small chunks launch small grids.
    unsigned gy = static_cast<unsigned>(std::min<std::size_t>(entries.size(), 1024));
    uint64_t per_row = (largest + uint64_t(kPackBlock) * 16 * 4 - 1) / (uint64_t(kPackBlock) * 16 * 4);
    unsigned gx = static_cast<unsigned>(std::clamp<uint64_t>(per_row, 1, 1024 / std::max(1u, gy / 8 + 1) + 1));
    CUdeviceptr table = table_.ptr();
    unsigned count = static_cast<unsigned>(entries.size());
    void *params[] = {&table, &count};
    WSYNC_CU(dev_.api(),
             cuLaunchKernel(fn_, gx, gy, 1, kPackBlock, 1, 1, 0, stream, params, nullptr),
             "launching the pack kernel");
}

std::string stream_text(CUstream s) {
    if (s == CU_STREAM_LEGACY || s == nullptr) return "the legacy default stream";
    char buf[48];
    std::snprintf(buf, sizeof buf, "the caller's stream %p", static_cast<void *>(s));
    return buf;
}

}  // namespace wsync::gpu
