#include "core.hpp"

#include <algorithm>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy.hpp"
#include "error.hpp"

namespace wsync {

namespace {

// Request body layout shared by all kinds (docs/wire-format.md):
//   {"version": u64, "chunk": u32, "last": bool, "tensors": {table}, "transport": {kind's}}
constexpr const char *kReq = "request";

}  // namespace

ChunkHeader decode_header(const json &body) {
    ChunkHeader h;
    h.version = wire::uint_field(body, "version", kReq, UINT64_MAX - 1);
    if (h.version == 0) wire::malformed("request.version is 0 (versions start at 1)");
    h.chunk_index = static_cast<uint32_t>(wire::uint_field(body, "chunk", kReq, UINT32_MAX - 1));
    h.last = wire::bool_field(body, "last", kReq);
    if (h.last) {
        const json &m = wire::object_field(body, "manifest", kReq);
        const std::string w = "request.manifest";
        h.manifest.tensors = wire::uint_field(m, "tensors", w, UINT64_MAX);
        h.manifest.bytes = wire::uint_field(m, "bytes", w, UINT64_MAX);
        h.manifest.chunks = static_cast<uint32_t>(wire::uint_field(m, "chunks", w, UINT32_MAX));
        h.manifest.digest = wire::uint_field(m, "digest", w, UINT64_MAX);
        if (h.manifest.chunks != uint64_t(h.chunk_index) + 1)
            wire::malformed(w + ": chunks " + std::to_string(h.manifest.chunks) +
                            " does not match the committing chunk's index " +
                            std::to_string(h.chunk_index));
    } else if (body.contains("manifest")) {
        wire::malformed("request.manifest on a chunk that does not commit its version");
    }
    return h;
}

namespace {

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

std::string chunk_label(const ChunkHeader &h) {
    return "chunk " + std::to_string(h.chunk_index) + " of version " + std::to_string(h.version);
}

void tally(Manifest &m, const TensorTable &table) {
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        // Each chunk is capped at 2^62 bytes; versions at 2^32 chunks. A split tensor counts
        // once (at its first part), its bytes part by part.
        m.bytes += table.payload_bytes(i);
        if (!table.is_part(i) || table.parts[i].offset == 0) m.tensors += 1;
    }
    m.chunks += 1;
    m.digest = chain_digest(m.digest, table);
}

std::string manifest_text(const Manifest &m) {
    char d[24];
    std::snprintf(d, sizeof d, "%016llx", static_cast<unsigned long long>(m.digest));
    return std::to_string(m.tensors) + " tensors, " + std::to_string(m.bytes) + " bytes in " +
           std::to_string(m.chunks) + " chunks, table digest " + d;
}

// ----------------------------------------------------------------------------------------------
Strategy::Strategy(const KindInfo &kind, const char *options_json)
    : kind_(kind), options_(kind.name, option_specs(kind), options_json),
      delta_(delta::config_from(options_, kind.name, kind.delta_sync, kind.delta_on_device)) {
    std::string missing = kind.unavailable_reason(&options_);
    if (!missing.empty())
        fail(WSYNC_ERR_UNAVAILABLE, std::string(kind.name) + ": unavailable: " + missing);
    impl_ = kind.create(options_);
}

std::vector<uint8_t> Strategy::create_init_info() {
    if (init_made_)
        fail(WSYNC_ERR_WRONG_STATE, std::string(kind_.name) +
                                        ": init info was already created by this strategy");
    json body = impl_->create_init_info();
    init_made_ = true;
    return wire::encode(wire::BlobType::Init, kind_.name, std::move(body));
}

std::unique_ptr<Sender> Strategy::create_sender(const uint8_t *init, std::size_t len) {
    auto env = wire::decode_expect(init, len, wire::BlobType::Init, kind_.name);
    return std::make_unique<Sender>(kind_, impl_->create_sender(env.body), delta_);
}

std::unique_ptr<Receiver> Strategy::create_receiver(const uint8_t *init, std::size_t len,
                                                    uint32_t index) {
    auto env = wire::decode_expect(init, len, wire::BlobType::Init, kind_.name);
    return std::make_unique<Receiver>(kind_, impl_->create_receiver(env.body, index), delta_.mirror);
}

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
}

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
    try {
        // Receivers that (re)attached since the last version hold no base: admitted now, they
        // make this version dense (a newcomer's first version then completes).
        if (h.chunk_index == 0 && impl_->begin_version(h.version) && delta_) delta_->dense_next();
        if (delta_ && count) {
            delta_->encode(version_, tensors, table.metas, wire, table.patches);
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
        } else if (delta_) {
            delta_->chunk_refused();
        }
        throw;
    }
    if (delta_) {
        delta_->chunk_sent();
        if (last) delta_->commit(version_);
        if (!logical.empty()) table.metas = std::move(logical);
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
    noting_failures([&] { impl_->flush(timeout_ms); });
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

// ----------------------------------------------------------------------------------------------
Receiver::Receiver(const KindInfo &kind, std::unique_ptr<ReceiverImpl> impl, bool mirror)
    : kind_(kind), impl_(std::move(impl)),
      pool_(std::make_unique<copy::Pool>(impl_->copy_threads())), mirror_on_(mirror) {}

Receiver::~Receiver() {
    // An iteration left open is acknowledged as failed before the transport goes away.
    open_.reset();
}

void Receiver::set_stream(void *stream) {
    if (open_)
        fail(WSYNC_ERR_WRONG_STATE, std::string(kind_.name) +
                                        ": set_stream while an iteration is open: end or fail it "
                                        "first (its chunk is released after the stream it began "
                                        "with)");
    impl_->set_stream(stream);
}

void Receiver::fail_open_version(wsync_status_t status) {
    // Only a version still open here fails: one this receiver completed stays completed (a
    // sender that goes away, or abandons a later version, after it completed does not undo it).
    if (current_ && !current_failed_ && current_ != completed_) {
        current_failed_ = true;
        current_status_ = status;
        failed_version_ = current_;
        failed_status_ = status;
    }
}

void Receiver::lose_open_version(const ChunkHeader &next) {
    // A chunk of a newer version while one is open here, not failed and not abandoned (catch_up
    // has failed an abandoned one): the sender committed it and its chunks from expect_index_ on
    // never reached this receiver. It fails here, and the trainer hears of it from this record,
    // written before the transport acknowledges those chunks as missed (so a flush that the
    // acknowledgements release finds the record).
    if (!current_ || current_failed_ || current_ == completed_) return;
    const std::string why = "chunks from " + std::to_string(expect_index_) + " of version " +
                            std::to_string(current_) +
                            " never reached this receiver (lost or reordered): " +
                            chunk_label(next) + " came next";
    ChunkHeader lost;
    lost.version = current_;
    lost.chunk_index = expect_index_;
    impl_->record_failure(lost, WSYNC_ERR_MISMATCH, why);
    fail_open_version(WSYNC_ERR_MISMATCH);
    current_why_ = why;
}

void Receiver::skip_versions(const ChunkHeader &next, const Link &link) {
    // A sender numbers its versions one after another (committed or abandoned), so those
    // between the newest one begun here and `next`'s were published while this receiver was
    // attached, and none of their requests reached it (issue 38: the trainer's flush said OK and
    // the engine's poll showed nothing). Each fails here with MISMATCH, recorded before the
    // transport acknowledges its chunks as missed. An abandoned one's record is not reported
    // (the sender skips records of versions it abandoned). A long gap is one record, naming the
    // range by its first version, so the ring keeps the records before it.
    constexpr uint64_t kEach = 3;  // gaps up to this many versions get a record each
    const uint64_t first = current_ + 1, last = next.version - 1;
    const std::string tail = " reached this receiver (lost or reordered): " + chunk_label(next) +
                             " came next";
    ChunkHeader lost;
    lost.chunk_index = 0;
    if (last - first + 1 <= kEach) {
        for (uint64_t v = first; v <= last; ++v) {
            if (v == link.abandoned_version) continue;
            lost.version = v;
            impl_->record_failure(lost, WSYNC_ERR_MISMATCH,
                                  "no chunk of version " + std::to_string(v) + tail);
        }
    } else {
        lost.version = first;
        impl_->record_failure(lost, WSYNC_ERR_MISMATCH,
                              "no chunk of versions " + std::to_string(first) + " to " +
                                  std::to_string(last) + tail);
    }
    const uint64_t newest = last == link.abandoned_version ? last - 1 : last;
    if (newest >= first && newest > failed_version_) {
        failed_version_ = newest;
        failed_status_ = WSYNC_ERR_MISMATCH;
    }
}

void Receiver::start_version(uint64_t version) {
    current_ = version;
    current_failed_ = false;
    current_status_ = WSYNC_OK;
    current_why_.clear();
    tally_ = Manifest{};
}

void Receiver::lose_chunk(const ChunkHeader &h, const json &transport, wsync_status_t status,
                          const std::string &why) {
    // The transport could not deliver a chunk that was in order (ucx: the trainer did not grant
    // the pull in time, no longer keeps the chunk, or went away; cuda_ipc: a handle would not
    // open). The chunk is spent and its version fails here with that status, and the trainer is
    // told with the chunk's answer (ucx user trial: the version stayed open, and the next chunk
    // failed it as "a request was lost or reordered", MISMATCH, on both sides). A request this
    // receiver must not take (stale, replayed, for another receiver or GPU, malformed) leaves
    // everything as it was.
    switch (status) {
    case WSYNC_ERR_MISMATCH:
    case WSYNC_ERR_MALFORMED:
    case WSYNC_ERR_INVALID_ARGUMENT:
    case WSYNC_ERR_WRONG_STATE:
    case WSYNC_ERR_UNSUPPORTED:
        return;
    default:
        break;
    }
    if (h.chunk_index == 0) {
        start_version(h.version);
        parts_ = parts::Tracker();
    }
    if (h.version != current_) return;
    expect_index_ = h.chunk_index + 1;
    // ABANDONED is not answered: the trainer abandoned the version, or no longer keeps it
    // (ucx keep_versions: this engine lags, and catches up with the newest kept version), and
    // the transport has answered already where it must (shm's withdrawn chunk). Review: it
    // answered twice on shm, and on ucx the trainer's flush failed with PEER for a version it
    // had abandoned or retired itself.
    if (status != WSYNC_ERR_ABANDONED) impl_->refuse(h, transport, status, why, true);
    fail_open_version(status);
    if (current_why_.empty()) current_why_ = why;
}

void Receiver::catch_up(const Link &link) {
    dropped_ = link.dropped;
    sender_gone_ = link.sender_gone;
    // The board keeps only the newest abandoned version: the open version is known abandoned
    // only when it is that one. An older open version may have committed (this engine lags:
    // delta user trial, where "abandoned_version >= current" failed a committed version 2 as
    // abandoned once the trainer abandoned version 3, and the trainer was never told); if it
    // was abandoned too, its withdrawn chunks fail it (ABANDONED), or the next version's first
    // request does.
    if (current_ && link.abandoned_version == current_) {
        fail_open_version(WSYNC_ERR_ABANDONED);
        current_why_ = "the sender abandoned version " + std::to_string(current_);
    } else if (current_ && link.sender_gone) {
        fail_open_version(WSYNC_ERR_PEER);
        current_why_ = "the trainer's process is gone";
    }
}

Iteration *Receiver::receive(const uint8_t *request, std::size_t len) {
    if (open_)
        fail(WSYNC_ERR_WRONG_STATE,
             "an iteration is still open on this receiver; end it with wsync_recv_end first");
    // Nothing below trusts the bytes before the seal and every field have been checked.
    auto env = wire::decode_expect(request, len, wire::BlobType::Request, kind_.name);
    struct Dispose {  // the DOM goes by wire::dispose, not nlohmann's walk, however this returns
        json &dom;
        ~Dispose() { wire::dispose(dom); }
    } dispose_dom{env.body};
    ChunkHeader h = decode_header(env.body);
    TensorTable table = decode_tensor_table(wire::object_field(env.body, "tensors", kReq));  // takes the names
    const json &transport = wire::object_field(env.body, "transport", kReq);
    const std::string what = std::string(kind_.name) + ": " + chunk_label(h);
    impl_->check_addressed(transport);  // another sync's request: refused, nothing changes

    Link link = impl_->link();
    if (link.dropped)
        fail(WSYNC_ERR_PEER, std::string(kind_.name) +
                                 ": this receiver was dropped by the sender; destroy it and create "
                                 "a new one with the same index to re-attach");
    // (Re)attached and no version has begun since: every request now is of a version begun
    // before this receiver was there. Refused as such, leaving this receiver's state alone (a
    // restarted engine fed the requests in flight was told "a request was lost or reordered"
    // and showed that version failed: C++ user trial); it takes part from the next version.
    if (link.joining && current_ == 0)
        fail(WSYNC_ERR_MISMATCH, what + ": this receiver (re)attached after version " +
                                     std::to_string(h.version) +
                                     " began (in flight then, or long done); it takes part from "
                                     "the next version the sender begins (skip the requests of "
                                     "this one)");
    if (current_ && link.abandoned_version == current_) catch_up(link);
    if (h.version > current_) lose_open_version(h);
    if (h.version > current_ + 1 && current_ != 0) skip_versions(h, link);

    // Order: chunk 0 of a version newer than any seen begins it (an open older one has failed
    // just above); any other chunk must be the next of the current version. Older chunks are
    // replays.
    if (h.chunk_index == 0) {
        if (h.version <= current_ && current_ != 0)
            fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) + " again or out of order: " +
                                         "version " + std::to_string(current_) +
                                         " has begun here already (stale or replayed request)");
    } else if (h.version < current_ || (h.version == current_ && h.chunk_index < expect_index_)) {
        fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) +
                                     " again: a stale or replayed request");
    } else if (h.version != current_ || h.chunk_index != expect_index_) {
        const bool open = current_ && !current_failed_ && current_ != completed_;
        std::string expected =
            open ? "chunk " + std::to_string(expect_index_) + " of version " + std::to_string(current_)
            : current_ ? "chunk 0 of a version after " + std::to_string(current_)
                       : std::string("chunk 0 of a version");
        std::string why = "received " + chunk_label(h) + " but expected " + expected +
                          " (a request was lost or reordered)";
        // Of the version the sender abandoned (its earlier chunks withdrawn or lost): that is
        // the reason to give, as for a withdrawn chunk (delta user trial: "lost or reordered"
        // where the docs say ABANDONED). Still answered, so the chunks before it count as
        // missed (review: else the sender timed out on a committed version's chunks this
        // engine was never given), but not recorded: failures of an abandoned version are not
        // reported.
        const bool abandoned = h.version == link.abandoned_version;
        const wsync_status_t status = abandoned ? WSYNC_ERR_ABANDONED : WSYNC_ERR_MISMATCH;
        if (abandoned)
            why = "version " + std::to_string(h.version) + " was abandoned by the sender; " +
                  chunk_label(h) + " arrived without the chunks before it";
        if (h.version != current_) {
            // A newer version whose first chunks did not arrive (an open older one has failed
            // already: lose_open_version or catch_up). This one fails here: none of its later
            // chunks, nor a late chunk 0, can complete it, so this receiver and the trainer
            // (which gets the record) agree that it failed.
            start_version(h.version);
            expect_index_ = h.chunk_index + 1;  // its later chunks: refused as a failed version's
        }
        fail_open_version(status);
        if (current_why_.empty()) current_why_ = why;
        impl_->refuse(h, transport, status, why, !abandoned);
        fail(status, std::string(kind_.name) + ": " + why);
    } else if (current_failed_) {
        std::string why = "version " + std::to_string(current_) + " already failed here with " +
                          status_name(current_status_) +
                          (current_why_.empty() ? "" : " (" + current_why_ + ")");
        ++expect_index_;
        impl_->refuse(h, transport, current_status_, why, false);
        // The engine's call says "skipped", not the version's status again (user trial: a
        // loader's WRONG_STATE came back for every later chunk, read as a new wrong-state bug).
        // A version the sender abandoned stays ABANDONED: that is news about the version.
        if (current_status_ == WSYNC_ERR_ABANDONED) fail(current_status_, what + ": " + why);
        fail(WSYNC_ERR_SKIPPED, what + ": skipped, " + why);
    }
    if (impl_->checksums_promised() && table.checksums.empty() && !table.metas.empty()) {
        std::string why = "request carries no tensor checksums though the init info says they are on";
        impl_->refuse(h, transport, WSYNC_ERR_INTEGRITY, why, true);
        fail(WSYNC_ERR_INTEGRITY, what + ": " + why);
    }

    // A split tensor's parts follow each other and are complete when the version commits.
    parts::Tracker split = h.chunk_index == 0 ? parts::Tracker() : parts_;
    try {
        split.add(table, WSYNC_ERR_MISMATCH, what);
        if (h.last) split.require_complete(WSYNC_ERR_MISMATCH, what + " commits its version");
    } catch (const Error &e) {
        if (h.version == current_) fail_open_version(WSYNC_ERR_MISMATCH);
        impl_->refuse(h, transport, WSYNC_ERR_MISMATCH, e.what(), true);
        throw;
    }
    // With a selection (src/select.hpp) the plan is checked before any byte moves; its state
    // restarts with each version.
    const select::Spec *selection = impl_->selection();
    select::Version chosen = h.chunk_index == 0 ? select::Version() : chosen_;
    Subset subset;
    TensorTable view;
    std::vector<ByteRange> fetch;
    if (selection) {
        try {
            select::Plan plan = chosen.plan(*selection, h, table, what);
            view = std::move(plan.view);
            fetch = std::move(plan.fetch);
            subset.unverified = std::move(plan.unverified);
            subset.active = true;
        } catch (const Error &e) {
            if (h.version == current_) fail_open_version(e.status());
            impl_->refuse(h, transport, e.status(), e.what(), true);
            throw;
        }
    }
    // The transport checks the bytes it moved: a patch's or a part's, not the tensor's.
    const bool whole = table.patches.empty() && table.parts.empty();
    std::unique_ptr<ChunkBacking> backing;
    try {
        backing = selection ? impl_->open_ranges(h, whole ? table : table.as_wire(), fetch, transport)
                            : impl_->open(h, whole ? table : table.as_wire(), transport);
    } catch (const Error &e) {
        lose_chunk(h, transport, e.status(), e.what());
        throw;
    }
    parts_ = std::move(split);
    if (selection) {
        chosen_ = std::move(chosen);
        subset.whole = std::move(table);
        table = std::move(view);
    }
    if (h.chunk_index == 0)  // an open older version failed above (lose_open_version, catch_up)
        start_version(h.version);
    expect_index_ = h.chunk_index + 1;
    open_ = std::make_unique<Iteration>(*this, h, std::move(table), std::move(backing),
                                        impl_->verify_checksums(), std::move(subset));
    return open_.get();
}

