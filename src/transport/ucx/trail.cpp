// Checksums that follow the bytes: the trainer hashes each piece as it is sent (trail.hpp).
#include "transport/ucx/trail.hpp"

#include <algorithm>
#include <numeric>

#include "copy/copy.hpp"

namespace wsync::ucx {

Trail::Trail(const uint8_t *base, const TensorTable &table) : base_(base) {
    const std::size_t n = table.metas.size();
    first_.resize(n);
    count_.resize(n);
    empty_.assign(n, 0);
    // Entries in the order of their bytes (the sender lays them out in table order; sorting
    // keeps written() right for any layout).
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return table.offsets[a] < table.offsets[b]; });
    for (std::size_t i : order) {
        const uint64_t lo = table.offsets[i], bytes = table.metas[i].nbytes;
        first_[i] = pieces_.size();
        count_[i] = (bytes + copy::kTreePieceBytes - 1) / copy::kTreePieceBytes;
        if (!bytes) empty_[i] = copy::tree_hash(base + lo, 0);
        for (uint64_t o = 0; o < bytes; o += copy::kTreePieceBytes)
            pieces_.push_back(Piece{lo + o, lo + std::min(o + copy::kTreePieceBytes, bytes)});
    }
    hash_.assign(pieces_.size(), 0);
    done_.assign(pieces_.size(), 0);
}

void Trail::hash(std::size_t k) {
    hash_[k] = copy::hash_bytes(base_ + pieces_[k].lo, pieces_[k].hi - pieces_[k].lo);
    done_[k] = 1;
    ++hashed_;
}

void Trail::written(uint32_t to, uint64_t lo, uint64_t hi) {
    auto r = std::find_if(runs_.begin(), runs_.end(), [&](const Run &x) { return x.to == to; });
    if (r == runs_.end()) r = runs_.insert(runs_.end(), Run{to, lo, lo});
    if (lo == r->hi && hi >= lo) r->hi = hi;  // one after the other: the run goes on
    else r->lo = lo, r->hi = hi;
    // The pieces that end inside (lo, hi] and begin inside the run.
    auto k = std::upper_bound(pieces_.begin(), pieces_.end(), lo, [](uint64_t x, const Piece &p) { return x < p.hi; });
    for (; k != pieces_.end() && k->hi <= hi; ++k) {
        const std::size_t at = static_cast<std::size_t>(k - pieces_.begin());
        if (k->lo >= r->lo && !done_[at]) hash(at);
    }
}

bool Trail::ready(std::size_t first, std::size_t count) const {
    for (std::size_t i = first; i < first + count && i < first_.size(); ++i)
        for (std::size_t k = first_[i]; k < first_[i] + count_[i]; ++k)
            if (!done_[k]) return false;
    return true;
}

std::vector<uint8_t> Trail::sums(std::size_t first, std::size_t count) {
    std::vector<uint8_t> out(count * 8);
    for (std::size_t j = 0; j < count; ++j) {
        const std::size_t i = first + j;
        uint64_t sum = empty_[i];
        if (count_[i]) {
            for (std::size_t k = first_[i]; k < first_[i] + count_[i]; ++k)
                if (!done_[k]) hash(k);
            sum = copy::combine_piece_hashes(hash_.data() + first_[i], count_[i]);
        }
        for (int b = 0; b < 8; ++b) out[j * 8 + b] = static_cast<uint8_t>(sum >> (8 * b));
    }
    return out;
}

}  // namespace wsync::ucx
