// The ucx receiver's fetch engine: a chunk's lease, the fetches of its spans into the receive
// buffer, and that buffer (receiver_state.hpp says how the receiver is split).
#include "transport/ucx/receiver_state.hpp"

namespace wsync::ucx {

std::string UcxReceiver::before_pull(const ChunkHeader &h, const Where &at, uint64_t moved) {
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
        answered_seq_ = at.seq;
        fail(WSYNC_ERR_TIMEOUT, why);
    }
    return chunk;
}

void UcxReceiver::pull(const ChunkHeader &h, const Where &at, const std::vector<Span> &spans, uint64_t need,
                       const SumRange &sums) {
    uint64_t moved = 0;
    for (const Span &s : spans) moved += s.bytes;
    const std::string chunk = before_pull(h, at, moved);
    const sys::Deadline deadline(o_.timeout_ms);
    lease(at.seq, chunk, deadline);
    // From here the trainer holds the chunk for us until we answer seq.
    try {
        ensure_buffer(need);
        fetch(at, spans, chunk, deadline, at.sums_follow && o_.verify ? sums : SumRange{});
    } catch (const Error &e) {
        answer(at.seq, h, e.status(), e.what());
        answered_seq_ = at.seq;
        throw;
    }
    last_seq_ = at.seq;
}

void UcxReceiver::fetch(const Where &at, const std::vector<Span> &spans, const std::string &chunk,
                        const sys::Deadline &deadline, const SumRange &sums) {
    struct Want {
        Span span;
        uint64_t number;
        bool done = false;
        bool sums = false;
        Nonce mac{};
    };
    std::vector<Want> wants;
    for (const Span &sp : spans)
        if (sp.bytes) wants.push_back(Want{sp, ++fetches_});
    if (!sums.ranges.empty()) {  // after the bytes: the trainer hashes them as it sends them
        expect_sums(at.seq, sums.entries);
        for (const auto &[first, count] : sums.ranges)
            wants.push_back(Want{Span{first, count * 8, first * 8}, ++fetches_, false, true, {}});
    }
    for (const Want &w : wants) ask(at.seq, w.number, w.span, w.sums ? kFetchSums : 0);
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
            uint8_t *dst = w->sums ? sum_bytes_.data() + w->span.local : static_cast<uint8_t *>(buf_) + w->span.local;
            w->mac = d.nonce;
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
    for (const Want &w : wants)
        if (w.sums && !take_sums(at.seq, w.number, w.mac, w.span))
            fail(WSYNC_ERR_PEER, who() + ": the checksums that followed " + chunk + " fail their MAC");
}