void Receiver::end(Iteration *it) {
    if (!open_ || open_.get() != it)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "iteration does not belong to this receiver");
    std::unique_ptr<Iteration> own = std::move(open_);  // freed however end() leaves
    own->end();
}

void Receiver::fail_iteration(Iteration *it, wsync_status_t status, const char *message) {
    if (!open_ || open_.get() != it)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "iteration does not belong to this receiver");
    std::unique_ptr<Iteration> own = std::move(open_);
    std::string msg = message ? std::string(message, strnlen(message, 255)) : std::string();
    if (status == WSYNC_OK) {
        own->fail(WSYNC_ERR_INVALID_ARGUMENT,
                  "the loader failed the chunk with WSYNC_OK as status" +
                      (msg.empty() ? std::string() : ": " + msg));
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             "wsync_recv_fail: status must be an error status, not WSYNC_OK (the chunk is failed "
             "with WSYNC_ERR_INVALID_ARGUMENT)");
    }
    own->fail(status, msg.empty() ? "failed by the loader" : msg);
}

void Receiver::before_ack(const ChunkHeader &h, wsync_status_t outcome, const std::string &message) {
    if (outcome == WSYNC_OK || h.version != current_) return;
    if (!current_failed_) impl_->record_failure(h, outcome, message);
    fail_open_version(outcome);
    if (current_why_.empty()) current_why_ = message;
}

