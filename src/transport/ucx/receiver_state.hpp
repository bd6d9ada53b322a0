// The ucx receiver's state, shared by its two halves: the version and acknowledgement logic
// (receiver.cpp: attach, the requests the core opens, selections, answers to the trainer, the
// GPU loader's ordering) and the fetch engine (fetch.cpp: leases, fetches of a chunk's spans
// into the receive buffer, the buffer itself). Internal to the ucx kind; make_receiver()
// (receiver.hpp) makes one.
#pragma once

#include "transport/ucx/receiver.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <cstring>
#include <iterator>
#include <sys/mman.h>
#include <unistd.h>

#include "core.hpp"
#include "error.hpp"
#include "gpu/destination.hpp"
#include "gpu/device.hpp"
#include "plan/layout.hpp"
#include "transport/ucx/backing.hpp"
#include "transport/ucx/land.hpp"


namespace wsync::ucx {

class UcxReceiver final : public ReceiverImpl {
public:
    UcxReceiver(const InitInfo &info, uint32_t index, const ReceiverOptions &o)
        : info_(info), index_(index), o_(o),
          w_(std::make_unique<Worker>(o.config, std::string(kKind) + " receiver " + std::to_string(index))),
          trainer_("the trainer (session " + hex16(info.session) + ")") {
        if (o.device >= 0) {  // before the trainer hears of us: a bad ordinal attaches nothing
            dev_ = std::make_unique<gpu::Device>(gpu::cuda(), o.device, kKind);
            loaded_ = std::make_unique<gpu::Event>(*dev_);
        }
        sys::random_bytes(&token_, sizeof token_);
        ep_ = w_->connect(info.address, trainer_);
        // The hello names no host: the trainer learns our pid (for its failure records) and
        // the worker address it must answer to, MACed with the init info's key (auth.hpp).
        Msg hello;
        hello.type = MsgType::Hello;
        hello.index = index_;
        hello.token = token_;
        hello.seq = info.session;
        hello.pid = static_cast<int32_t>(getpid());
        sys::random_bytes(nonce_.data(), nonce_.size());
        hello.nonce = nonce_;
        hello.address = w_->address();
        w_->send(*ep_, seal_msg(hello, info_.key, Dir::ToTrainer));
        const sys::Deadline d(o.timeout_ms);
        awaited_ = MsgType::Welcome;
        if (!w_->wait([&] { return drain() || ep_->error != UCS_OK; }, d)) {
            teardown();
            fail(WSYNC_ERR_TIMEOUT, who() + ": " + trainer_ + " did not answer the attach within " +
                                        std::to_string(o.timeout_ms) +
                                        " ms (it answers only hellos made with its own init info's key)");
        }
        check_link("attaching");
        if (reply_.status != WSYNC_OK) {
            teardown();
            fail(static_cast<wsync_status_t>(reply_.status), who() + ": " + trainer_ + " refused it: " + reply_.text);
        }
        // The trainer offers a data stream (stream.hpp) when its "data_path" is "auto" over tcp.
        // One that cannot be made leaves Data on UCX, as for a trainer that offers none.
        if (o.config.stream && !reply_.text.empty() &&
            !w_->connect_stream(*ep_, reply_.text, key_, index_, token_, d, &stream_why_))
            stream_why_ = who() + ": chunk bytes travel over UCX: the trainer's data stream could not be made (" +
                          stream_why_ + ")";
    }

    ~UcxReceiver() override {
        stop_puller();  // the worker is this thread's again from here
        if (ep_ && ep_->error == UCS_OK) {
            Msg bye;
            bye.type = MsgType::Bye;
            send(bye);
            w_->wait([] { return false; }, sys::Deadline(20));  // let the goodbye go out
        }
        for (Msg &m : data_) w_->release(m.desc);
        data_.clear();
        teardown();
        loader_caught_up();
        const bool stuck = buffer_stuck_;
        drop_buffer();  // left to the driver while copies may still read it
        loaded_.reset();  // cuEventDestroy returns at once, even for an event not yet reached
        // Those copies may also need the device's context: it stays until the process ends.
        if (stuck && dev_) gpu::keep_until_exit(std::move(dev_));
    }

