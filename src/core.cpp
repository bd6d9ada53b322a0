#include "core.hpp"

#include <cstring>

#include "error.hpp"

namespace wsync {

namespace {

// Request body layout shared by all kinds (docs/wire-format.md):
//   {"version": u64, "chunk": u32, "last": bool, "tensors": {table}, "transport": {kind's}}
constexpr const char *kReq = "request";

ChunkHeader decode_header(const json &body) {
    ChunkHeader h;
    h.version = wire::uint_field(body, "version", kReq, UINT64_MAX);
    if (h.version == 0) wire::malformed("request.version is 0 (versions start at 1)");
    h.chunk_index = static_cast<uint32_t>(wire::uint_field(body, "chunk", kReq, UINT32_MAX));
    h.last = wire::bool_field(body, "last", kReq);
    return h;
}

std::string chunk_label(const ChunkHeader &h) {
    return "chunk " + std::to_string(h.chunk_index) + " of version " + std::to_string(h.version);
}

}  // namespace

// ----------------------------------------------------------------------------------------------
Strategy::Strategy(const KindInfo &kind, const char *options_json)
    : kind_(kind), options_(kind.name, kind.options(), options_json) {
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
    return wire::encode(wire::BlobType::Init, kind_.name, body);
}

std::unique_ptr<Sender> Strategy::create_sender(const uint8_t *init, std::size_t len) {
    auto env = wire::decode_expect(init, len, wire::BlobType::Init, kind_.name);
    return std::make_unique<Sender>(kind_, impl_->create_sender(env.body));
}

std::unique_ptr<Receiver> Strategy::create_receiver(const uint8_t *init, std::size_t len,
                                                    uint32_t index) {
    auto env = wire::decode_expect(init, len, wire::BlobType::Init, kind_.name);
    return std::make_unique<Receiver>(kind_, impl_->create_receiver(env.body, index));
}

// ----------------------------------------------------------------------------------------------
std::vector<uint8_t> Sender::send_chunk(const wsync_chunk_t &chunk) {
    if (chunk.flags & ~uint32_t(WSYNC_CHUNK_LAST) || chunk.reserved_ != 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk flags has unknown bits or reserved_ is not 0");
    TensorTable table;
    table.metas = metas_from_chunk(chunk.tensors, chunk.count, /*need_data=*/true);
    uint64_t total = 0;
    for (const auto &m : table.metas) {
        auto sum = add_u64(total, m.nbytes);
        if (!sum || *sum > (uint64_t(1) << 62))
            fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk byte size overflows");
        total = *sum;
    }
    ChunkHeader h{version_, next_index_, (chunk.flags & WSYNC_CHUNK_LAST) != 0};
    json transport = impl_->send(h, chunk.tensors, table);
    json body = {{"version", h.version}, {"chunk", h.chunk_index}, {"last", h.last}};
    json tensors = json::object();
    encode_tensor_table(table, tensors);
    body["tensors"] = std::move(tensors);
    body["transport"] = std::move(transport);
    auto blob = wire::encode(wire::BlobType::Request, kind_.name, body);
    if (h.last) {
        ++version_;
        next_index_ = 0;
    } else {
        ++next_index_;
    }
    return blob;
}

void Sender::flush(int64_t timeout_ms) {
    if (timeout_ms < 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "flush: timeout_ms must be >= 0 (there is no infinite wait)");
    impl_->flush(timeout_ms);
}

// ----------------------------------------------------------------------------------------------
Receiver::~Receiver() {
    // An iteration left open is acknowledged as failed before the transport goes away.
    open_.reset();
}

Iteration *Receiver::receive(const uint8_t *request, std::size_t len) {
    if (open_)
        fail(WSYNC_ERR_WRONG_STATE,
             "an iteration is still open on this receiver; end it with wsync_recv_end first");
    auto env = wire::decode_expect(request, len, wire::BlobType::Request, kind_.name);
    ChunkHeader h = decode_header(env.body);
    TensorTable table = decode_tensor_table(wire::object_field(env.body, "tensors", kReq));
    const json &transport = wire::object_field(env.body, "transport", kReq);

    // Chunks arrive in the order they were sent, with no gap: that is how a lost or replayed
    // request is caught before its bytes are read.
    if (!have_prev_) {
        if (h.chunk_index != 0)
            fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) +
                                         " first; a receiver must start at chunk 0 of a version");
    } else if (prev_.last) {
        if (h.version != prev_.version + 1 || h.chunk_index != 0)
            fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) + " but expected chunk 0 of version " +
                                         std::to_string(prev_.version + 1));
    } else if (h.version != prev_.version || h.chunk_index != prev_.chunk_index + 1) {
        fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) + " but expected chunk " +
                                     std::to_string(prev_.chunk_index + 1) + " of version " +
                                     std::to_string(prev_.version));
    }

    auto backing = impl_->open(h, table, transport);
    if (!have_prev_ || prev_.last) version_failed_ = false;
    have_prev_ = true;
    prev_ = h;
    open_ = std::make_unique<Iteration>(*this, h, std::move(table), std::move(backing),
                                        impl_->verify_checksums());
    return open_.get();
}

