#include "tensor.hpp"

#include <algorithm>
#include <iterator>
#include <cstring>
#include <unordered_set>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy/copy.hpp"
#include "error.hpp"
#include "plan/parts.hpp"
#include "wire.hpp"

namespace wsync {

std::optional<uint64_t> mul_u64(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

std::optional<uint64_t> add_u64(uint64_t a, uint64_t b) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
    return r;
}

namespace {

struct DtypeName {
    uint8_t code;
    const char *name;
};

// DLPack codes (dlpack.h DLDataTypeCode, v1.1); names follow torch where it has one.
constexpr DtypeName kCodeNames[] = {
    {WSYNC_DTYPE_INT, "int"},
    {WSYNC_DTYPE_UINT, "uint"},
    {WSYNC_DTYPE_FLOAT, "float"},
    {WSYNC_DTYPE_BFLOAT, "bfloat"},
    {WSYNC_DTYPE_COMPLEX, "complex"},
    {WSYNC_DTYPE_BOOL, "bool"},
    {WSYNC_DTYPE_FLOAT8_E3M4, "float8_e3m4"},
    {WSYNC_DTYPE_FLOAT8_E4M3, "float8_e4m3"},
    {WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ, "float8_e4m3b11fnuz"},
    {WSYNC_DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn"},
    {WSYNC_DTYPE_FLOAT8_E4M3FNUZ, "float8_e4m3fnuz"},
    {WSYNC_DTYPE_FLOAT8_E5M2, "float8_e5m2"},
    {WSYNC_DTYPE_FLOAT8_E5M2FNUZ, "float8_e5m2fnuz"},
    {WSYNC_DTYPE_FLOAT8_E8M0FNU, "float8_e8m0fnu"},
    {WSYNC_DTYPE_FLOAT6_E2M3FN, "float6_e2m3fn"},
    {WSYNC_DTYPE_FLOAT6_E3M2FN, "float6_e3m2fn"},
    {WSYNC_DTYPE_FLOAT4_E2M1FN, "float4_e2m1fn"},
};

const char *code_name(uint8_t code) {
    for (const auto &c : kCodeNames)
        if (c.code == code) return c.name;
    return nullptr;
}

// Bits a code requires per lane; 0 = any of 8/16/32/64 (int, uint, float, complex pairs).
unsigned fixed_bits(uint8_t code) {
    switch (code) {
    case WSYNC_DTYPE_BFLOAT: return 16;
    case WSYNC_DTYPE_BOOL: return 8;
    case WSYNC_DTYPE_FLOAT6_E2M3FN:
    case WSYNC_DTYPE_FLOAT6_E3M2FN: return 6;
    case WSYNC_DTYPE_FLOAT4_E2M1FN: return 4;
    case WSYNC_DTYPE_INT:
    case WSYNC_DTYPE_UINT:
    case WSYNC_DTYPE_FLOAT:
    case WSYNC_DTYPE_COMPLEX: return 0;
    default: return 8;  // the float8 family
    }
}

}  // namespace

std::string tensor_label(std::size_t index, const char *name) {
    std::string s = "tensor " + std::to_string(index);
    if (name)
        s += " ('" +
             wire::printable(std::string_view(name, strnlen(name, WSYNC_MAX_NAME_BYTES + 1)), 80) +
             "')";
    return s;
}

uint64_t dtype_size(wsync_dtype_t d) {
    if (!code_name(d.code) || d.lanes == 0 || d.bits == 0) return 0;
    unsigned fixed = fixed_bits(d.code);
    if (fixed != 0) {
        if (d.bits != fixed) return 0;
    } else {
        bool ok = d.bits == 8 || d.bits == 16 || d.bits == 32 || d.bits == 64;
        if (d.code == WSYNC_DTYPE_COMPLEX) ok = d.bits == 32 || d.bits == 64 || d.bits == 128;
        if (d.code == WSYNC_DTYPE_FLOAT) ok = d.bits == 16 || d.bits == 32 || d.bits == 64;
        if (!ok) return 0;
    }
    uint64_t total_bits = uint64_t(d.bits) * d.lanes;
    if (total_bits % 8 != 0) return 0;  // sub-byte elements must pack to whole bytes
    return total_bits / 8;
}

std::string dtype_name(wsync_dtype_t d) {
    const char *base = code_name(d.code);
    if (!base || dtype_size(d) == 0)
        return "dtype(code=" + std::to_string(d.code) + ",bits=" + std::to_string(d.bits) +
               ",lanes=" + std::to_string(d.lanes) + ")";
    std::string s = base;
    if (fixed_bits(d.code) == 0 || d.code == WSYNC_DTYPE_BFLOAT) s += std::to_string(d.bits);
    if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
    return s;
}

std::string device_name(wsync_device_t dev) {
    const char *base = nullptr;
    switch (dev.type) {
    case WSYNC_DEVICE_CPU: base = "cpu"; break;
    case WSYNC_DEVICE_CUDA: base = "cuda"; break;
    case WSYNC_DEVICE_CUDA_HOST: base = "cuda_host"; break;
    case WSYNC_DEVICE_ROCM: base = "rocm"; break;
    case WSYNC_DEVICE_ROCM_HOST: base = "rocm_host"; break;
    case WSYNC_DEVICE_CUDA_MANAGED: base = "cuda_managed"; break;
    default: return "device(type=" + std::to_string(dev.type) + ")";
    }
    return std::string(base) + ":" + std::to_string(dev.index);
}

bool device_is_known(wsync_device_t dev) {
    switch (dev.type) {
    case WSYNC_DEVICE_CPU:
    case WSYNC_DEVICE_CUDA:
    case WSYNC_DEVICE_CUDA_HOST:
    case WSYNC_DEVICE_ROCM:
    case WSYNC_DEVICE_ROCM_HOST:
    case WSYNC_DEVICE_CUDA_MANAGED: return true;
    default: return false;
    }
}

bool device_is_host(wsync_device_t dev) {
    return dev.type == WSYNC_DEVICE_CPU || dev.type == WSYNC_DEVICE_CUDA_HOST ||
           dev.type == WSYNC_DEVICE_ROCM_HOST;
}

TensorMeta meta_from_descriptor(const wsync_tensor_t &t, std::size_t index, bool need_data) {
    auto bad = [&](const std::string &why) {
        fail(WSYNC_ERR_INVALID_ARGUMENT, tensor_label(index, t.name) + ": " + why);
    };
    TensorMeta m;
    if (!t.name) bad("name is NULL");
    std::size_t len = strnlen(t.name, WSYNC_MAX_NAME_BYTES + 1);
    if (len == 0) bad("name is empty");
    if (len > WSYNC_MAX_NAME_BYTES)
        bad("name is longer than " + std::to_string(WSYNC_MAX_NAME_BYTES) + " bytes");
    if (!wire::is_utf8(std::string_view(t.name, len))) bad("name is not valid UTF-8");
    if (need_data && !t.data) bad("data is NULL");
    // A code outside the header's list is a caller error, not a device some strategy lacks
    // (that is WSYNC_ERR_UNSUPPORTED, from the strategy). The planner never reads the device.
    if (need_data && !device_is_known(t.device))
        bad("device type " + std::to_string(t.device.type) + " is not a WSYNC_DEVICE_* code");
    if (t.flags != 0) bad("flags must be 0 on input");
    if (t.ndim < 0 || t.ndim > WSYNC_MAX_NDIM)
        bad("ndim " + std::to_string(t.ndim) + " is outside 0.." + std::to_string(WSYNC_MAX_NDIM));
    if (t.ndim > 0 && !t.shape) bad("shape is NULL");
    uint64_t esize = dtype_size(t.dtype);
    if (esize == 0) bad("unsupported dtype " + dtype_name(t.dtype));
    uint64_t elems = 1;
    for (int32_t d = 0; d < t.ndim; ++d) {
        if (t.shape[d] < 1)
            bad("shape[" + std::to_string(d) + "] = " + std::to_string(t.shape[d]) +
                (t.shape[d] == 0 ? ": zero-size tensors are not moved" : " is negative"));
        auto e = mul_u64(elems, uint64_t(t.shape[d]));
        if (!e) bad("shape product overflows 64 bits");
        elems = *e;
        m.shape[d] = t.shape[d];
    }
    auto bytes = mul_u64(elems, esize);
    if (!bytes || *bytes > (uint64_t(1) << 62)) bad("byte size overflows");
    if (t.strides) {
        // Must be the compact row-major layout; extents of 1 may carry any stride (torch does).
        int64_t expect = 1;
        for (int32_t d = t.ndim - 1; d >= 0; --d) {
            if (t.shape[d] != 1 && t.strides[d] != expect)
                bad("not contiguous: strides[" + std::to_string(d) + "] = " +
                    std::to_string(t.strides[d]) + ", row-major needs " + std::to_string(expect));
            expect *= t.shape[d];
        }
    }
    m.name.assign(t.name, len);
    m.dtype = t.dtype;
    m.ndim = t.ndim;
    m.nbytes = *bytes;
    return m;
}

std::vector<TensorMeta> metas_from_descriptors(const wsync_tensor_t *tensors, std::size_t count,
                                               bool need_data) {
    std::vector<TensorMeta> metas;
    // No array of descriptors is that long (and count * 2 below cannot overflow).
    if (count > metas.max_size() / 2)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::to_string(count) + " tensor descriptors are more than memory can hold");
    // Reserved in full: `seen` points into the names, which must not move.
    metas.reserve(count);
    std::unordered_set<std::string_view> seen;
    seen.reserve(count * 2);
    for (std::size_t i = 0; i < count; ++i) {
        metas.push_back(meta_from_descriptor(tensors[i], i, need_data));
        if (!seen.insert(metas.back().name).second)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 tensor_label(i, tensors[i].name) + ": duplicate name in one chunk");
    }
    return metas;
}

