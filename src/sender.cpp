// Sender: versions, chunks and their requests, the failures a sender reports (the core half
// every kind shares; src/core.hpp). Its transport is a SenderImpl.
#include "core.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "error.hpp"

namespace wsync {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

json encode_manifest(const Manifest &m) {
    return json{{"tensors", m.tensors}, {"bytes", m.bytes}, {"chunks", m.chunks},
                {"digest", m.digest}};
}

// Statuses that mean the caller's input was refused before anything moved: such a failed send
// loses nothing and leaves the version open.
bool refused_input(wsync_status_t st) {
    return st == WSYNC_ERR_INVALID_ARGUMENT || st == WSYNC_ERR_UNSUPPORTED;
}

}  // namespace

uint64_t chain_digest(uint64_t digest, const TensorTable &table) {
    // Canonical bytes per tensor: name + NUL, code, bits, lanes (LE), ndim, shape (LE int64s);
    // a part adds its offset and bytes (LE uint64s).
    std::string buf;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const TensorMeta &t = table.metas[i];
        buf.append(t.name.data(), t.name.size() + 1);
        const char head[8] = {char(t.dtype.code), char(t.dtype.bits), char(t.dtype.lanes & 0xff),
                              char(t.dtype.lanes >> 8), char(t.ndim), 0, 0, 0};
        buf.append(head, sizeof head);
        buf.append(reinterpret_cast<const char *>(t.shape), sizeof(int64_t) * static_cast<std::size_t>(t.ndim));
        if (table.is_part(i))
            buf.append(reinterpret_cast<const char *>(&table.parts[i]), sizeof(PartInfo));
    }
    return XXH3_64bits_withSeed(buf.data(), buf.size(), digest);
}

// ----------------------------------------------------------------------------------------------
Sender::Sender(const KindInfo &kind, std::unique_ptr<SenderImpl> impl, const delta::Config &delta)
    : kind_(kind), impl_(std::move(impl)) {
    version_ = first_version_ = impl_->first_version();
    if (delta.mode == delta::Mode::kOff) return;
    // The transport's own coder where it has one (the GPU kinds compare on the device), else
    // the host's.
    delta_ = impl_->delta_coder(delta);
    if (!delta_) delta_ = std::make_unique<delta::Encoder>(delta);
    if (delta.mode == delta::Mode::kAuto && delta.by_cost) auto_ = std::make_unique<delta::Auto>();
}

// A version's first chunk: the last version's cost is known (no flush came after it: its
// send_chunk time alone), and "auto" plans this one. A bare version leaves the coder out
// entirely; the coder then sees the next version it is given as not following its last
// commit, and sends that one dense, keeping bases, as kKeepBases does.
void Sender::begin_plan() {
    if (!auto_) return;
    measured(0, /*flushed=*/false);
    plan_ = auto_->plan();
    cost_ = delta::VersionCost{};
    cost_.plan = plan_;
    if (plan_ == delta::Plan::kKeepBases) delta_->dense_next();
}

void Sender::measured(double flush_seconds, bool flushed) {
    if (!costed_) return;
    costed_ = false;
    cost_.seconds += flush_seconds;
    cost_.flushed = flushed;
    // What the engines reported so far with their acknowledgements (all of them after a flush).
    if (cost_.plan == delta::Plan::kPatches)
        cost_.apply_seconds = double(impl_->applied_ns(cost_version_)) * 1e-9;
    auto_->measured(cost_);
}

uint64_t Sender::engines_apply_ns(uint64_t version) { return impl_->applied_ns(version); }

void Sender::set_stream(void *stream) {
    impl_->set_stream(stream);
    if (delta_) delta_->set_stream(stream);
}

Sender::~Sender() {
    try {
        abandon();
    } catch (...) {
        // Destruction never fails; receivers also learn from the next version or the lock.
    }
}

template <class F>
auto Sender::noting_failures(F &&f) -> decltype(f()) {
    failures_.clear();
    try {
        return f();
    } catch (const Error &e) {
        failures_ = e.failures();
        // A receiver that failed or missed anything cannot take the next patch.
        if (delta_ && !refused_input(e.status())) delta_->dense_next();
        throw;
    }
}

std::vector<uint8_t> Sender::send_chunk(const wsync_chunk_t &chunk, const wsync_part_t *parts) {
    if (chunk.flags & ~uint32_t(WSYNC_CHUNK_LAST))
        fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk flags has unknown bits");
    if (chunk.count == 0) {
        if (!(chunk.flags & WSYNC_CHUNK_LAST) || chunk.tensors)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "chunk has no tensors (count 0): only an empty closing chunk (tensors NULL, flags "
                 "WSYNC_CHUNK_LAST) may be empty");
        return commit();
    }
    if (!chunk.tensors) fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk.tensors is NULL");
    return send(chunk.tensors, chunk.count, (chunk.flags & WSYNC_CHUNK_LAST) != 0, parts);
}

std::vector<uint8_t> Sender::commit() {
    if (next_index_ == 0)
        fail(WSYNC_ERR_WRONG_STATE, std::string(kind_.name) + ": version " +
                                        std::to_string(version_) +
                                        " has no chunk yet: there is nothing to commit");
    return send(nullptr, 0, true, nullptr);
}

