#include "gpu/pack.hpp"

#include <algorithm>
#include <cinttypes>

#include "error.hpp"
#include "plan/layout.hpp"

namespace wsync::gpu {

namespace {
const char kPackPtx[] =
#include "gpu/kernels/pack_ptx.inc"
    ;
}  // namespace

// ---------------------------------------------------------------------------------------------
Cast parse_cast(const std::string &option) {
    if (option == "bfloat16") return Cast::BFloat16;
    if (option == "float16") return Cast::Float16;
    return Cast::None;  // the options table admits only "", "bfloat16" and "float16"
}

bool is_cast_name(const std::string &text) {
    return text.empty() || text == "bfloat16" || text == "float16";
}

OptionSpec cast_option(const char *doc) {
    return {"dtype", OptionSpec::Type::String, 0, 0, 0, "sender", doc, "", "|bfloat16|float16"};
}

OptionSpec bucket_bytes_option(const char *doc) {
    return {"bucket_bytes", OptionSpec::Type::UInt, uint64_t(256) << 20, 4096, uint64_t(1) << 40,
            "sender", doc};
}

void refuse_cast_with_delta(const char *kind, const Options &options) {
    const std::string &delta = options.text("delta"), &dtype = options.text("dtype");
    if (delta != "off" && !dtype.empty())
        fail(WSYNC_ERR_UNSUPPORTED,
             std::string(kind) + ": option 'delta' is \"" + delta + "\" and 'dtype' is \"" + dtype +
                 "\": a patch applies to the tensor as the engine holds it, and a cast changes "
                 "that; leave one of them off");
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

void check_source(const Device &dev, const void *data, uint64_t len, const std::string &name,
                  const char *kind) {
    if (len == 0) return;
    const CudaApi &api = dev.api();
    Device::Scope scope(dev);
    // Whether the driver knows address p; `base`/`size` give the allocation holding it when the
    // driver says (cuMemGetAddressRange answers for device allocations; pinned host memory may
    // be known only to cuPointerGetAttribute).
    auto known = [&](CUdeviceptr p, CUdeviceptr *base, std::size_t *size) {
        *base = 0;
        *size = 0;
        if (api.cuMemGetAddressRange(base, size, p) == CUDA_SUCCESS) return true;
        *base = 0;
        *size = 0;
        unsigned type = 0;
        return api.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS;
    };
    const auto p = reinterpret_cast<CUdeviceptr>(data);
    auto who = [&] {
        return std::string(kind) + ": tensor '" + name + "' (" +
               strf("%" PRIu64 " bytes at 0x%llx", len, static_cast<unsigned long long>(p)) + ")";
    };
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (!known(p, &base, &size))
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             who() + " is not memory the CUDA driver knows on " + dev.uuid_string() +
                 " (host memory from malloc, or memory already freed?); the pack kernel would "
                 "fault reading it, which ends this process's CUDA context. Nothing was sent");
    if (size != 0 && p - base <= size && len <= size - (p - base)) return;  // one allocation
    CUdeviceptr last_base = 0;
    std::size_t last_size = 0;
    if (p > UINT64_MAX - (len - 1) || !known(p + len - 1, &last_base, &last_size))
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             who() + " runs past the memory the CUDA driver knows" +
                 (size != 0 ? strf(" (its allocation holds %zu bytes from 0x%llx)", size,
                                   static_cast<unsigned long long>(base))
                            : std::string()) +
                 ": its last byte is outside every allocation; the pack kernel would fault "
                 "reading it, which ends this process's CUDA context. Nothing was sent");
}

void check_sources(const Device &dev, const wsync_tensor_t *tensors,
                   const std::vector<TensorMeta> &metas, const char *kind) {
    for (std::size_t i = 0; i < metas.size(); ++i)
        check_source(dev, tensors[i].data, metas[i].nbytes, metas[i].name, kind);
}

uint64_t layout_bucket(TensorTable &table, Cast cast, uint64_t capacity, std::vector<PackOp> *ops,
                       const std::string &who) {
    ops->resize(table.metas.size());
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        TensorMeta &m = table.metas[i];
        PackOp op;
        wsync_dtype_t out = cast_dtype(cast, m.dtype, &op);
        if (op != kPackCopy) {
            m.nbytes = m.nbytes / 2;  // 4-byte elements become 2-byte ones
            m.dtype = out;
        }
        (*ops)[i] = op;
    }
    return layout::place(table, capacity, who);
}

