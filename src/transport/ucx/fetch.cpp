// The ucx receiver's fetch engine: a chunk's lease, the fetches of its spans into the receive
// buffer, and that buffer (receiver_state.hpp says how the receiver is split).
#include "transport/ucx/receiver_state.hpp"

namespace wsync::ucx {

void UcxReceiver::pull(const ChunkHeader &h, const Where &at, const std::vector<Span> &spans, uint64_t need) {
    uint64_t moved = 0;
    for (const Span &s : spans) moved += s.bytes;
    const std::string chunk = chunk_label(h) + " (seq " + std::to_string(at.seq) + ", " +
                              std::to_string(at.bytes) + " bytes" +
                              (moved == at.bytes ? std::string() : ", " + std::to_string(moved) + " of them selected") + ")";
    check_link("before reading " + chunk);
    if (dropped_)
        fail(WSYNC_ERR_PEER, who() + ": dropped by " + trainer_);
    // Nothing lands in a buffer that copies given up on may still read: a loader's stream
    // that is still stuck fails the chunk at once (the trainer hears of it).
    if (!loader_caught_up()) {
        const std::string why = who() + ": the loader's work on " + gpu::stream_text(loader_) + " for " +
                                stuck_chunk_ + " has still not finished; " + chunk + " is not read";
        answer(at.seq, h, WSYNC_ERR_TIMEOUT, why);
        fail(WSYNC_ERR_TIMEOUT, why);
    }
    const sys::Deadline deadline(o_.timeout_ms);
    lease(at.seq, chunk, deadline);
    // From here the trainer holds the chunk for us until we answer seq.
    try {
        ensure_buffer(need);
        fetch(at, spans, chunk, deadline);
    } catch (const Error &e) {
        answer(at.seq, h, e.status(), e.what());
        throw;
    }
    last_seq_ = at.seq;
}

void UcxReceiver::fetch(const Where &at, const std::vector<Span> &spans, const std::string &chunk, const sys::Deadline &deadline) {
    struct Want {
        Span span;
        uint64_t number;
        bool done = false;
    };
    std::vector<Want> wants;
    for (const Span &sp : spans)
        if (sp.bytes) wants.push_back(Want{sp, ++fetches_});
    for (const Want &w : wants) {
        Msg m;
        m.type = MsgType::Fetch;
        m.seq = at.seq;
        m.version = w.number;
        m.offset = w.span.remote;
        m.bytes = w.span.bytes;
        send(m);
    }
    std::vector<void *> reqs;
    std::size_t left = wants.size();
    std::string refused;
    wsync_status_t refused_status = WSYNC_OK;
    auto take = [&] {
        drain();
        for (Msg &d : data_) {
            auto w = std::find_if(wants.begin(), wants.end(), [&](const Want &x) {
                return !x.done && x.number == d.version && x.span.remote == d.offset && x.span.bytes == d.bytes &&
                       d.seq == at.seq;
            });
            if (w == wants.end()) {
                w_->release(d.desc);  // answers nothing outstanding: given back
                continue;
            }
            w->done = true;
            --left;
            if (d.status != WSYNC_OK || d.length != d.bytes) {
                w_->release(d.desc);
                if (refused_status == WSYNC_OK) {
                    refused_status = d.status != WSYNC_OK ? static_cast<wsync_status_t>(d.status) : WSYNC_ERR_MALFORMED;
                    refused = d.status != WSYNC_OK ? d.text
                                                   : "the trainer sent " + std::to_string(d.length) + " bytes for a fetch of " +
                                                         std::to_string(d.bytes);
                }
                continue;
            }
            uint8_t *dst = static_cast<uint8_t *>(buf_) + w->span.local;
            if (d.desc) {
                void *req = w_->receive(d.desc, dst, d.bytes, chunk + " from " + trainer_);
                if (req) reqs.push_back(req);
            } else {
                std::memcpy(dst, d.payload.data(), d.bytes);
            }
        }
        data_.clear();
        return left == 0 || ep_->error != UCS_OK;
    };
    ucs_status_t st = UCS_OK;
    try {
        if (!w_->wait(take, deadline)) st = UCS_ERR_TIMED_OUT;
    } catch (...) {
        if (!reqs.empty()) teardown();  // receives in flight may still land: no buffer reuse
        throw;
    }
    for (void *req : reqs) {
        const ucs_status_t one = finish(*w_, req, *ep_, deadline);
        if (st == UCS_OK) st = one;
    }
    if (st == UCS_ERR_TIMED_OUT) {
        teardown();  // a rendezvous receive may still land: no buffer reuse until the endpoint is gone
        fail(WSYNC_ERR_TIMEOUT, who() + ": reading " + chunk + " from " + trainer_ + " did not finish within " +
                                    std::to_string(o_.timeout_ms) + " ms; the connection is closed");
    }
    check_link("reading " + chunk);
    if (st != UCS_OK) ucs_fail(w_->api(), st, who() + ": reading " + chunk + " from " + trainer_, WSYNC_ERR_PEER);
    if (refused_status != WSYNC_OK)
        fail(refused_status, who() + ": " + trainer_ + " refused to send " + chunk + ": " + refused);
}

void UcxReceiver::lease(uint64_t seq, const std::string &chunk, const sys::Deadline &deadline) {
    Msg m;
    m.type = MsgType::Lease;
    m.seq = seq;
    send(m);
    awaited_ = MsgType::Grant;
    awaited_seq_ = seq;
    if (!w_->wait([&] { return drain() || ep_->error != UCS_OK; }, deadline))
        fail(WSYNC_ERR_TIMEOUT, who() + ": " + trainer_ + " did not grant " + chunk + " within " +
                                    std::to_string(o_.timeout_ms) + " ms");
    check_link("asking for " + chunk);
    if (reply_.status != WSYNC_OK)
        fail(static_cast<wsync_status_t>(reply_.status), who() + ": " + chunk + ": " + reply_.text);
}

void UcxReceiver::ensure_buffer(uint64_t bytes) {
    if (bytes <= cap_ && !buffer_stuck_) return;
    drop_buffer();
    const uint64_t cap = (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20);
    void *p = nullptr;
    std::unique_ptr<gpu::DeviceBuffer> pinned;
    if (dev_) {
        pinned = std::make_unique<gpu::DeviceBuffer>(*dev_, cap, who() + ": its receive buffer",
                                                     gpu::DeviceBuffer::Where::kPinnedHost);
        p = pinned->host();
    } else {
        p = mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            fail(WSYNC_ERR_NO_MEMORY, who() + ": cannot map " + std::to_string(cap) + " bytes for a chunk");
        // No MADV_HUGEPAGE: on the CI VM the first touch of 618 MiB advised so took 4.1-5.2 s
        // (huge-page zeroing and compaction) against 0.28-0.36 s without, and it landed in a
        // sync (docs/delta.md, "Crossover cells where auto lost").
    }
    buf_ = p;
    cap_ = cap;
    pinned_ = std::move(pinned);
}

void UcxReceiver::drop_buffer() noexcept {
    if (!buf_) return;
    if (pinned_) {
        if (buffer_stuck_) pinned_->leak();
        pinned_.reset();
    } else {
        munmap(buf_, cap_);
    }
    buf_ = nullptr;
    cap_ = 0;
    buffer_stuck_ = false;
}

}  // namespace wsync::ucx
