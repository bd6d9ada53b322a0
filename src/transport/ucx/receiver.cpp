#include "transport/ucx/receiver_state.hpp"

#include <set>

namespace wsync::ucx {

wsync_status_t UcxReceiver::settle(const ChunkHeader &h, wsync_status_t outcome, std::string *message) noexcept {
    // A chunk pulled in pieces is acknowledged only once every piece has answered: the trainer
    // holds its lease until then, and no receive may still land in the buffer the next chunk takes.
    auto [pulled, why] = finish_pull();
    if (pulled != WSYNC_OK && outcome == WSYNC_OK) {
        *message = std::move(why);
        outcome = pulled;
    }
    if (!dev_) return outcome;
    try {
        gpu::Device::Scope scope(*dev_);
        loaded_->record(loader_);
        gpu::poll_until([&] { return loaded_->done(); }, sys::Deadline(o_.timeout_ms),
                        who() + ": the loader's work on " + gpu::stream_text(loader_) + " of " +
                            dev_->uuid_string() + " for " + chunk_label(h));
        return outcome;
    } catch (const std::exception &e) {
        buffer_stuck_ = true;
        stuck_chunk_ = chunk_label(h);
        if (outcome != WSYNC_OK) return outcome;
        *message = e.what();
        const auto *err = dynamic_cast<const Error *>(&e);
        return err ? err->status() : WSYNC_ERR_SYSTEM;
    }
}

std::unique_ptr<ChunkBacking> UcxReceiver::open_ranges(const ChunkHeader &h, const TensorTable &table,
                                          const std::vector<ByteRange> &fetch,
                                          const json &transport) {
    Where at = admit(h, table, transport);
    for (const ByteRange &r : fetch)
        if (r.offset > at.bytes || r.bytes > at.bytes - r.offset)
            fail(WSYNC_ERR_MALFORMED, who() + ": a selected range lies outside the " +
                                          std::to_string(at.bytes) + "-byte chunk");
    std::vector<std::size_t> order(fetch.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return fetch[a].offset < fetch[b].offset; });
    // The chunk's entries by offset: a gap between two ranges may be crossed only where it
    // holds no byte of any entry (the padding between tensors), so no unselected byte moves.
    struct Entry {
        uint64_t offset, bytes, first_sum;
        std::size_t index;
    };
    std::vector<Entry> entries(table.metas.size());
    uint64_t sums = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
        entries[i] = Entry{table.offsets[i], table.wire_bytes(i), sums, i};
        if (at.block_bytes) sums += (table.wire_bytes(i) + at.block_bytes - 1) / at.block_bytes;
    }
    if (at.block_bytes && at.block_sums.size() != sums)
        fail(WSYNC_ERR_MALFORMED, who() + ": the request carries " + std::to_string(at.block_sums.size()) +
                                      " block checksums; its table has " + std::to_string(sums) + " blocks of " +
                                      std::to_string(at.block_bytes) + " bytes");
    // By offset, then size: empty entries first, so ends do not decrease either.
    std::sort(entries.begin(), entries.end(), [](const Entry &a, const Entry &b) {
        return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
    });
    auto padding_only = [&](uint64_t lo, uint64_t hi) {
        if (hi - lo >= layout::kTensorAlign) return false;
        // the first entry that ends after lo must begin at or after hi
        auto it = std::lower_bound(entries.begin(), entries.end(), lo,
                                   [](const Entry &e, uint64_t x) { return e.offset + e.bytes <= x; });
        return it == entries.end() || it->offset >= hi;
    };
    std::vector<Span> spans;
    std::vector<uint64_t> local(fetch.size());
    uint64_t cursor = 0, first = 0;  // first: the remote offset of the open span
    for (std::size_t k : order) {
        const ByteRange &r = fetch[k];
        const uint64_t end = spans.empty() ? 0 : first + spans.back().bytes;
        if (spans.empty() || (r.offset > end && !padding_only(end, r.offset))) {
            const uint64_t at_local = layout::round_up(cursor, layout::kTensorAlign) + r.offset % layout::kTensorAlign;
            spans.push_back(Span{r.offset, 0, at_local});
            first = r.offset;
        }
        Span &s = spans.back();
        s.bytes = std::max(s.bytes, r.offset + r.bytes - first);
        local[k] = s.local + (r.offset - first);
        cursor = s.local + s.bytes;
    }
    uint64_t moved = 0;
    for (const Span &s : spans) moved += s.bytes;
    // Checksums that follow the bytes, of the entries selected whole (the only ones verified;
    // empty ones too, which move no byte): a range per run of them in table order, after the
    // bytes (the trainer hashes what it did not send, so no more entries than those); more than
    // kSumFetches runs are joined into that many, so every fetch fits the trainer's queue.
    SumRange trailing{table.metas.size(), {}};
    if (at.sums_follow && o_.verify) {
        std::set<std::pair<uint64_t, uint64_t>> asked;
        for (const ByteRange &r : fetch) asked.emplace(r.offset, r.bytes);
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            if (!asked.count({table.offsets[i], table.payload_bytes(i)})) continue;
            auto &runs = trailing.ranges;
            if (!runs.empty() && runs.back().first + runs.back().second == i) ++runs.back().second;
            else runs.emplace_back(i, 1);
        }
        auto &runs = trailing.ranges;
        if (runs.size() > kSumFetches) {
            std::vector<std::pair<std::size_t, std::size_t>> joined;
            for (std::size_t g = 0; g < kSumFetches; ++g) {
                const auto &a = runs[g * runs.size() / kSumFetches], &b = runs[(g + 1) * runs.size() / kSumFetches - 1];
                joined.emplace_back(a.first, b.first + b.second - a.first);
            }
            runs = std::move(joined);
        }
    }
    if (moved == 0 && trailing.ranges.empty()) {
        check_link("before acknowledging " + chunk_label(h));
        last_seq_ = at.seq;
        if (!fetch.empty()) ensure_buffer(1);  // empty tensors still get a valid pointer
    } else {
        pull(h, at, spans, std::max<uint64_t>(cursor, 1), trailing);
        if (o_.verify && at.block_bytes) verify_blocks(h, at, table, fetch, local, entries);
    }
    auto b = std::make_unique<UcxBacking>(*this, static_cast<const uint8_t *>(buf_), std::move(local), at.seq);
    b->set_header(h);
    return b;
}