void fill_pack_entries(const wsync_tensor_t *tensors, const TensorTable &table,
                       const std::vector<PackOp> &ops, CUdeviceptr bucket,
                       std::vector<PackEntry> *entries) {
    entries->resize(table.metas.size());
    uint64_t tile = 0;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        // The casts count elements: a 4-byte float32 becomes 2 bytes, nbytes is already halved.
        const uint64_t count = ops[i] == kPackCopy ? table.metas[i].nbytes : table.metas[i].nbytes / 2;
        // The cast reads float32 elements with 4-byte loads: a source off a 4-byte boundary
        // faults the kernel (CUDA_ERROR_MISALIGNED_ADDRESS on an H200, 2026-12-04), and a fault
        // is sticky: it ends the trainer's CUDA context. Refused here, before anything is queued.
        const auto src = reinterpret_cast<uint64_t>(tensors[i].data);
        if (ops[i] != kPackCopy && src % 4 != 0)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "tensor '" + table.metas[i].name + strf("' (float32 at 0x%llx) is not 4-byte aligned, ",
                                                         static_cast<unsigned long long>(src)) +
                     "which the cast to " + dtype_name(table.metas[i].dtype) +
                     " needs (its loads would fault and end this process's CUDA context); "
                     "send it from aligned memory, or without the \"dtype\" cast. Nothing was sent");
        PackEntry &e = (*entries)[i];
        e = PackEntry{src, bucket + table.offsets[i], count,
                      static_cast<uint32_t>(ops[i]), static_cast<uint32_t>(tile)};
        tile += pack_tiles(e);
        // 2^32 tiles are 256 TiB of a copy: no bucket comes near, but never wrap silently.
        if (tile > UINT32_MAX)
            fail(WSYNC_ERR_INVALID_ARGUMENT, "a chunk of " + std::to_string(tile) +
                                                 " pack tiles is more than one launch can index");
    }
}

// ---------------------------------------------------------------------------------------------
Packer::Packer(const Device &d, uint64_t driver_copy_min)
    : dev_(d), driver_copy_min_(driver_copy_min) {
    d.require_kernels("the pack kernel");
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

Packer::Queued Packer::pack(const std::vector<PackEntry> &entries, CUstream stream) {
    // Copies are never joined, even where sources and destinations both continue each other:
    // the driver refuses a device copy whose range spans two allocations (CUDA_ERROR_INVALID_VALUE
    // on the H200, 2026-12-04: adjacent cuMemAlloc allocations, a bucket's neighbours), and
    // which allocation holds a byte is the driver's to say, one call a tensor.
    // The kernel's share (tiles renumbered), then one driver copy per large plain copy, all on
    // `stream`: whoever waits for the stream waits for both.
    staged_.clear();
    uint64_t tiles = 0;
    for (const PackEntry &e : entries) {
        if (e.op == kPackCopy && e.count >= driver_copy_min_) continue;
        PackEntry k = e;
        k.first_tile = static_cast<uint32_t>(tiles);
        tiles += pack_tiles(k);
        if (tiles > UINT32_MAX)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "a chunk's pack kernel tiles exceed 2^32 (" + std::to_string(entries.size()) + " tensors)");
        staged_.push_back(k);
    }
    Queued q;
    Device::Scope scope(dev_);
    if (tiles) launch(stream, tiles), q.launches = 1;
    for (const PackEntry &e : entries) {
        if (e.op != kPackCopy || e.count < driver_copy_min_) continue;
        WSYNC_CU(dev_.api(), cuMemcpyDtoDAsync(e.dst, e.src, e.count, stream),
                 "queuing a device copy of " + std::to_string(e.count) + " bytes");
        ++q.driver_copies;
    }
    return q;
}

// One launch over staged_ (`tiles` of them) on `stream`; the caller holds the device's scope.
void Packer::launch(CUstream stream, uint64_t tiles) {
    const uint64_t bytes = staged_.size() * sizeof(PackEntry);
    if (table_.size() < bytes) {
        if (table_.size()) retired_.push_back(std::move(table_));
        table_ = DeviceBuffer(dev_, std::max<uint64_t>(bytes * 2, 64 * sizeof(PackEntry)),
                              "pack table");
    }
    if (!launched_) launched_ = std::make_unique<Event>(dev_);
    // The previous launch may still read the table on another stream: this one's upload waits.
    if (launched_once_ && stream != last_stream_)
        WSYNC_CU(dev_.api(), cuStreamWaitEvent(stream, launched_->get(), 0),
                 "ordering the pack table's upload after the previous launch");
    WSYNC_CU(dev_.api(), cuMemcpyHtoDAsync(table_.ptr(), staged_.data(), bytes, stream),
             "uploading the pack table");
    // One block a tile (a 1 GiB chunk is 16384 blocks of 64 KiB), capped so a huge chunk's
    // blocks take several tiles each rather than asking for an enormous grid.
    const unsigned gx = static_cast<unsigned>(std::min<uint64_t>(tiles, uint64_t(1) << 20));
    CUdeviceptr table = table_.ptr();
    unsigned count = static_cast<unsigned>(staged_.size());
    unsigned ntiles = static_cast<unsigned>(tiles);
    void *params[] = {&table, &count, &ntiles};
    WSYNC_CU(dev_.api(),
             cuLaunchKernel(fn_, gx, 1, 1, kPackBlock, 1, 1, 0, stream, params, nullptr),
             "launching the pack kernel");
    launched_->record(stream);
    last_stream_ = stream;
    launched_once_ = true;
}

}  // namespace wsync::gpu