std::vector<TensorMeta> metas_from_chunk(const wsync_tensor_t *tensors, std::size_t count,
                                         bool need_data) {
    if (count == 0) fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk has no tensors (count is 0)");
    if (!tensors) fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk tensors is NULL");
    if (count > WSYNC_MAX_CHUNK_TENSORS)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             "chunk count " + std::to_string(count) + " exceeds the maximum of " +
                 std::to_string(WSYNC_MAX_CHUNK_TENSORS) +
                 " tensors per chunk (WSYNC_MAX_CHUNK_TENSORS); plan smaller chunks");
    return metas_from_descriptors(tensors, count, need_data);
}

uint64_t TensorTable::total_bytes() const {
    uint64_t total = 0;
    // Cannot overflow: decode_tensor_table and senders cap the total at 2^62.
    for (std::size_t i = 0; i < metas.size(); ++i) total += payload_bytes(i);
    return total;
}

void encode_tensor_table(const TensorTable &t, json &obj) {
    std::size_t n = t.metas.size();
    json names = json::array(), dtypes = json::array(), ndims = json::array(),
         shapes = json::array(), offsets = json::array();
    auto &na = names.get_ref<json::array_t &>();
    auto &da = dtypes.get_ref<json::array_t &>();
    auto &ha = ndims.get_ref<json::array_t &>();
    auto &sa = shapes.get_ref<json::array_t &>();
    auto &oa = offsets.get_ref<json::array_t &>();
    na.reserve(n);
    da.reserve(3 * n);
    ha.reserve(n);
    oa.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        const auto &m = t.metas[i];
        na.emplace_back(m.name);
        da.emplace_back(m.dtype.code);
        da.emplace_back(m.dtype.bits);
        da.emplace_back(m.dtype.lanes);
        ha.emplace_back(m.ndim);
        for (int32_t d = 0; d < m.ndim; ++d) sa.emplace_back(static_cast<uint64_t>(m.shape[d]));
        oa.emplace_back(t.offsets[i]);
    }
    obj["names"] = std::move(names);
    obj["dtypes"] = std::move(dtypes);
    obj["ndims"] = std::move(ndims);
    obj["shapes"] = std::move(shapes);
    obj["offsets"] = std::move(offsets);
    if (!t.checksums.empty()) {
        json sums = json::array();
        auto &ca = sums.get_ref<json::array_t &>();
        ca.reserve(n);
        for (uint64_t c : t.checksums) ca.emplace_back(c);
        obj[t.tree_sums ? "tree" : "xxh3"] = std::move(sums);
    }
    json tensor = json::array(), bytes = json::array(), base = json::array(),
         base_sum = json::array(), result_sum = json::array(), sums = json::array();
    bool any_tree = false;
    for (std::size_t i = 0; i < n; ++i) {
        if (!t.is_patch(i)) continue;
        const PatchInfo &p = t.patches[i];
        tensor.push_back(i);
        bytes.push_back(p.wire_bytes);
        base.push_back(p.base_version);
        base_sum.push_back(p.base_xxh3);
        result_sum.push_back(p.result_xxh3);
        sums.push_back(p.tree ? 1 : 0);
        any_tree = any_tree || p.tree;
    }
    if (!tensor.empty()) {
        obj["patches"] = {{"tensor", std::move(tensor)}, {"bytes", std::move(bytes)},
                          {"base", std::move(base)}, {"base_xxh3", std::move(base_sum)},
                          {"xxh3", std::move(result_sum)}};
        // Written only when some patch is tree-hashed, so host patches' requests stay as 0.5
        // wrote them.
        if (any_tree) obj["patches"]["sums"] = std::move(sums);
    }
    parts::encode(t, obj);
}