void Receiver::end(Iteration *it) {
    if (!open_ || open_.get() != it)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "iteration does not belong to this receiver");
    std::unique_ptr<Iteration> own = std::move(open_);  // freed however end() leaves
    own->end();
}

void Receiver::finished(wsync_status_t outcome) {
    if (outcome != WSYNC_OK) version_failed_ = true;
    else if (prev_.last && !version_failed_) completed_ = prev_.version;
}

// ----------------------------------------------------------------------------------------------
Iteration::Iteration(Receiver &owner, ChunkHeader header, TensorTable table,
                     std::unique_ptr<ChunkBacking> backing, bool verify)
    : owner_(&owner), header_(header), table_(std::move(table)), backing_(std::move(backing)),
      verify_(verify && !table_.checksums.empty()) {}

Iteration::~Iteration() { finish(failed_ != WSYNC_OK ? failed_ : WSYNC_ERR_WRONG_STATE); }

wsync_recv_info_t Iteration::info() const {
    wsync_recv_info_t info{};
    info.version = header_.version;
    info.chunk_index = header_.chunk_index;
    info.flags = header_.last ? WSYNC_CHUNK_LAST : 0;
    info.count = table_.metas.size();
    info.bytes = table_.total_bytes();
    return info;
}

void Iteration::fill(std::size_t i, wsync_tensor_t *view, bool with_data) const {
    const TensorMeta &m = table_.metas[i];
    std::memset(view, 0, sizeof *view);
    view->name = m.name.c_str();
    view->shape = m.shape;
    view->strides = nullptr;
    view->ndim = m.ndim;
    view->dtype = m.dtype;
    view->device = backing_->device();
    if (with_data) {
        view->data = const_cast<void *>(backing_->data(i));
        view->flags = backing_->read_only() ? WSYNC_TENSOR_READ_ONLY : 0;
    }
}

void Iteration::peek(std::size_t i, wsync_tensor_t *view) const {
    if (i >= table_.metas.size())
        fail(WSYNC_ERR_INVALID_ARGUMENT, "peek: index " + std::to_string(i) +
                                             " is out of range (the chunk has " +
                                             std::to_string(table_.metas.size()) + " tensors)");
    fill(i, view, false);
}

bool Iteration::next(wsync_tensor_t *view) {
    if (failed_ != WSYNC_OK) fail(failed_, failure_);
    if (next_ >= table_.metas.size()) return false;
    std::size_t i = next_;
    if (verify_) {
        const TensorMeta &m = table_.metas[i];
        uint64_t got = checksum_bytes(backing_->data(i), m.nbytes);
        if (got != table_.checksums[i]) {
            failed_ = WSYNC_ERR_INTEGRITY;
            char buf[64];
            std::snprintf(buf, sizeof buf, "%016llx, computed %016llx",
                          static_cast<unsigned long long>(table_.checksums[i]),
                          static_cast<unsigned long long>(got));
            failure_ = "tensor '" + m.name + "' in " + chunk_label(header_) +
                       ": checksum mismatch (request says " + buf + ")";
            fail(failed_, failure_);
        }
    }
    fill(i, view, true);
    ++next_;
    return true;
}