void Receiver::finished(const ChunkHeader &h, const TensorTable &table, wsync_status_t outcome) {
    if (outcome != WSYNC_OK || h.version != current_ || current_failed_) return;
    tally(tally_, table);
    if (h.last) {
        completed_ = h.version;
        current_ = h.version;  // stays: a replay of it is still refused
        current_failed_ = false;
        expect_index_ = UINT32_MAX;
    }
}

wsync_receiver_state_t Receiver::poll() {
    if (open_)
        fail(WSYNC_ERR_WRONG_STATE, "poll: an iteration is open; end or fail it first");
    catch_up(impl_->link());
    wsync_receiver_state_t st{};
    st.struct_size = sizeof st;
    st.flags = (dropped_ ? WSYNC_RECEIVER_DROPPED : 0) | (sender_gone_ ? WSYNC_RECEIVER_SENDER_GONE : 0) |
               (impl_->orders_loader_work() ? WSYNC_RECEIVER_ORDERS_LOADER_WORK : 0);
    st.completed_version = completed_;
    st.open_version = current_ && !current_failed_ && current_ != completed_ ? current_ : 0;
    st.failed_version = failed_version_;
    st.failed_status = failed_version_ ? failed_status_ : WSYNC_OK;
    return st;
}

std::unique_ptr<ChunkBacking> ReceiverImpl::open_ranges(const ChunkHeader &, const TensorTable &,
                                                       const std::vector<ByteRange> &, const json &) {
    fail(WSYNC_ERR_INTERNAL, "this strategy's receivers do not take a selection");
}

void check_receiver_index(const char *kind, uint32_t index, uint32_t receivers) {
    if (index >= receivers)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(kind) + ": receiver index " + std::to_string(index) +
                 " is out of range: this sync has " +
                 (receivers == 1 ? std::string("1 receiver, index 0")
                                 : std::to_string(receivers) + " receivers, indices 0 to " +
                                       std::to_string(receivers - 1)) +
                 " (set by \"receivers\" when the trainer made the init info)");
}

}  // namespace wsync