namespace {
// The optional "patches" column (docs/delta.md): which tensors are patches, and of what.
void decode_patches(const json &obj, TensorTable &t) {
    const SparseColumn c = read_sparse_column(obj, "patches", t.metas.size(),
                                              {"bytes", "base", "base_xxh3", "xxh3"});
    t.patches.assign(t.metas.size(), PatchInfo{});
    for (std::size_t k = 0; k < c.rows.size(); ++k) {
        const std::string at = c.at(k);
        PatchInfo &pi = t.patches[c.rows[k]];
        pi.wire_bytes = wire::as_uint((*c.cols[0])[k], at + " bytes", uint64_t(1) << 62);
        if (pi.wire_bytes == 0) wire::malformed(at + ": a patch has at least its header's bytes");
        pi.base_version = wire::as_uint((*c.cols[1])[k], at + " base", UINT64_MAX - 1);
        if (pi.base_version == 0) wire::malformed(at + ": base version 0 (versions start at 1)");
        pi.base_xxh3 = wire::as_uint((*c.cols[2])[k], at + " base_xxh3", UINT64_MAX);
        pi.result_xxh3 = wire::as_uint((*c.cols[3])[k], at + " xxh3", UINT64_MAX);
    }
    // "sums" (optional): which checksum each patch carries, 0 XXH3-64 of the tensor, 1 its
    // tree hash. A value this reader does not know is refused rather than checked wrongly.
    const json &p = obj.at("patches");
    if (p.contains("sums")) {
        const auto &sums = wire::array_field(p, "sums", "tensor table: patches", t.metas.size());
        if (sums.size() != c.rows.size())
            wire::malformed("tensor table: patches: \"sums\" has " + std::to_string(sums.size()) +
                            " entries for " + std::to_string(c.rows.size()) + " patches");
        for (std::size_t k = 0; k < c.rows.size(); ++k)
            t.patches[c.rows[k]].tree =
                wire::as_uint(sums[k], c.at(k) + " sums (0: XXH3-64, 1: tree hash)", 1) == 1;
    }
}
}  // namespace