void Iteration::finish(wsync_status_t outcome) noexcept {
    if (finished_) return;
    finished_ = true;
    backing_->acknowledge(outcome);
    owner_->finished(outcome);
}

void Iteration::end() {
    if (failed_ != WSYNC_OK) {
        finish(failed_);
        fail(failed_, failure_);
    }
    if (next_ < table_.metas.size()) {
        finish(WSYNC_ERR_WRONG_STATE);
        fail(WSYNC_ERR_WRONG_STATE, "iteration over " + chunk_label(header_) + " ended after " +
                                        std::to_string(next_) + " of " +
                                        std::to_string(table_.metas.size()) +
                                        " tensors; the chunk is acknowledged as failed");
    }
    finish(WSYNC_OK);
}

void check_receiver_index(const char *kind, uint32_t index, uint32_t receivers) {
    if (index >= receivers)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(kind) + ": receiver index " + std::to_string(index) +
                 " is out of range: this sync has " + std::to_string(receivers) + " receivers (0.." +
                 std::to_string(receivers - 1) + ")");
}

// ----------------------------------------------------------------------------------------------
std::vector<uint8_t> merge_requests(
    const std::vector<std::pair<const uint8_t *, std::size_t>> &parts) {
    if (parts.empty()) fail(WSYNC_ERR_INVALID_ARGUMENT, "merge: no parts (n is 0)");
    std::vector<wire::Envelope> envs;
    envs.reserve(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
        try {
            envs.push_back(wire::decode(parts[i].first, parts[i].second));
        } catch (const Error &e) {
            fail(e.status(), "merge: part " + std::to_string(i) + ": " + e.what());
        }
        if (envs.back().type != wire::BlobType::Request)
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) + " is not a request");
        if (envs.back().kind != envs.front().kind)
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) + " is for strategy '" +
                                         envs.back().kind + "', part 0 for '" +
                                         envs.front().kind + "'");
    }
    const KindInfo &kind = find_kind(envs.front().kind);
    if (!kind.merge_transports) {
        if (parts.size() != 1)
            fail(WSYNC_ERR_UNSUPPORTED, std::string("merge: strategy '") + kind.name +
                                            "' has a single sender; got " +
                                            std::to_string(parts.size()) + " parts");
        return std::vector<uint8_t>(parts[0].first, parts[0].first + parts[0].second);
    }
    ChunkHeader h0 = decode_header(envs[0].body);
    std::vector<const json *> transports;
    for (std::size_t i = 0; i < envs.size(); ++i) {
        ChunkHeader h = decode_header(envs[i].body);
        if (h.version != h0.version || h.chunk_index != h0.chunk_index || h.last != h0.last)
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) + " is " +
                                         chunk_label(h) + ", part 0 is " + chunk_label(h0));
        if (envs[i].body.at("tensors") != envs[0].body.at("tensors"))
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) +
                                         " describes other tensors than part 0");
        transports.push_back(&wire::object_field(envs[i].body, "transport", kReq));
    }
    json body = envs[0].body;
    body["transport"] = kind.merge_transports(transports);
    return wire::encode(wire::BlobType::Request, kind.name, body);
}

std::string describe_blob(const uint8_t *data, std::size_t size) {
    wire::Envelope env = wire::decode(data, size);
    json out = {{"magic", "wsync"},
                {"format", wire::kFormatVersion},
                {"type", wire::blob_type_name(env.type)},
                {"kind", env.kind},
                {"body", std::move(env.body)}};
    // Strings inside a hostile blob need not be UTF-8: replace rather than throw.
    return out.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace wsync