void UcxReceiver::ask(uint64_t seq, uint64_t number, const Span &span, uint32_t what) {
    Msg m;
    m.type = MsgType::Fetch;
    m.chunk = what;
    m.seq = seq;
    m.version = number;  // a fetch's number travels in `version`; its Data message echoes it
    m.offset = span.remote;
    m.bytes = span.bytes;
    send(m);
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

// ---- the puller --------------------------------------------------------------------------

void UcxReceiver::start_pull(const ChunkHeader &h, const Where &at, const TensorTable *table) {
    const std::string chunk = before_pull(h, at, at.bytes);
    const sys::Deadline deadline(o_.timeout_ms);
    lease(at.seq, chunk, deadline);
    // From here the trainer holds the chunk for us until we answer seq: the iteration's end
    // answers it, once the pull has ended (settle).
    Pull job;
    try {
        // The thread first: nothing is asked for that no one could receive.
        try {
            if (!puller_.joinable()) puller_ = sys::start_thread([this] { puller_main(); });
        } catch (const std::exception &e) {
            fail(WSYNC_ERR_SYSTEM, who() + ": cannot start its puller thread for " + chunk + ": " + e.what());
        }
        ensure_buffer(at.bytes);
        // Pieces of at least kPullPiece, at most kPullPieces of them (whole 64 KiB apart from the
        // last), so the trainer queues every fetch of the chunk (kFetchesQueued).
        const uint64_t even = (at.bytes + kPullPieces - 1) / kPullPieces;
        const uint64_t piece = std::max<uint64_t>(kPullPiece, (even + 65535) / 65536 * 65536);
        for (uint64_t off = 0; off < at.bytes; off += piece) {
            Piece p;
            p.span = Span{off, std::min(piece, at.bytes - off), off};
            p.number = ++fetches_;
            job.pieces.push_back(p);
        }
        // Checksums that follow the bytes: after each piece (each `every` pieces, so at most
        // kSumFetches of them: the trainer queues every fetch of the chunk with room to spare),
        // those of the entries that end in it (in table order; an entry never before the one
        // ahead of it), so each entry can be verified as soon as its bytes are in. After the data
        // pieces in `pieces` (the lander counts those from 0), asked for in turn with them.
        std::vector<std::size_t> order;
        const std::size_t data = job.pieces.size();
        if (at.sums_follow && o_.verify && table) {
            const std::size_t n = table->metas.size();
            const std::size_t every = (data + kSumFetches - 1) / kSumFetches;
            expect_sums(at.seq, n);
            std::size_t i = 0;
            for (std::size_t k = 0; k < data; ++k) {
                order.push_back(k);
                if ((k + 1) % every && k + 1 != data) continue;
                const uint64_t hi = job.pieces[k].span.remote + job.pieces[k].span.bytes;
                const std::size_t first = i;
                while (i < n && (k + 1 == data || table->offsets[i] + table->wire_bytes(i) <= hi)) ++i;
                if (i == first) continue;
                Piece p;
                p.span = Span{first, (i - first) * 8, first * 8};
                p.number = ++fetches_;
                p.sums = true;
                order.push_back(job.pieces.size());
                job.pieces.push_back(p);
            }
        } else {
            for (std::size_t k = 0; k < data; ++k) order.push_back(k);
        }
        for (std::size_t k : order) {
            const Piece &p = job.pieces[k];
            ask(at.seq, p.number, p.span, p.sums ? kFetchSums : 0);
        }
    } catch (const Error &e) {
        answer(at.seq, h, e.status(), e.what());
        answered_seq_ = at.seq;
        throw;
    }
    last_seq_ = at.seq;
    lander_.clear();
    if (table && lander_.on() && ep_ && w_->streams(*ep_)) {
        std::vector<std::pair<uint64_t, uint64_t>> spans;
        for (const Piece &p : job.pieces)
            if (!p.sums) spans.emplace_back(p.span.remote, p.span.bytes);
        lander_.plan(*table, o_.verify && table->tree_sums && (!table->checksums.empty() || table->sums_follow),
                     std::move(spans));
    }
    job.seq = at.seq;
    job.chunk = chunk;
    job.timeout_ms = o_.timeout_ms;
    job.end = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline.remaining_ms());
    job.active = job.running = true;
    {
        std::lock_guard<std::mutex> lk(pull_mu_);
        pull_ = std::move(job);
    }
    pull_cv_.notify_all();
}

void UcxReceiver::puller_main() {
    std::unique_lock<std::mutex> lk(pull_mu_);
    for (;;) {
        pull_cv_.wait(lk, [&] { return stop_ || pull_.running; });
        if (stop_) return;
        lk.unlock();
        try {
            run_pull();
        } catch (...) {  // no memory for a message, say: the pull ends, failed, whatever it held
            for (Piece &p : pull_.pieces)
                if (p.req) w_->request_free(p.req), p.req = nullptr;
            teardown();
            lk.lock();
            if (pull_.status == WSYNC_OK) {
                pull_.status = WSYNC_ERR_SYSTEM;
                pull_.why = who() + ": pulling " + pull_.chunk + " failed inside the receiver; the connection is closed";
            }
            lk.unlock();
        }
        lk.lock();
        pull_.running = false;
        pull_cv_.notify_all();
    }
}