SparseColumn read_sparse_column(const json &obj, const char *key, std::size_t n,
                                std::initializer_list<const char *> names) {
    SparseColumn c;
    c.what = std::string("tensor table: ") + key;
    const json &p = wire::object_field(obj, key, "tensor table");
    const auto &tensor = wire::array_field(p, "tensor", c.what, n);
    const std::size_t m = tensor.size();
    if (m == 0) wire::malformed(c.what + ": no entries");
    for (const char *name : names) {
        c.cols.push_back(&wire::array_field(p, name, c.what, n));
        if (c.cols.back()->size() != m)
            wire::malformed(c.what + ": '" + name + "' disagrees with 'tensor' on the entry count");
    }
    for (std::size_t k = 0; k < m; ++k) {
        const uint64_t i = wire::as_uint(tensor[k], c.at(k) + " tensor", n - 1);
        if (k > 0 && i <= c.rows.back())
            wire::malformed(c.at(k) + ": tensor indices are not increasing");
        c.rows.push_back(static_cast<std::size_t>(i));
    }
    return c;
}

TensorTable TensorTable::as_wire() const {
    TensorTable w = *this;
    w.whole = metas;
    for (std::size_t i = 0; i < metas.size(); ++i) {
        if (is_part(i)) {
            TensorMeta &m = w.metas[i];
            m.ndim = 1;
            std::fill(std::begin(m.shape), std::end(m.shape), 0);
            m.shape[0] = static_cast<int64_t>(parts[i].bytes / dtype_size(m.dtype));
            m.nbytes = parts[i].bytes;
        }
        if (!is_patch(i)) continue;
        TensorMeta &m = w.metas[i];
        m.dtype = {WSYNC_DTYPE_UINT, 8, 1};
        m.ndim = 1;
        std::fill(std::begin(m.shape), std::end(m.shape), 0);
        m.shape[0] = static_cast<int64_t>(patches[i].wire_bytes);
        m.nbytes = patches[i].wire_bytes;
    }
    return w;
}