template <class Entries>
void UcxReceiver::verify_blocks(const ChunkHeader &h, const Where &at, const TensorTable &table,
                   const std::vector<ByteRange> &fetch, const std::vector<uint64_t> &local,
                   const Entries &entries) {
    const uint64_t bb = at.block_bytes;
    for (std::size_t k = 0; k < fetch.size(); ++k) {
        const ByteRange &r = fetch[k];
        if (r.bytes == 0) continue;
        auto it = std::upper_bound(entries.begin(), entries.end(), r.offset,
                                   [](uint64_t x, const auto &e) { return x < e.offset; });
        if (it == entries.begin()) continue;
        const auto &e = *std::prev(it);
        if (r.offset + r.bytes > e.offset + e.bytes) continue;  // not within one entry
        const uint64_t lo = r.offset - e.offset, hi = lo + r.bytes;
        if (lo == 0 && hi == e.bytes && !table.checksums.empty()) continue;
        for (uint64_t b = (lo + bb - 1) / bb; b * bb < e.bytes; ++b) {
            const uint64_t bend = std::min((b + 1) * bb, e.bytes);
            if (bend > hi) break;
            const uint64_t got = checksum_bytes(static_cast<const uint8_t *>(buf_) + local[k] + (b * bb - lo), bend - b * bb);
            const uint64_t want = at.block_sums[e.first_sum + b];
            if (got == want) continue;
            char sums[64];
            std::snprintf(sums, sizeof sums, "%016llx, computed %016llx", static_cast<unsigned long long>(want),
                          static_cast<unsigned long long>(got));
            const std::string msg = who() + ": tensor '" + table.metas[e.index].name + "' in " + chunk_label(h) +
                                    ": block " + std::to_string(b) + " (bytes [" + std::to_string(b * bb) + ", " +
                                    std::to_string(bend) + ") of the entry) checksum mismatch (request says " +
                                    sums + ")";
            answer(at.seq, h, WSYNC_ERR_INTEGRITY, msg);
            fail(WSYNC_ERR_INTEGRITY, msg);
        }
    }
}

UcxBacking::~UcxBacking() {
    if (!acknowledged_ && !ends_.empty()) owner_.give_up_pull(seq_, header_);
}

bool UcxBacking::landed_sum(std::size_t i, uint64_t *sum) { return in_place(i) && owner_.landed_sum(i, sum); }

uint64_t UcxBacking::trailing_sum(std::size_t i) { return owner_.trailing_sum(seq_, i); }

void UcxBacking::await(std::size_t i) {
    if (!ends_.empty()) owner_.await_range(offsets_[i], ends_[i]);
}

bool UcxBacking::device_destination(const void *dst) const { return owner_.device_destination(dst); }

bool UcxBacking::copy_to_device(void *dst, const void *src, uint64_t len,
                                const std::function<std::string()> &what) {
    owner_.queue_copy(dst, src, len, what);
    return true;
}

wsync_status_t UcxBacking::settle(wsync_status_t outcome, std::string *message) noexcept {
    return owner_.settle(header_, outcome, message);
}

void UcxBacking::acknowledge(wsync_status_t outcome) noexcept {
    acknowledged_ = true;
    owner_.answer(seq_, header_, outcome, "", applied_);
}


std::unique_ptr<ReceiverImpl> make_receiver(const InitInfo &info, uint32_t index,
                                            const ReceiverOptions &options) {
    return std::make_unique<UcxReceiver>(info, index, options);
}

}  // namespace wsync::ucx