// On the puller thread, which alone uses the worker until it returns.
void UcxReceiver::run_pull() {
    std::vector<Piece> &pieces = pull_.pieces;  // its size and spans are fixed while we run
    const uint64_t seq = pull_.seq;
    const std::string &chunk = pull_.chunk;
    const sys::Deadline deadline(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(pull_.end - std::chrono::steady_clock::now()).count()));
    std::size_t left = pieces.size();
    wsync_status_t status = WSYNC_OK;
    std::string why;
    auto answered = [&](Piece &p, bool landed) {
        std::lock_guard<std::mutex> lk(pull_mu_);
        p.landed = landed;
        p.answered = true;
        --left;
        pull_cv_.notify_all();
    };
    auto refused = [&](wsync_status_t st, std::string text) {
        if (status != WSYNC_OK) return;
        status = st;
        why = std::move(text);
    };
    auto sums_in = [&](Piece &p) {
        const bool ok = take_sums(seq, p.number, p.mac, p.span);
        if (!ok) refused(WSYNC_ERR_PEER, who() + ": the checksums that followed " + chunk + " fail their MAC");
        answered(p, ok);
    };
    auto take = [&] {
        drain();
        for (Msg &d : data_) {
            auto p = std::find_if(pieces.begin(), pieces.end(), [&](const Piece &x) {
                return !x.answered && !x.req && x.number == d.version && x.span.remote == d.offset &&
                       x.span.bytes == d.bytes && d.seq == seq;
            });
            if (p == pieces.end()) {
                w_->release(d.desc);  // answers nothing outstanding: given back
                continue;
            }
            if (d.status != WSYNC_OK || d.length != d.bytes) {
                w_->release(d.desc);
                refused(d.status != WSYNC_OK ? static_cast<wsync_status_t>(d.status) : WSYNC_ERR_MALFORMED,
                        who() + ": " + trainer_ + " refused to send " + chunk + ": " +
                            (d.status != WSYNC_OK ? d.text
                                                  : "the trainer sent " + std::to_string(d.length) +
                                                        " bytes for a fetch of " + std::to_string(d.bytes)));
                answered(*p, false);
                continue;
            }
            uint8_t *dst = static_cast<uint8_t *>(buf_) + p->span.local;
            if (p->sums) {  // checksums of some entries (kFetchSums): checked once they are in
                p->mac = d.nonce;
                uint8_t *to = sum_bytes_.data() + p->span.local;
                if (d.desc) p->req = w_->receive(d.desc, to, d.bytes, chunk + " from " + trainer_);
                else std::memcpy(to, d.payload.data(), d.bytes);
                if (!p->req) sums_in(*p);
            } else if (lander_.active()) {
                // Landing: only the data stream writes into the engine's memory (a stream that
                // is closed writes no more; a UCX receive could still land after a failure).
                if (!w_->is_stream_desc(d.desc)) {
                    w_->release(d.desc);
                    refused(WSYNC_ERR_PEER, who() + ": " + trainer_ + " sent a piece of " + chunk +
                                                " off its data stream, which this receiver lands in the engine's memory");
                    answered(*p, false);
                    continue;
                }
                const std::size_t k = static_cast<std::size_t>(p - pieces.begin());
                p->req = w_->receive_scattered(d.desc, lander_.scatter(p->span.remote, p->span.bytes, dst),
                                               [this, k](uint64_t upto) { lander_.landed(k, upto); },
                                               chunk + " from " + trainer_);
                if (!p->req) answered(*p, true);
            } else if (d.desc) {
                p->req = w_->receive(d.desc, dst, d.bytes, chunk + " from " + trainer_);
                if (!p->req) answered(*p, true);
            } else {
                std::memcpy(dst, d.payload.data(), d.bytes);
                answered(*p, true);
            }
        }
        data_.clear();
        for (Piece &p : pieces) {
            if (!p.req) continue;
            const ucs_status_t st = w_->request_status(p.req);
            if (st == UCS_INPROGRESS) continue;
            w_->request_free(p.req);
            p.req = nullptr;
            if (st != UCS_OK)
                refused(WSYNC_ERR_PEER, who() + ": reading " + chunk + " from " + trainer_ + ": " +
                                            w_->api().ucs_status_string(st));
            if (st == UCS_OK && p.sums) sums_in(p);
            else answered(p, st == UCS_OK);
        }
        return left == 0 || ep_->error != UCS_OK || cancel_.load(std::memory_order_relaxed);
    };
    bool in_time = true;
    try {
        // No spinning: this thread runs beside the loader's, which needs the core more.
        in_time = w_->wait(take, deadline, std::chrono::microseconds(0));
    } catch (const Error &e) {  // a receive UCX refused to start
        refused(e.status(), e.what());
    }
    bool in_flight = false;
    for (const Piece &p : pieces) in_flight = in_flight || p.req;
    if (ep_->error != UCS_OK) {
        status = WSYNC_ERR_PEER;
        why = who() + ": " + trainer_ + " is unreachable reading " + chunk + " (" +
              w_->api().ucs_status_string(ep_->error) + "): its process died or the network to it failed";
    } else if (!in_time) {
        status = WSYNC_ERR_TIMEOUT;
        why = who() + ": reading " + chunk + " from " + trainer_ + " did not finish within " +
              std::to_string(pull_.timeout_ms) + " ms; the connection is closed";
    } else if (cancel_.load() && left) {
        refused(WSYNC_ERR_TIMEOUT, who() + ": stopped reading " + chunk + " from " + trainer_ +
                                       " before every piece arrived; the connection is closed");
    } else if (left && status == WSYNC_OK) {
        refused(WSYNC_ERR_SYSTEM, who() + ": reading " + chunk + " stopped with pieces unanswered");
    }
    // A rendezvous receive still in flight, or one whose Data message is still to come, may land
    // later: no buffer reuse until the endpoint is gone.
    if (in_flight || !in_time) {
        for (Piece &p : pieces)
            if (p.req) {
                w_->request_free(p.req);  // released by UCX once the endpoint's close ends it
                p.req = nullptr;
            }
        teardown();
    }
    std::lock_guard<std::mutex> lk(pull_mu_);
    pull_.status = status;
    pull_.why = std::move(why);
}

