// Landing: the plan of a chunk, its scatter, and its checksums as the bytes land (land.hpp).
#include "transport/ucx/land.hpp"

#include <algorithm>

#include "copy/copy.hpp"

namespace wsync::ucx {

void Lander::set(std::vector<Landing> dests) {
    dests_ = std::move(dests);
    by_name_.clear();
    for (std::size_t d = 0; d < dests_.size(); ++d) {
        auto [it, fresh] = by_name_.emplace(dests_[d].meta.name, static_cast<long>(d));
        if (!fresh) it->second = -1;  // several destinations (a tied weight): apply copies
    }
    // Destinations of different names that share memory (an engine that aliases two tensors)
    // land neither: the puller would write one while the loader hashes the other.
    std::vector<std::size_t> order(dests_.size());
    for (std::size_t d = 0; d < order.size(); ++d) order[d] = d;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return dests_[a].data < dests_[b].data; });
    const uint8_t *reach = nullptr;  // the furthest end of the destinations so far
    std::size_t reacher = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
        const Landing &d = dests_[order[k]];
        if (k && d.data < reach) {
            by_name_[d.meta.name] = -1;
            by_name_[dests_[reacher].meta.name] = -1;
        }
        if (!k || d.data + d.len > reach) reach = d.data + d.len, reacher = order[k];
    }
    clear();
}

void Lander::clear() {
    entries_.clear();
    of_.clear();
    pieces_.clear();
    got_.clear();
    whole_ = cursor_ = 0;
    hash_ = false;
}

void Lander::plan(const TensorTable &table, bool hash, std::vector<std::pair<uint64_t, uint64_t>> pieces) {
    clear();
    const std::size_t n = table.metas.size();
    // Entries whose bytes overlap in the chunk (no sender of ours makes them; a faulty trainer
    // could) land nothing: each byte of a piece must have one place to go.
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (std::size_t i = 0; i < n; ++i)
        if (table.wire_bytes(i)) spans.emplace_back(table.offsets[i], table.offsets[i] + table.wire_bytes(i));
    std::sort(spans.begin(), spans.end());
    for (std::size_t k = 1; k < spans.size(); ++k)
        if (spans[k].first < spans[k - 1].second) return;
    of_.assign(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
        const uint64_t bytes = table.payload_bytes(i);
        if (table.is_patch(i) || bytes == 0) continue;
        auto d = by_name_.find(table.metas[i].name);
        if (d == by_name_.end() || d->second < 0) continue;
        const Landing &to = dests_[static_cast<std::size_t>(d->second)];
        const TensorMeta &m = table.tensor(i);  // a part's whole tensor, as the destination describes it
        if (!same_dtype(to.meta.dtype, m.dtype) || !same_shape(to.meta, m))
            continue;  // wsync_recv_apply refuses it by name; nothing lands in it
        const uint64_t at = table.is_part(i) ? table.parts[i].offset : 0;  // the entry's bytes in the tensor
        if (at < to.offset || at + bytes > to.offset + to.len) continue;  // a shard that does not hold it all
        Entry e;
        e.entry = i;
        e.lo = table.offsets[i];
        e.n = bytes;
        e.dst = to.data + (at - to.offset);
        e.sums.resize((bytes + copy::kTreePieceBytes - 1) / copy::kTreePieceBytes);
        entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(), [](const Entry &a, const Entry &b) { return a.lo < b.lo; });
    for (std::size_t k = 0; k < entries_.size(); ++k) of_[entries_[k].entry] = static_cast<long>(k);
    hash_ = hash;
    pieces_ = std::move(pieces);
    got_.assign(pieces_.size(), 0);
}

std::vector<const uint8_t *> Lander::where() const {
    std::vector<const uint8_t *> at(of_.size(), nullptr);
    for (const Entry &e : entries_) at[e.entry] = e.dst;
    return at;
}

std::vector<Stream::Run> Lander::scatter(uint64_t at, uint64_t n, uint8_t *buffer) const {
    std::vector<Stream::Run> runs;
    const uint64_t first = at, end = at + n;
    auto gap = [&](uint64_t upto) {
        if (upto > at) runs.push_back({buffer + (at - first), upto - at});
        at = std::max(at, upto);
    };
    auto e = std::upper_bound(entries_.begin(), entries_.end(), at,
                              [](uint64_t x, const Entry &y) { return x < y.lo + y.n; });
    for (; e != entries_.end() && e->lo < end; ++e) {
        gap(e->lo);
        const uint64_t upto = std::min(end, e->lo + e->n);
        runs.push_back({e->dst + (at - e->lo), upto - at});
        at = upto;
    }
    gap(end);
    return runs;
}

void Lander::hash_next(Entry &e) {
    const uint64_t lo = e.done * copy::kTreePieceBytes, hi = std::min(lo + copy::kTreePieceBytes, e.n);
    e.sums[e.done++] = copy::hash_bytes(e.dst + lo, hi - lo);
}

void Lander::landed(std::size_t k, uint64_t upto) {
    got_[k] = upto;
    if (!hash_) return;
    while (whole_ < pieces_.size() && got_[whole_] == pieces_[whole_].second) ++whole_;
    const uint64_t prefix = whole_ < pieces_.size() ? pieces_[whole_].first + got_[whole_]
                                                    : pieces_.back().first + pieces_.back().second;
    std::lock_guard<std::mutex> lk(mu_);
    for (; cursor_ < entries_.size(); ++cursor_) {
        Entry &e = entries_[cursor_];
        while (e.done < e.sums.size()) {
            if (e.lo + std::min((e.done + 1) * copy::kTreePieceBytes, e.n) > prefix) return;
            hash_next(e);
        }
    }
}

bool Lander::sum(std::size_t i, uint64_t *out) {
    if (!hash_ || i >= of_.size() || of_[i] < 0) return false;
    std::lock_guard<std::mutex> lk(mu_);
    Entry &e = entries_[static_cast<std::size_t>(of_[i])];
    while (e.done < e.sums.size()) hash_next(e);  // landed out of order: hashed here, from memory
    *out = copy::combine_piece_hashes(e.sums.data(), e.sums.size());
    return true;
}

}  // namespace wsync::ucx
