// Receiver: the order of requests, the version transaction (version_state.hpp), what a
// receiver records and acknowledges, and poll (the core half every kind shares; src/core.hpp).
// Its transport is a ReceiverImpl; an open chunk is an Iteration (iteration.cpp).
#include "core.hpp"

#include <algorithm>
#include <cstring>

#include "copy/copy.hpp"
#include "error.hpp"

namespace wsync {

namespace {

constexpr const char *kReq = "request";  // blob type named in wire errors

}  // namespace

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
    state_.fail(status);
}

void Receiver::lose_open_version(const ChunkHeader &next) {
    // A chunk of a newer version while one is open here, not failed and not abandoned (catch_up
    // has failed an abandoned one): the sender committed it and its chunks from state_.expect() on
    // never reached this receiver. It fails here, and the trainer hears of it from this record,
    // written before the transport acknowledges those chunks as missed (so a flush that the
    // acknowledgements release finds the record).
    if (!state_.open()) return;
    const std::string why = "chunks from " + std::to_string(state_.expect()) + " of version " +
                            std::to_string(state_.version()) +
                            " never reached this receiver (lost or reordered): " +
                            chunk_label(next) + " came next";
    ChunkHeader lost;
    lost.version = state_.version();
    lost.chunk_index = state_.expect();
    impl_->record_failure(lost, WSYNC_ERR_MISMATCH, why);
    fail_open_version(WSYNC_ERR_MISMATCH);
    state_.set_why(why);
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
    const uint64_t first = state_.version() + 1, last = next.version - 1;
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
    if (newest >= first) state_.skipped(newest, WSYNC_ERR_MISMATCH);
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
        state_.begin(h.version);
        parts_ = parts::Tracker();
    }
    if (h.version != state_.version()) return;
    state_.expect_after(h.chunk_index);
    // ABANDONED is not answered: the trainer abandoned the version, or no longer keeps it
    // (ucx keep_versions: this engine lags, and catches up with the newest kept version), and
    // the transport has answered already where it must (shm's withdrawn chunk). Review: it
    // answered twice on shm, and on ucx the trainer's flush failed with PEER for a version it
    // had abandoned or retired itself.
    if (status != WSYNC_ERR_ABANDONED) impl_->refuse(h, transport, status, why, true);
    fail_open_version(status);
    state_.explain(why);
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
    const uint64_t current = state_.version();
    if (current && link.abandoned_version == current) {
        fail_open_version(WSYNC_ERR_ABANDONED);
        state_.set_why("the sender abandoned version " + std::to_string(current));
    } else if (current && link.sender_gone) {
        fail_open_version(WSYNC_ERR_PEER);
        state_.set_why("the trainer's process is gone");
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
    const uint64_t current = state_.version();
    if (link.joining && current == 0)
        fail(WSYNC_ERR_MISMATCH, what + ": this receiver (re)attached after version " +
                                     std::to_string(h.version) +
                                     " began (in flight then, or long done); it takes part from "
                                     "the next version the sender begins (skip the requests of "
                                     "this one)");
    if (current && link.abandoned_version == current) catch_up(link);
    if (h.version > current) lose_open_version(h);
    if (h.version > current + 1 && current != 0) skip_versions(h, link);

    // Order: chunk 0 of a version newer than any seen begins it (an open older one has failed
    // just above); any other chunk must be the next of the current version. Older chunks are
    // replays.
    if (h.chunk_index == 0) {
        if (h.version <= current && current != 0)
            fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) + " again or out of order: " +
                                         "version " + std::to_string(current) +
                                         " has begun here already (stale or replayed request)");
    } else if (h.version < current || (h.version == current && h.chunk_index < state_.expect())) {
        fail(WSYNC_ERR_MISMATCH, "received " + chunk_label(h) +
                                     " again: a stale or replayed request");
    } else if (h.version != current || h.chunk_index != state_.expect()) {
        std::string expected =
            state_.open() ? "chunk " + std::to_string(state_.expect()) + " of version " + std::to_string(current)
            : current     ? "chunk 0 of a version after " + std::to_string(current)
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
        if (h.version != current) {
            // A newer version whose first chunks did not arrive (an open older one has failed
            // already: lose_open_version or catch_up). This one fails here: none of its later
            // chunks, nor a late chunk 0, can complete it, so this receiver and the trainer
            // (which gets the record) agree that it failed.
            state_.begin(h.version);
            state_.expect_after(h.chunk_index);  // its later chunks: refused as a failed version's
        }
        fail_open_version(status);
        state_.explain(why);
        impl_->refuse(h, transport, status, why, !abandoned);
        fail(status, std::string(kind_.name) + ": " + why);
    } else if (state_.failed()) {
        std::string why = "version " + std::to_string(current) + " already failed here with " +
                          status_name(state_.status()) +
                          (state_.why().empty() ? "" : " (" + state_.why() + ")");
        state_.expect_after(h.chunk_index);
        impl_->refuse(h, transport, state_.status(), why, false);
        // The engine's call says "skipped", not the version's status again (user trial: a
        // loader's WRONG_STATE came back for every later chunk, read as a new wrong-state bug).
        // A version the sender abandoned stays ABANDONED: that is news about the version.
        if (state_.status() == WSYNC_ERR_ABANDONED) fail(state_.status(), what + ": " + why);
        fail(WSYNC_ERR_SKIPPED, what + ": skipped, " + why);
    }
    if (impl_->checksums_promised() && table.checksums.empty() && !table.metas.empty() &&
        impl_->sums_follow(transport)) {
        table.sums_follow = true;  // the transport brings them after the bytes
        table.tree_sums = true;
    } else if (impl_->checksums_promised() && table.checksums.empty() && !table.metas.empty()) {
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
        if (h.version == state_.version()) fail_open_version(WSYNC_ERR_MISMATCH);
        impl_->refuse(h, transport, WSYNC_ERR_MISMATCH, e.what(), true);
        throw;
    }
    // With a selection (src/plan/select.hpp) the plan is checked before any byte moves; its state
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
            if (h.version == state_.version()) fail_open_version(e.status());
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
        state_.begin(h.version);
    state_.expect_after(h.chunk_index);
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
    if (outcome == WSYNC_OK || h.version != state_.version()) return;
    if (!state_.failed()) impl_->record_failure(h, outcome, message);
    fail_open_version(outcome);
    state_.explain(message);
}

void Receiver::finished(const ChunkHeader &h, const TensorTable &table, wsync_status_t outcome) {
    if (outcome != WSYNC_OK || h.version != state_.version() || state_.failed()) return;
    tally(state_.tally(), table);
    if (h.last) state_.complete();  // version() stays: a replay of it is still refused
}

wsync_receiver_state_t Receiver::poll() {
    if (open_)
        fail(WSYNC_ERR_WRONG_STATE, "poll: an iteration is open; end or fail it first");
    catch_up(impl_->link());
    wsync_receiver_state_t st{};
    st.struct_size = sizeof st;
    st.flags = (dropped_ ? WSYNC_RECEIVER_DROPPED : 0) | (sender_gone_ ? WSYNC_RECEIVER_SENDER_GONE : 0) |
               (impl_->orders_loader_work() ? WSYNC_RECEIVER_ORDERS_LOADER_WORK : 0);
    st.completed_version = state_.completed();
    st.open_version = state_.open_version();
    st.failed_version = state_.failed_version();
    st.failed_status = state_.failed_status();
    return st;
}

uint64_t ChunkBacking::trailing_sum(std::size_t) {
    fail(WSYNC_ERR_INTERNAL, "this transport sends no checksums after the bytes");
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