void UcxReceiver::await_range(uint64_t lo, uint64_t hi) {
    std::unique_lock<std::mutex> lk(pull_mu_);
    if (!pull_.active || hi <= lo) return;
    auto here = [&] {
        for (const Piece &p : pull_.pieces)
            if (!p.sums && p.span.remote < hi && lo < p.span.remote + p.span.bytes && !p.landed) return false;
        return true;
    };
    // The puller ends by the pull's deadline; past it (and a grace) it is told to stop.
    if (!pull_cv_.wait_until(lk, pull_.end + std::chrono::seconds(2), [&] { return here() || !pull_.running; })) {
        cancel_ = true;
        w_->signal();
    }
    if (here()) return;
    lk.unlock();
    auto [status, why] = finish_pull();
    fail(status != WSYNC_OK ? status : WSYNC_ERR_SYSTEM,
         why.empty() ? who() + ": bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ") never arrived" : why);
}

std::pair<wsync_status_t, std::string> UcxReceiver::finish_pull() noexcept {
    std::unique_lock<std::mutex> lk(pull_mu_);
    if (!pull_.active) return {WSYNC_OK, std::string()};
    if (!pull_cv_.wait_until(lk, pull_.end + std::chrono::seconds(2), [&] { return !pull_.running; })) {
        cancel_ = true;
        w_->signal();
        pull_cv_.wait(lk, [&] { return !pull_.running; });  // the next progress round sees cancel_
    }
    pull_.active = false;
    cancel_ = false;
    std::pair<wsync_status_t, std::string> out{pull_.status, std::move(pull_.why)};
    pull_.pieces.clear();
    return out;
}

void UcxReceiver::give_up_pull(uint64_t seq, const ChunkHeader &h) noexcept {
    cancel_ = true;
    w_->signal();
    finish_pull();
    answer(seq, h, WSYNC_ERR_SYSTEM, who() + ": " + chunk_label(h) + " was given up before the engine could read it");
    answered_seq_ = seq;
}

void UcxReceiver::stop_puller() noexcept {
    finish_pull();
    {
        std::lock_guard<std::mutex> lk(pull_mu_);
        stop_ = true;
    }
    pull_cv_.notify_all();
    if (puller_.joinable()) puller_.join();
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
