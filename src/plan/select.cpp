#include "plan/select.hpp"

#include <algorithm>
#include <cinttypes>

#include "error.hpp"
#include "wire.hpp"

namespace wsync::select {
namespace {

constexpr std::size_t kMaxEntries = 1 << 16;
constexpr uint64_t kMaxRanks = 1 << 20;

struct Parser {
    std::string owner;
    [[noreturn]] void bad(const std::string &key, const std::string &why) const {
        fail(WSYNC_ERR_INVALID_ARGUMENT, owner + ": option '" + key + "' " + why);
    }
    uint64_t uint(const json &e, const char *name, const std::string &key) const {
        const json &v = e.at(name);
        if (!v.is_number_unsigned())
            bad(key, std::string("has \"") + name + "\" that is not a non-negative integer");
        return v.get<uint64_t>();
    }
    std::string name(const json &v, const std::string &key) const {
        if (!v.is_string()) bad(key, "must name a tensor with a string");
        const std::string &s = v.get_ref<const std::string &>();
        if (s.empty() || s.size() > WSYNC_MAX_NAME_BYTES || s.find('\0') != std::string::npos)
            bad(key, "names no valid tensor (1.." + std::to_string(WSYNC_MAX_NAME_BYTES) +
                         " bytes, no NUL): \"" + wire::printable(s, 64) + "\"");
        return s;
    }
};

std::string quoted(const std::string &name) { return "'" + wire::printable(name, 80) + "'"; }

std::string shape_text(int32_t ndim, const int64_t *shape) {
    std::string s = "[";
    for (int32_t d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    return s + "]";
}

}  // namespace

std::shared_ptr<const Spec> parse(const json &value, const std::string &rest, const std::string &owner) {
    Parser p{owner};
    auto spec = std::make_shared<Spec>();
    spec->rest_whole = rest == "whole";
    if (!value.is_array()) p.bad("select", "must be an array of entries ({\"tensor\": name, ...})");
    if (value.empty()) p.bad("select", "lists no tensor (leave it out to pull every tensor)");
    if (value.size() > kMaxEntries) p.bad("select", "has more than " + std::to_string(kMaxEntries) + " entries");
    static const char *const kKeys[] = {"tensor", "tensors", "offset", "bytes", "rank", "ranks", "dtype", "shape"};
    for (std::size_t k = 0; k < value.size(); ++k) {
        const json &e = value[k];
        const std::string key = "select[" + std::to_string(k) + "]";
        if (!e.is_object()) p.bad(key, "must be an object ({\"tensor\": name, ...})");
        for (auto it = e.begin(); it != e.end(); ++it)
            if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char *n) { return it.key() == n; }) ==
                std::end(kKeys))
                p.bad(key, "has unknown key '" + wire::printable(it.key(), 64) +
                               "' (known: tensor, tensors, offset, bytes, rank, ranks, dtype, shape)");
        Entry proto;
        proto.key = key;
        const bool range = e.contains("offset") || e.contains("bytes");
        const bool shard = e.contains("rank") || e.contains("ranks");
        if (range && shard) p.bad(key, "has both a byte range (offset, bytes) and a shard (rank, ranks)");
        if (range) {
            if (!e.contains("offset") || !e.contains("bytes")) p.bad(key, "needs both \"offset\" and \"bytes\"");
            proto.kind = Entry::Kind::Range;
            proto.offset = p.uint(e, "offset", key);
            proto.bytes = p.uint(e, "bytes", key);
            if (proto.bytes == 0) p.bad(key, "has \"bytes\": 0 (a range has at least one byte)");
            if (!add_u64(proto.offset, proto.bytes)) p.bad(key, "has a range whose end overflows");
        } else if (shard) {
            if (!e.contains("rank") || !e.contains("ranks")) p.bad(key, "needs both \"rank\" and \"ranks\"");
            proto.kind = Entry::Kind::Shard;
            proto.rank = p.uint(e, "rank", key);
            proto.ranks = p.uint(e, "ranks", key);
            if (proto.ranks == 0 || proto.ranks > kMaxRanks || proto.rank >= proto.ranks)
                p.bad(key, "has rank " + std::to_string(proto.rank) + " of " + std::to_string(proto.ranks) +
                               " ranks (needs 1 <= ranks <= " + std::to_string(kMaxRanks) + ", rank < ranks)");
        }
        if (e.contains("dtype")) {
            const json &d = e["dtype"];
            if (!d.is_string() || d.get_ref<const std::string &>().empty() || d.get_ref<const std::string &>().size() > 64)
                p.bad(key, "has \"dtype\" that is not a dtype name such as \"bfloat16\"");
            proto.dtype = d.get<std::string>();
        }
        if (e.contains("shape")) {
            const json &s = e["shape"];
            if (!s.is_array() || s.size() > WSYNC_MAX_NDIM)
                p.bad(key, "has \"shape\" that is not an array of at most " + std::to_string(WSYNC_MAX_NDIM) + " sizes");
            proto.has_shape = true;
            for (const json &d : s) {
                if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
                    p.bad(key, "has \"shape\" with a size that is not a non-negative integer");
                proto.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
            }
        }
        const bool one = e.contains("tensor"), many = e.contains("tensors");
        if (one == many) p.bad(key, "needs exactly one of \"tensor\" (a name) and \"tensors\" (a list of names)");
        if (one) {
            Entry en = proto;
            en.tensor = p.name(e["tensor"], key);
            spec->entries.push_back(std::move(en));
        } else {
            const json &list = e["tensors"];
            if (!list.is_array() || list.empty()) p.bad(key, "has \"tensors\" that is not a non-empty array of names");
            for (std::size_t j = 0; j < list.size(); ++j) {
                Entry en = proto;
                en.key = key + ".tensors[" + std::to_string(j) + "]";
                en.tensor = p.name(list[j], en.key);
                spec->entries.push_back(std::move(en));
            }
        }
        if (spec->entries.size() > kMaxEntries)
            p.bad("select", "names more than " + std::to_string(kMaxEntries) + " tensors");
    }
    for (std::size_t i = 0; i < spec->entries.size(); ++i) spec->by_name[spec->entries[i].tensor].push_back(i);
    for (auto &kv : spec->by_name) {
        std::vector<std::size_t> &idx = kv.second;
        if (idx.size() == 1) continue;
        for (std::size_t i : idx)
            if (spec->entries[i].kind != Entry::Kind::Range)
                p.bad(spec->entries[i].key, "selects tensor " + quoted(kv.first) +
                                                (spec->entries[i].kind == Entry::Kind::Whole ? " whole" : " by shard") +
                                                ", and another entry names it too (only byte ranges may "
                                                "share a tensor)");
        std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
            return spec->entries[a].offset < spec->entries[b].offset;
        });
        for (std::size_t j = 1; j < idx.size(); ++j) {
            const Entry &a = spec->entries[idx[j - 1]], &b = spec->entries[idx[j]];
            if (b.offset < a.offset + a.bytes)
                p.bad(b.key, "overlaps " + a.key + " (both select bytes of tensor " + quoted(kv.first) + ")");
        }
    }
    return spec;
}