    // ---- an engine with a GPU ("device") --------------------------------------------------
    // Its receive buffer is pinned host memory, so copies into device memory are asynchronous
    // DMA on the loader's stream; every chunk's end waits for that stream (the loader's own
    // copies out of the views included) before the buffer may take the next chunk.
    bool orders_loader_work() const override { return dev_ != nullptr; }
    void set_stream(void *stream) override { loader_ = gpu::ordering_stream(stream); }

    bool device_destination(const void *dst) const { return dev_ && gpu::is_device_memory(*dev_, dst); }

    // With "device", a destination the driver knows as device memory is checked as the GPU
    // kinds check theirs; anything else is host memory, as for wsync_recv_copy.
    DestMemory describe_destination(void *data, uint64_t len,
                                    const std::function<std::string()> &what) const override {
        if (!device_destination(data)) return {};
        return gpu::describe_device_destination(*dev_, data, len, what, kKind);
    }
    void recheck_destination(const DestMemory &mem, const std::function<std::string()> &what) const override {
        if (dev_) gpu::recheck_device_destination(*dev_, mem, what);
    }

    void queue_copy(void *dst, const void *src, uint64_t len, const std::function<std::string()> &what) {
        gpu::queue_copy_host_to_device(*dev_, loader_, dst, src, len, what, kKind);
    }

    // Waits, up to timeout_ms, for the work queued on the loader's stream. When the wait fails
    // (a timeout, or a failed stream) copies still to run may read the buffer later: it takes
    // no other chunk until the loader's stream is seen past this point (loader_caught_up()).
    wsync_status_t settle(const ChunkHeader &h, wsync_status_t outcome, std::string *message) noexcept;

    // Whether the loader's stream has passed the point a failed settle gave up on (then the
    // buffer is free again). False while it has not, or cannot say (a failed stream).
    bool loader_caught_up() noexcept {
        if (!buffer_stuck_) return true;
        try {
            gpu::Device::Scope scope(*dev_);
            if (loaded_->done()) buffer_stuck_ = false;
        } catch (...) {
        }
        return !buffer_stuck_;
    }

    bool verify_checksums() const override { return o_.verify; }
    bool checksums_promised() const override { return info_.checksum; }
    bool sums_follow(const json &t) const override {
        return t.is_object() && t.contains("sums_follow") && t["sums_follow"].is_boolean() && t["sums_follow"].get<bool>();
    }
    unsigned copy_threads() const override { return o_.copy_threads; }

    Link link() const override {
        auto *self = const_cast<UcxReceiver *>(this);  // progress is not observable state
        if (self->ep_) {
            self->w_->progress();
            self->drain();
        }
        Link l;
        l.dropped = dropped_;
        l.sender_gone = !ep_ || ep_->error != UCS_OK;
        l.abandoned_version = abandoned_;
        return l;
    }

    // A whole chunk. One larger than a piece (kPullPiece) is pulled in pieces on the puller
    // thread while the loader reads it: receive returns once the lease is granted and every
    // piece asked for, and each entry is waited for when it is first read (UcxBacking::await);
    // a smaller one has landed whole when receive returns.
    std::unique_ptr<ChunkBacking> open(const ChunkHeader &h, const TensorTable &table,
                                       const json &transport) override {
        Where at = admit(h, table, transport);
        if (at.bytes <= kPullPiece) {
            pull(h, at, {Span{0, at.bytes, 0}}, at.bytes, SumRange{table.metas.size(), {{0, table.metas.size()}}});
            auto b = std::make_unique<UcxBacking>(*this, static_cast<const uint8_t *>(buf_), table.offsets, at.seq);
            b->set_header(h);
            return b;
        }
        std::vector<uint64_t> ends(table.metas.size());
        for (std::size_t i = 0; i < ends.size(); ++i) ends[i] = table.offsets[i] + table.wire_bytes(i);
        start_pull(h, at, &table);
        try {  // from here the pull runs: whatever fails ends it and answers the trainer
            auto b = std::make_unique<UcxBacking>(*this, static_cast<const uint8_t *>(buf_), table.offsets, at.seq);
            b->set_header(h);
            b->stream(std::move(ends));
            if (lander_.active()) b->land(lander_.where());
            return b;
        } catch (...) {
            give_up_pull(at.seq, h);
            throw;
        }
    }

