#include "plan/parts.hpp"

#include "error.hpp"
#include "wire.hpp"

namespace wsync::parts {

PartInfo from_caller(const wsync_part_t &p, const TensorMeta &m, std::size_t i) {
    if (p.bytes == 0) {
        if (p.offset != 0)
            fail(WSYNC_ERR_INVALID_ARGUMENT, tensor_label(i, m.name.c_str()) +
                                                 ": part with 0 bytes (the whole tensor) at "
                                                 "offset " + std::to_string(p.offset));
        return PartInfo{};
    }
    const uint64_t esize = dtype_size(m.dtype);
    if (p.offset > m.nbytes || p.bytes > m.nbytes - p.offset || p.offset % esize != 0 ||
        p.bytes % esize != 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             tensor_label(i, m.name.c_str()) + ": part [" + std::to_string(p.offset) + ", +" +
                 std::to_string(p.bytes) + ") is outside its " + std::to_string(m.nbytes) +
                 " bytes or not a multiple of its element size (" + std::to_string(esize) + ")");
    if (p.offset == 0 && p.bytes == m.nbytes) return PartInfo{};
    return PartInfo{p.offset, p.bytes};
}

void take(TensorTable &table, const wsync_part_t *parts) {
    if (!parts) return;
    table.parts.resize(table.metas.size());
    bool any = false;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        table.parts[i] = from_caller(parts[i], table.metas[i], i);
        any = any || table.is_part(i);
    }
    if (!any) table.parts.clear();
}

const wsync_tensor_t *to_wire(TensorTable &table, const wsync_tensor_t *tensors, Wire &w) {
    const std::size_t n = table.metas.size();
    w.descs.assign(tensors, tensors + n);
    w.shapes.assign(n, 0);
    w.logical = table.metas;
    for (std::size_t i = 0; i < n; ++i) {
        if (!table.is_part(i)) continue;
        wsync_tensor_t &d = w.descs[i];
        w.shapes[i] = static_cast<int64_t>(table.parts[i].bytes / dtype_size(d.dtype));
        d.data = static_cast<uint8_t *>(d.data) + table.parts[i].offset;
        d.shape = &w.shapes[i];
        d.strides = nullptr;
        d.ndim = 1;
    }
    table.metas = table.as_wire().metas;
    return w.descs.data();
}

void from_wire(TensorTable &table, Wire &w) {
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        if (!table.is_part(i)) continue;
        TensorMeta whole = w.logical[i];
        const uint64_t was = dtype_size(whole.dtype), now = dtype_size(table.metas[i].dtype);
        if (was != now || whole.dtype.code != table.metas[i].dtype.code) {
            // The transport cast the part (float32 -> bfloat16): the same elements, other bytes.
            PartInfo &p = table.parts[i];
            p.offset = p.offset / was * now;
            p.bytes = table.metas[i].nbytes;
            whole.nbytes = whole.nbytes / was * now;
            whole.dtype = table.metas[i].dtype;
        }
        table.metas[i] = std::move(whole);
    }
}

void encode(const TensorTable &t, json &obj) {
    json tensor = json::array(), offset = json::array(), bytes = json::array();
    for (std::size_t i = 0; i < t.metas.size(); ++i) {
        if (!t.is_part(i)) continue;
        tensor.push_back(i);
        offset.push_back(t.parts[i].offset);
        bytes.push_back(t.parts[i].bytes);
    }
    if (!tensor.empty())
        obj["parts"] = {{"tensor", std::move(tensor)}, {"offset", std::move(offset)},
                        {"bytes", std::move(bytes)}};
}

void decode(const json &obj, TensorTable &t) {
    if (!obj.contains("parts")) return;
    const SparseColumn c = read_sparse_column(obj, "parts", t.metas.size(), {"offset", "bytes"});
    t.parts.assign(t.metas.size(), PartInfo{});
    for (std::size_t k = 0; k < c.rows.size(); ++k) {
        const std::string at = c.at(k);
        const std::size_t i = c.rows[k];
        const auto &offset = *c.cols[0];
        const auto &bytes = *c.cols[1];
        const TensorMeta &meta = t.metas[i];
        const uint64_t esize = dtype_size(meta.dtype);
        PartInfo &pi = t.parts[i];
        pi.offset = wire::as_uint(offset[k], at + " offset", meta.nbytes - 1);
        pi.bytes = wire::as_uint(bytes[k], at + " bytes", meta.nbytes - pi.offset);
        if (pi.bytes == 0 || pi.bytes == meta.nbytes || pi.offset % esize || pi.bytes % esize)
            wire::malformed(at + ": range [" + std::to_string(pi.offset) + ", +" +
                            std::to_string(pi.bytes) + ") of '" + meta.name +
                            "' is empty, the whole tensor, or not whole elements");
        if (!t.patches.empty() && t.patches[i].wire_bytes != 0)
            wire::malformed(at + ": '" + meta.name + "' is both a part and a patch");
    }
}

void Tracker::add(const TensorTable &t, wsync_status_t status, const std::string &where) {
    if (open_.empty() && t.parts.empty()) return;
    // All or nothing: a refused chunk leaves the record as it was.
    std::unordered_map<std::string, uint64_t> open = open_;
    for (std::size_t i = 0; i < t.metas.size(); ++i) {
        const std::string &name = t.metas[i].name;
        auto it = open.find(name);
        if (!t.is_part(i)) {
            if (it != open.end())
                fail(status, where + ": tensor '" + name + "' came whole while its parts were " +
                                 "still arriving (next byte " + std::to_string(it->second) + ")");
            continue;
        }
        const PartInfo &p = t.parts[i];
        const uint64_t expect = it == open.end() ? 0 : it->second;
        if (p.offset != expect)
            fail(status, where + ": part of tensor '" + name + "' starts at byte " +
                             std::to_string(p.offset) + ", but its next part must start at " +
                             std::to_string(expect) + " (parts out of order or missing)");
        const uint64_t end = p.offset + p.bytes;
        if (end == t.metas[i].nbytes)
            open.erase(name);
        else
            open[name] = end;
    }
    open_ = std::move(open);
}

void Tracker::require_complete(wsync_status_t status, const std::string &where) const {
    if (open_.empty()) return;
    const auto &e = *open_.begin();
    fail(status, where + ": tensor '" + e.first + "' is split and only its first " +
                     std::to_string(e.second) + " bytes arrived before the version's commit (" +
                     std::to_string(open_.size()) + " split tensor(s) incomplete)");
}

}  // namespace wsync::parts