std::vector<uint8_t> Sender::send(const wsync_tensor_t *tensors, std::size_t count, bool last,
                                  const wsync_part_t *parts) {
    failures_.clear();
    TensorTable table;
    if (count) table.metas = metas_from_chunk(tensors, count, /*need_data=*/true);
    parts::take(table, parts);
    uint64_t total = 0;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        auto sum = add_u64(total, table.payload_bytes(i));
        if (!sum || *sum > (uint64_t(1) << 62))
            fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk byte size overflows");
        total = *sum;
    }
    if (next_index_ == UINT32_MAX - 1)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "version " + std::to_string(version_) +
                                             " has reached the most chunks a version may have");
    ChunkHeader h{version_, next_index_, last, {}};
    const std::string what = std::string(kind_.name) + ": " + chunk_label(h);
    if (delta_ && !table.parts.empty()) {
        std::size_t first = 0;
        while (!table.is_part(first)) ++first;  // table.parts is non-empty only with a part
        fail(WSYNC_ERR_UNSUPPORTED, what + ": tensor '" + table.metas[first].name +
                                        "' is a part of a split tensor, and delta sync does not take "
                                        "split tensors; run the sender with delta \"off\" or raise "
                                        "bucket_bytes so that no tensor is split");
    }
    parts::Tracker split = parts_;
    split.add(table, WSYNC_ERR_INVALID_ARGUMENT, what);
    if (last) split.require_complete(WSYNC_ERR_INVALID_ARGUMENT, what + " commits the version");
    parts::Wire part_wire;
    if (!table.parts.empty()) tensors = parts::to_wire(table, tensors, part_wire);
    json transport;
    // With delta, patches travel as uint8 tensors: the strategy moves the wire table's bytes.
    std::vector<wsync_tensor_t> wire;
    std::vector<TensorMeta> logical;
    const auto started = Clock::now();
    try {
        // Receivers that (re)attached since the last version hold no base: admitted now, they
        // make this version dense (a newcomer's first version then completes).
        if (h.chunk_index == 0) {
            begin_plan();
            if (impl_->begin_version(h.version) && delta_) delta_->dense_next();
        }
        if (coding() && count) {
            const auto t0 = Clock::now();
            delta_->encode(version_, tensors, table.metas, wire, table.patches);
            cost_.encode_seconds += seconds_since(t0);
            // A version that was to carry patches but may not (a receiver failed or
            // re-attached): it was dense, keeping bases.
            if (cost_.plan == delta::Plan::kPatches && !delta_->patching())
                cost_.plan = delta::Plan::kKeepBases;
            tensors = wire.data();
            logical = table.metas;
            table.metas = table.as_wire().metas;
        }
        transport = noting_failures([&] { return impl_->send(h, tensors, table); });
    } catch (const Error &e) {
        if (!refused_input(e.status())) {
            std::vector<Failure> keep = failures_;
            if (delta_) delta_->abandon();  // also when nothing of the version was published
            abandon();
            failures_ = std::move(keep);
        } else if (coding()) {
            delta_->chunk_refused();
        }
        throw;
    }
    if (coding()) {
        delta_->chunk_sent();
        if (last) delta_->commit(version_);
        if (!logical.empty()) table.metas = std::move(logical);
    }
    if (auto_) {
        cost_.bytes += total;
        cost_.seconds += seconds_since(started);
        costed_ = last;
        cost_version_ = version_;
    }
    if (!table.parts.empty()) parts::from_wire(table, part_wire);
    parts_ = std::move(split);
    // Tallied as sent: a strategy may have changed the table (a cast to bfloat16).
    Manifest after = tally_;
    tally(after, table);
    if (last) h.manifest = after;
    json body = {{"version", h.version}, {"chunk", h.chunk_index}, {"last", h.last}};
    if (last) body["manifest"] = encode_manifest(h.manifest);
    json table_obj = json::object();
    encode_tensor_table(table, table_obj);
    body["tensors"] = std::move(table_obj);
    body["transport"] = std::move(transport);
    auto blob = wire::encode(wire::BlobType::Request, kind_.name, std::move(body));
    if (h.last) {
        ++version_;
        next_index_ = 0;
        tally_ = Manifest{};
    } else {
        ++next_index_;
        tally_ = after;
    }
    return blob;
}

void Sender::abandon() {
    costed_ = false;  // a failed version teaches "auto" nothing
    if (next_index_ == 0) return;  // nothing of this version was published
    uint64_t v = version_;
    ++version_;
    next_index_ = 0;
    tally_ = Manifest{};
    parts_.reset();
    if (delta_) delta_->abandon();
    impl_->abandon(v);
}

void Sender::flush(int64_t timeout_ms) {
    failures_.clear();
    if (timeout_ms < 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "flush: timeout_ms must be >= 0 (there is no infinite wait)");
    const auto t0 = Clock::now();
    try {
        noting_failures([&] { impl_->flush(timeout_ms); });
    } catch (...) {
        costed_ = false;
        throw;
    }
    if (auto_) measured(seconds_since(t0), /*flushed=*/true);
}

void Sender::wait_released(uint64_t version, int64_t timeout_ms) {
    failures_.clear();
    if (timeout_ms < 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             "wait_released: timeout_ms must be >= 0 (there is no infinite wait)");
    if (version != WSYNC_ALL_VERSIONS && (version < first_version_ || version >= version_))
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(kind_.name) + ": wait_released: version " + std::to_string(version) +
                 " is not one this sender has finished (" +
                 (version_ == first_version_
                      ? std::string("none yet")
                      : "versions " + std::to_string(first_version_) + ".." +
                            std::to_string(version_ - 1)) +
                 " are; WSYNC_ALL_VERSIONS waits for every mapping)");
    noting_failures([&] { impl_->wait_released(version, timeout_ms); });
}

void Sender::drop_receiver(uint32_t index) { impl_->drop_receiver(index); }

void SenderImpl::drop_receiver(uint32_t) {
    fail(WSYNC_ERR_UNSUPPORTED, "this strategy's receivers form a fixed group: none can be dropped");
}

}  // namespace wsync