    // Landing (land.hpp): from the next chunk pulled in pieces over the data stream on.
    bool land(std::vector<Landing> dests) override {
        if (dev_) return false;  // chunks land in pinned memory the GPU copies from
        lander_.set(std::move(dests));
        return true;
    }
    // Entry i's checksum as its bytes landed (after await(i)).
    bool landed_sum(std::size_t i, uint64_t *sum) { return lander_.sum(i, sum); }
    // Entry `entry`'s checksum of chunk seq, which followed its bytes (kFetchSums): waits for it
    // within the pull's deadline, or fails naming why it did not come (sums.cpp).
    uint64_t trailing_sum(uint64_t seq, std::size_t entry);

    // Stops the running pull (it ends at its next progress round; a receive in flight closes
    // the endpoint) and answers chunk seq as failed: nothing will read it.
    void give_up_pull(uint64_t seq, const ChunkHeader &h) noexcept;

    // Blocks until bytes [lo, hi) of the chunk being pulled have landed in our buffer, up to the
    // pull's deadline; throws the pull's failure when they did not (fetch.cpp).
    void await_range(uint64_t lo, uint64_t hi);

    const select::Spec *selection() const override { return o_.selection.get(); }

    // A selection's chunk: only the ranges move, coalesced into one fetch per run of ranges that
    // are adjacent in the trainer's buffer (at most the kTensorAlign padding between two
    // tensors apart), each run placed in our buffer at the trainer's alignment modulo
    // kTensorAlign. Nothing to fetch: no lease and no fetch (the chunk is still acknowledged).
    std::unique_ptr<ChunkBacking> open_ranges(const ChunkHeader &h, const TensorTable &table,
                                              const std::vector<ByteRange> &fetch,
                                              const json &transport) override;

    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool) noexcept override {
        try {
            Where at = parse_where(transport);
            // A chunk whose pull failed was answered there already: once is what the trainer hears.
            if (at.session == info_.session && at.seq > last_seq_ && at.seq != answered_seq_)
                answer(at.seq, h, status, message);
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t, const std::string &message) noexcept override {
        failure_text_ = message;  // said with the acknowledgement of that chunk only
        failure_version_ = h.version;
        failure_chunk_ = h.chunk_index;
    }

    // Tells the trainer we are done with chunk seq (and why it failed, if it did).
    // `applied`: with an OK answer, the nanoseconds spent applying the chunk's patches (in the
    // Ack's `offset`, unused by Acks up to 0.7.0 and covered by the MAC; 0: none).
    void answer(uint64_t seq, const ChunkHeader &h, wsync_status_t status, const std::string &message,
                uint64_t applied = 0) noexcept {
        try {
            Msg ack;
            ack.type = MsgType::Ack;
            ack.seq = seq;
            if (status == WSYNC_OK) ack.offset = applied;
            ack.version = h.version;
            ack.chunk = h.chunk_index;
            ack.status = status;
            const bool recorded = !failure_text_.empty() && failure_version_ == h.version &&
                                  failure_chunk_ == h.chunk_index;
            ack.text = status == WSYNC_OK ? std::string() : (recorded ? failure_text_ : message);
            failure_text_.clear();
            if (ep_) {
                send(ack);
                w_->progress();
            }
        } catch (...) {
        }
    }

private:
    // Bytes [remote, remote + bytes) of the trainer's memory, read to buf_ + local.
    struct Span {
        uint64_t remote = 0, bytes = 0, local = 0;
    };

    std::string who() const { return std::string(kKind) + " receiver " + std::to_string(index_); }

    // Verifies every block checksum a fetched range covers whole (a range that is a whole entry
    // is left to the entry's own checksum, which the core verifies). Blocks a range covers only
    // in part are not verified. WSYNC_ERR_INTEGRITY naming the tensor and the block; the
    // trainer hears of it.
    template <class Entries>
    void verify_blocks(const ChunkHeader &h, const Where &at, const TensorTable &table,
                       const std::vector<ByteRange> &fetch, const std::vector<uint64_t> &local,
                       const Entries &entries);

    void check_addressed(const json &transport) const override {
        const uint64_t session = wire::uint_field(transport, "session", "ucx request", UINT64_MAX);
        if (session != info_.session)
            fail(WSYNC_ERR_MISMATCH, who() + ": request is from trainer session " + std::to_string(session) +
                                         ", this receiver's init info is of session " +
                                         std::to_string(info_.session) +
                                         " (another trainer's, or a restarted one's: left unchanged)");
    }

    // Checks a request's transport map and table before anything moves.
    Where admit(const ChunkHeader &, const TensorTable &table, const json &transport) {
        Where at = parse_where(transport);
        if (at.session != info_.session)
            fail(WSYNC_ERR_MISMATCH, who() + ": request is from another trainer session than its init info");
        if (at.seq <= last_seq_)
            fail(WSYNC_ERR_MISMATCH, who() + ": request carries chunk seq " + std::to_string(at.seq) +
                                         ", already received seq " + std::to_string(last_seq_));
        layout::check(table, at.bytes, "ucx request", "chunk");
        return at;
    }

    // Ranges of entries (first, count) of a chunk of `entries`, at most kSumFetches of them
    // (checksums that follow the bytes).
    struct SumRange {
        std::size_t entries = 0;
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
    };
    static constexpr std::size_t kSumFetches = 16;
    // Leases the chunk and fetches every span into our buffer (`need` bytes of it), all in flight
    // at once, each bounded by the deadline; on any failure the trainer hears of it.
    void pull(const ChunkHeader &h, const Where &at, const std::vector<Span> &spans, uint64_t need,
              const SumRange &sums);

    // Asks the trainer for every span (a Fetch each, numbered) and takes each answer into place:
    // an eager payload is copied, a rendezvous one received straight into our buffer; all in
    // flight at once, bounded by the deadline. Only an authentic Data message that answers a
    // fetch still outstanding, with its range and size, is taken; the trainer's refusal (a
    // range past the chunk, no lease) fails the chunk with its status and text.
    // `sums`: also the checksums that follow the bytes, of those entries.
    void fetch(const Where &at, const std::vector<Span> &spans, const std::string &chunk, const sys::Deadline &deadline,
               const SumRange &sums);

    static std::string hex16(uint64_t v) {
        char b[17];
        std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
        return b;
    }

    // Sends the trainer a message sealed with the connection's key, numbered.
    void send(Msg m) {
        m.index = index_;
        m.token = token_;
        m.number = ++sent_;
        w_->send(*ep_, seal_msg(m, key_, Dir::ToTrainer));
    }

    // Whether a message is the trainer's: for us (index, token), MACed with the connection's
    // key and numbered above the last one. The welcome brings the trainer's nonce, from which
    // (with ours) the connection's key is made. Anything else is dropped: whoever reaches our
    // worker without the key cannot make us act.
    bool from_trainer(const Msg &m) {
        if (m.index != index_ || m.token != token_) return false;
        if (m.type == MsgType::Welcome) {
            if (attached_ || m.number != 1) return false;
            const Key key = connection_key(info_.key, index_, token_, nonce_, m.nonce);
            if (!authentic(m, key, Dir::ToEngine)) return false;
            key_ = key;
            attached_ = true;
            heard_ = 1;
            return true;
        }
        if (!attached_ || m.number <= heard_ || !authentic(m, key_, Dir::ToEngine)) return false;
        heard_ = m.number;
        return true;
    }

    // Handles the messages that arrived; true once the awaited reply has.
    bool drain() {
        bool got = false;
        for (Msg &m : w_->take_inbox()) {
            if (m.type == MsgType::Data) {  // no rising number: fetch() matches it to a fetch
                if (attached_ && m.index == index_ && m.token == token_ && authentic(m, key_, Dir::ToEngine))
                    data_.push_back(std::move(m));
                else
                    w_->release(m.desc);
                continue;
            }
            if (!from_trainer(m)) continue;
            if (m.type == MsgType::Abandon) abandoned_ = std::max(abandoned_, m.version);
            else if (m.type == MsgType::Dropped) dropped_ = true;
            else if (m.type == awaited_ && (m.type != MsgType::Grant || m.seq == awaited_seq_)) {
                reply_ = std::move(m);
                got = true;
            }
        }
        return got;
    }

    void check_link(const std::string &when) {
        if (!ep_) fail(WSYNC_ERR_PEER, who() + ": the connection to " + trainer_ + " was closed after an earlier failure");
        if (ep_->error != UCS_OK)
            fail(WSYNC_ERR_PEER, who() + ": " + trainer_ + " is unreachable " + when + " (" +
                                     w_->api().ucs_status_string(ep_->error) +
                                     "): its process died or the network to it failed");
    }

    void lease(uint64_t seq, const std::string &chunk, const sys::Deadline &deadline);
    // Asks the trainer for bytes `span.remote`.. of chunk seq as fetch `number`.
    void ask(uint64_t seq, uint64_t number, const Span &span, uint32_t what = 0);
    // Checksums that follow the bytes (init_info.hpp, kFetchSums): chunk seq of `entries`
    // entries will bring some (expect_sums, before they are asked for); take_sums: whether
    // those of entries [range.remote, + range.bytes / 8) arrived (at sum_bytes_ + range.local)
    // with the MAC `mac`, then known (sums_, known_, under pull_mu_; trailing_sum waits).
    void expect_sums(uint64_t seq, std::size_t entries);
    bool take_sums(uint64_t seq, uint64_t number, const Nonce &mac, const Span &range);

    // What pull() and start_pull() check before asking for a chunk (the link, a drop, a loader
    // still stuck on an earlier chunk); returns the chunk's name for messages.
    std::string before_pull(const ChunkHeader &h, const Where &at, uint64_t moved);

    // ---- the puller: a chunk pulled in pieces while the loader reads it --------------------
    // start_pull() (the caller's thread) leases the chunk and asks for every piece, then hands
    // the worker to the puller thread, which alone progresses it until the pull ends: every
    // piece landed or refused, the link failed, the deadline passed, or the receiver is being
    // destroyed. The caller's thread touches no UCX state meanwhile: it waits on pull_cv_ for
    // the pieces an entry needs (await_range) and, at the chunk's end, for the whole pull
    // (finish_pull), after which the worker is its own again. Who writes what:
    //   pull_.pieces' span/number: start_pull, before the handoff; req: the puller only;
    //   landed/answered, status/why, running: the puller, under pull_mu_;
    //   active: start_pull sets it, finish_pull clears it (both under pull_mu_).
    static constexpr uint64_t kPullPiece = 4 << 20;  // bytes a piece holds at least
    // The most pieces of one chunk: with kSumFetches fetches of checksums, 48 of the 64 fetches
    // the trainer queues for one receiver (kFetchesQueued).
    static constexpr uint64_t kPullPieces = 32;
    struct Piece {
        Span span;
        uint64_t number = 0;   // the fetch's number, matched by its Data message
        void *req = nullptr;   // the rendezvous receive in flight
        bool landed = false;   // its bytes are in our buffer
        bool answered = false; // landed, refused or failed: nothing more will come for it
        bool sums = false;     // the chunk's checksums (kFetchSums), the last piece: into sum_bytes_
        Nonce mac{};           // sums: its Data message's nonce (sums_mac)
    };
    struct Pull {
        std::vector<Piece> pieces;
        uint64_t seq = 0;
        std::string chunk;
        int64_t timeout_ms = 0;
        std::chrono::steady_clock::time_point end;
        bool active = false, running = false;
        wsync_status_t status = WSYNC_OK;
        std::string why;
    };
    // `table`: the chunk's, to plan its landing (lander_) when landing is on and the endpoint
    // has a data stream; else nothing lands.
    void start_pull(const ChunkHeader &h, const Where &at, const TensorTable *table);
    void puller_main();
    void run_pull();
    // Waits (bounded) for the pull to end; returns its failure, or WSYNC_OK. No-op when none.
    std::pair<wsync_status_t, std::string> finish_pull() noexcept;
    void stop_puller() noexcept;

    // The receive buffer: anonymous pages, or pinned host memory for an engine with a GPU.
    void ensure_buffer(uint64_t bytes);

    // Frees the receive buffer; a pinned one that copies a wait gave up on may
    // still read is left to the driver (freeing pinned memory may wait for them).
    void drop_buffer() noexcept;

    void teardown() noexcept {
        if (ep_) w_->close(std::move(ep_), sys::Deadline(std::min<int64_t>(o_.timeout_ms, 2000)));
    }

    std::vector<uint8_t> sum_bytes_;  // kFetchSums answers' payloads as they arrive, 8 bytes an entry
    std::vector<uint64_t> sums_;      // chunk sums_seq_'s, checked, where known_ (pull_mu_)
    std::vector<uint8_t> known_;
    uint64_t sums_seq_ = 0;
    InitInfo info_;
    uint32_t index_;
    ReceiverOptions o_;
    std::unique_ptr<Worker> w_;
    std::string trainer_;
    std::unique_ptr<Endpoint> ep_;
    uint64_t token_ = 0;
    Nonce nonce_{};       // ours, in the hello
    Key key_{};           // the connection's, once the welcome came (auth.hpp)
    bool attached_ = false;
    std::string stream_why_;  // why no data stream was made, where one was offered
    uint64_t sent_ = 0, heard_ = 0;  // numbers of the last message sent and heard
    MsgType awaited_ = MsgType::Welcome;
    uint64_t awaited_seq_ = 0;
    Msg reply_;
    uint64_t last_seq_ = 0, abandoned_ = 0;
    uint64_t answered_seq_ = 0;  // a chunk answered as failed when its pull failed to start
    bool dropped_ = false;
    std::string failure_text_;  // record_failure's, for the chunk it names
    uint64_t failure_version_ = 0;
    uint32_t failure_chunk_ = 0;
    void *buf_ = nullptr;
    uint64_t cap_ = 0;
    Lander lander_;  // wsync_receiver_land's destinations and the plan of the chunk being pulled
    uint64_t fetches_ = 0;  // the number of the last fetch asked for
    std::vector<Msg> data_;  // authentic Data messages drained, for fetch()
    std::unique_ptr<gpu::Device> dev_;           // "device": the engine's GPU, else null
    std::unique_ptr<gpu::DeviceBuffer> pinned_;  // buf_'s memory when dev_
    std::unique_ptr<gpu::Event> loaded_;         // marks the loader's stream at a chunk's end
    gpu::CUstream loader_ = gpu::CU_STREAM_LEGACY;
    bool buffer_stuck_ = false;  // a wait for the loader's stream failed: buf_ may still be read
    std::string stuck_chunk_;    // the chunk of that wait, for messages
    std::mutex pull_mu_;
    std::condition_variable pull_cv_;
    Pull pull_;
    std::atomic<bool> cancel_{false};  // the puller stops at its next progress round
    bool stop_ = false;                // under pull_mu_: the puller thread exits
    std::thread puller_;
};

}  // namespace wsync::ucx