namespace {

// The bytes [lo, hi) of the whole tensor that entry `e` selects, once its meta is known;
// WSYNC_ERR_MISMATCH naming the tensor, the entry and the version when they conflict.
std::pair<uint64_t, uint64_t> resolve(const Entry &e, const TensorMeta &m, const std::string &what,
                                      uint64_t version) {
    const std::string of = "tensor " + quoted(m.name) + " of version " + std::to_string(version);
    if (!e.dtype.empty() && dtype_name(m.dtype) != e.dtype)
        fail(WSYNC_ERR_MISMATCH, what + ": " + of + " is " + dtype_name(m.dtype) + ", but " + e.key +
                                     " expects " + wire::printable(e.dtype, 64) + "; nothing of it was fetched");
    if (e.has_shape && (std::size_t(m.ndim) != e.shape.size() ||
                        !std::equal(e.shape.begin(), e.shape.end(), m.shape)))
        fail(WSYNC_ERR_MISMATCH, what + ": " + of + " has shape " + shape_text(m.ndim, m.shape) + ", but " +
                                     e.key + " expects " +
                                     shape_text(int32_t(e.shape.size()), e.shape.data()) +
                                     "; nothing of it was fetched");
    const uint64_t es = dtype_size(m.dtype);
    switch (e.kind) {
    case Entry::Kind::Whole: return {0, m.nbytes};
    case Entry::Kind::Range:
        if (e.offset > m.nbytes || e.bytes > m.nbytes - e.offset)
            fail(WSYNC_ERR_MISMATCH,
                 what + ": " + e.key + " selects bytes [" + std::to_string(e.offset) + ", " +
                     std::to_string(e.offset + e.bytes) + ") of " + of + ", which has " +
                     std::to_string(m.nbytes) + " bytes (shape " + shape_text(m.ndim, m.shape) + ", " +
                     dtype_name(m.dtype) + "); nothing of it was fetched");
        if (e.offset % es || e.bytes % es)
            fail(WSYNC_ERR_MISMATCH, what + ": " + e.key + " selects bytes [" + std::to_string(e.offset) +
                                         ", " + std::to_string(e.offset + e.bytes) + ") of " + of +
                                         ", which are not whole elements of its dtype (" +
                                         dtype_name(m.dtype) + ", " + std::to_string(es) +
                                         " bytes); nothing of it was fetched");
        return {e.offset, e.offset + e.bytes};
    case Entry::Kind::Shard: {
        if (m.ndim < 1 || uint64_t(m.shape[0]) % e.ranks != 0)
            fail(WSYNC_ERR_MISMATCH, what + ": " + e.key + " takes rank " + std::to_string(e.rank) + " of " +
                                         std::to_string(e.ranks) + " along dimension 0 of " + of +
                                         ", whose shape is " + shape_text(m.ndim, m.shape) +
                                         (m.ndim < 1 ? " (no dimension 0)"
                                                     : ": dimension 0 does not divide by " +
                                                           std::to_string(e.ranks)) +
                                         "; nothing of it was fetched");
        const uint64_t rows = uint64_t(m.shape[0]);
        if (rows == 0) return {0, 0};
        const uint64_t row_bytes = m.nbytes / rows, per = rows / e.ranks * row_bytes;
        return {e.rank * per, (e.rank + 1) * per};
    }
    }
    return {0, 0};
}

}  // namespace