TensorTable decode_tensor_table(json &obj) {
    auto &names = wire::array_field(obj, "names", "tensor table", WSYNC_MAX_CHUNK_TENSORS);
    std::size_t n = names.size();
    // n == 0 is a commit without data (wsync_sender_commit): a manifest and no tensors.
    const auto &dtypes = wire::array_field(obj, "dtypes", "tensor table", 3 * n);
    const auto &ndims = wire::array_field(obj, "ndims", "tensor table", n);
    const auto &shapes =
        wire::array_field(obj, "shapes", "tensor table", std::size_t(WSYNC_MAX_NDIM) * n);
    const auto &offsets = wire::array_field(obj, "offsets", "tensor table", n);
    if (dtypes.size() != 3 * n || ndims.size() != n || offsets.size() != n)
        wire::malformed("tensor table: columns disagree on the tensor count (names " +
                        std::to_string(n) + ", dtypes/3 " + std::to_string(dtypes.size() / 3) +
                        ", ndims " + std::to_string(ndims.size()) + ", offsets " +
                        std::to_string(offsets.size()) + ")");
    // "xxh3" or "tree" (never both): each entry's checksum, of one kind for the whole table.
    const json::array_t *sums = nullptr;
    const bool tree = obj.contains("tree");
    if (tree && obj.contains("xxh3"))
        wire::malformed("tensor table: both 'xxh3' and 'tree' checksums (a table carries one kind)");
    const char *sums_key = tree ? "tree" : "xxh3";
    if (obj.contains(sums_key)) {
        sums = &wire::array_field(obj, sums_key, "tensor table", n);
        if (sums->size() != n)
            wire::malformed(std::string("tensor table: '") + sums_key + "' has the wrong length");
    }

    TensorTable t;
    t.metas.resize(n);
    t.offsets.resize(n);
    if (sums) t.checksums.resize(n);
    t.tree_sums = tree;
    std::unordered_set<std::string_view> seen;
    seen.reserve(n * 2);
    std::size_t si = 0;
    uint64_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
        auto where = [&](const char *col) {
            return "tensor table: " + std::string(col) + " of tensor " + std::to_string(i);
        };
        TensorMeta &m = t.metas[i];
        if (!names[i].is_string()) wire::malformed(where("name") + " is not a string");
        auto &name = names[i].get_ref<std::string &>();
        if (name.empty()) wire::malformed(where("name") + " is empty");
        if (name.size() > WSYNC_MAX_NAME_BYTES)
            wire::malformed(where("name") + " is too long (" + std::to_string(name.size()) +
                            " bytes, more than " + std::to_string(WSYNC_MAX_NAME_BYTES) + ")");
        if (name.find('\0') != std::string::npos)
            wire::malformed(where("name") + " contains NUL: '" + wire::printable(name) + "'");
        if (!wire::is_utf8(name))
            wire::malformed(where("name") + " is not valid UTF-8: '" + wire::printable(name) + "'");
        m.name = std::move(name);  // the DOM is ours and read once: no copy of every name
        if (!seen.insert(m.name).second)
            wire::malformed("tensor table: duplicate tensor name '" + m.name + "'");
        m.dtype.code = static_cast<uint8_t>(wire::as_uint(dtypes[3 * i], where("dtype"), 255));
        m.dtype.bits = static_cast<uint8_t>(wire::as_uint(dtypes[3 * i + 1], where("dtype"), 255));
        m.dtype.lanes =
            static_cast<uint16_t>(wire::as_uint(dtypes[3 * i + 2], where("dtype"), 65535));
        uint64_t esize = dtype_size(m.dtype);
        if (esize == 0) wire::malformed(where("dtype") + " is unsupported: " + dtype_name(m.dtype));
        m.ndim = static_cast<int32_t>(wire::as_uint(ndims[i], where("ndim"), WSYNC_MAX_NDIM));
        uint64_t elems = 1;
        for (int32_t d = 0; d < m.ndim; ++d, ++si) {
            if (si >= shapes.size()) wire::malformed(where("shape") + ": 'shapes' is too short");
            uint64_t e = wire::as_uint(shapes[si], where("shape"), uint64_t(INT64_MAX));
            if (e == 0) wire::malformed(where("shape") + " has a zero extent");
            m.shape[d] = static_cast<int64_t>(e);
            auto p = mul_u64(elems, e);
            if (!p) wire::malformed(where("shape") + ": element count overflows");
            elems = *p;
        }
        auto bytes = mul_u64(elems, esize);
        if (!bytes || *bytes > (uint64_t(1) << 62))
            wire::malformed(where("shape") + ": byte size overflows");
        m.nbytes = *bytes;
        auto sum = add_u64(total, m.nbytes);
        if (!sum || *sum > (uint64_t(1) << 62))
            wire::malformed(where("shape") + ": total chunk size overflows");
        total = *sum;
        t.offsets[i] = wire::as_uint(offsets[i], where("offset"), UINT64_MAX);
        if (sums) t.checksums[i] = wire::as_uint((*sums)[i], where(sums_key), UINT64_MAX);
    }
    if (si != shapes.size())
        wire::malformed("tensor table: 'shapes' has " + std::to_string(shapes.size()) +
                        " extents but the ndims add up to " + std::to_string(si));
    if (obj.contains("patches")) decode_patches(obj, t);
    parts::decode(obj, t);
    return t;
}

uint64_t checksum_bytes(const void *data, uint64_t n) { return copy::hash_bytes(data, n); }

}  // namespace wsync