Plan Version::plan(const Spec &spec, const ChunkHeader &h, const TensorTable &full, const std::string &what) {
    std::unordered_set<std::string> seen = seen_;
    Plan p;
    const bool sums = !full.checksums.empty() || full.sums_follow;
    p.view.tree_sums = full.tree_sums;
    p.view.sums_follow = full.sums_follow;
    bool any_part = false;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (std::size_t i = 0; i < full.metas.size(); ++i) {
        const TensorMeta &m = full.metas[i];
        const uint64_t po = full.is_part(i) ? full.parts[i].offset : 0, pe = po + full.payload_bytes(i);
        ranges.clear();
        auto it = spec.by_name.find(m.name);
        if (it == spec.by_name.end()) {
            if (!spec.rest_whole) continue;
            ranges.emplace_back(po, pe);
        } else {
            seen.insert(m.name);
            for (std::size_t idx : it->second) {
                auto r = resolve(spec.entries[idx], m, what, h.version);
                r.first = std::max(r.first, po);
                r.second = std::min(r.second, pe);
                if (r.first < r.second || (m.nbytes == 0 && r.first == r.second)) ranges.push_back(r);
            }
        }
        if (!ranges.empty() && full.is_patch(i))
            fail(WSYNC_ERR_UNSUPPORTED, what + ": tensor " + quoted(m.name) + " of version " +
                                            std::to_string(h.version) +
                                            " is a patch (delta sync), which a selection cannot take");
        for (auto [lo, hi] : ranges) {
            const bool whole_tensor = lo == 0 && hi == m.nbytes;
            const bool whole_entry = lo == po && hi == pe;
            p.view.metas.push_back(m);
            p.view.parts.push_back(whole_tensor ? PartInfo{} : PartInfo{lo, hi - lo});
            any_part = any_part || !whole_tensor;
            p.view.offsets.push_back(full.offsets[i] + (lo - po));
            if (full.sums_follow) p.view.follow_from.push_back(whole_entry ? i : TensorTable::kNoSum);
            else if (sums) p.view.checksums.push_back(whole_entry ? full.checksums[i] : 0);
            p.unverified.push_back(sums && !whole_entry);
            p.fetch.push_back(ByteRange{full.offsets[i] + (lo - po), hi - lo});
        }
    }
    if (!any_part) p.view.parts.clear();
    if (h.last) {
        for (const Entry &e : spec.entries)
            if (!seen.count(e.tensor))
                fail(WSYNC_ERR_MISMATCH,
                     what + ": tensor " + quoted(e.tensor) + " (" + e.key + ") is not in version " +
                         std::to_string(h.version) + ", which this chunk commits (" +
                         std::to_string(h.manifest.tensors) + " tensors in " +
                         std::to_string(h.manifest.chunks) + " chunks); nothing of this chunk was fetched");
    }
    seen_ = std::move(seen);
    return p;
}

}  // namespace wsync::select
