#include "transport/ucx/sender_state.hpp"

#include <algorithm>
#include <unistd.h>

#include "error.hpp"

namespace wsync::ucx {

// ---- the progress thread ------------------------------------------------------------
// Fetches are served here (their data messages, and UCX's rendezvous protocol under them,
// need the trainer's worker to progress), and so is every control message. This thread
// progresses while a round finds work, then whenever the worker's descriptor fires, and every
// 100 ms.
void UcxSender::serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        const unsigned n = w_->progress();
        sent(w_->take_sent());
        handle(w_->take_inbox());
        dispatch();
        check_members();
        cv_.notify_all();
        uint64_t v;
        if (read(stop_fd_, &v, sizeof v) == sizeof v) return;
        // No spinning once a round found nothing: on a host whose cores the engines share, 50 ms
        // of spin after each burst took a core from them (1 GiB over a veth on 2 cores: 0.92 ->
        // 0.78 CPU-seconds a sync, 0.46 -> 0.40 s; docs/architecture.md, "Against gloo"). The
        // descriptor wakes this thread for the next fragment's socket event.
        // A Data send dispatch() just made may have completed in place: its receiver's place is
        // free only once sent() has seen it, and no event would wake us for that.
        if (n || w_->has_sent() || !w_->arm()) {  // work this round, or events pending: progress again
            lock.unlock();      // callers first: see caller_lock()
            while (callers_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
            lock.lock();
            continue;
        }
        std::vector<pollfd> fds = w_->poll_set(stop_fd_);
        lock.unlock();  // callers may use the worker while this one sleeps
        Worker::poll_on(fds, 100);
        lock.lock();
    }
}

// The mutex for a caller's thread. The progress thread re-takes the mutex between rounds
// while it spins; std::mutex is not fair, so a caller announces itself and the progress
// thread waits for it rather than starving it (send_chunk would stall behind fetches).
std::unique_lock<std::mutex> UcxSender::caller_lock() {
    callers_.fetch_add(1, std::memory_order_acq_rel);
    std::unique_lock<std::mutex> lock(mu_);
    callers_.fetch_sub(1, std::memory_order_acq_rel);
    return lock;
}

// Sends a member a message sealed with its connection's key, numbered.
void UcxSender::tell(uint32_t index, Member &mem, Msg m) {
    m.index = index;
    m.token = mem.token;
    m.number = ++mem.sent;
    w_->send(*mem.ep, seal_msg(m, mem.key, Dir::ToEngine));
}

// Only authentic messages are acted on: a hello MACed with the init info's key and never
// seen before, or a member's message MACed with its connection's key and numbered above
// the last one. Anything else is dropped unanswered (nobody is connected to, nothing is
// said back: a peer without the key learns nothing).
// At the door (Worker::on_am, during progress): only authentic messages enter the inbox, and
// each receiver index, and hellos together, get an equal share of its 65536 places a round. A
// forged flood costs the trainer one MAC a message and takes no place; an engine flooding with
// its own key fills only its share (issue 37: honest messages were dropped with the rest).
bool UcxSender::admit(const Msg &m) {
    const uint32_t share = 65536 / (static_cast<uint32_t>(members_.size()) + 1);
    if (m.type == MsgType::Hello)
        return hellos_this_round_ < share && authentic(m, info_.key, Dir::ToTrainer) && ++hellos_this_round_;
    if (m.type == MsgType::Data || m.index >= members_.size()) return false;  // the trainer takes no Data
    const Member &mem = members_[m.index];
    if (!mem.ep || mem.token != m.token || m.number <= mem.heard) return false;
    if (heard_this_round_.size() != members_.size()) heard_this_round_.assign(members_.size(), 0);
    if (heard_this_round_[m.index] >= share || !authentic(m, mem.key, Dir::ToTrainer)) return false;
    ++heard_this_round_[m.index];
    return true;
}

void UcxSender::handle(std::vector<Msg> inbox) {
    hellos_this_round_ = 0;
    heard_this_round_.assign(members_.size(), 0);
    for (Msg &m : inbox) {
        if (m.type == MsgType::Hello) {
            if (authentic(m, info_.key, Dir::ToTrainer) && seen_hellos_.insert(m.nonce).second) hello(m);
            continue;
        }
        if (m.index >= members_.size() || members_[m.index].token != m.token || !members_[m.index].ep)
            continue;  // a stale or forged sender of this message: ignored
        Member &mem = members_[m.index];
        if (m.number <= mem.heard || !authentic(m, mem.key, Dir::ToTrainer)) continue;  // replayed or forged
        mem.heard = m.number;
        switch (m.type) {
        case MsgType::Lease: lease(m.index, mem, m.seq); break;
        case MsgType::Fetch: fetch(m.index, mem, m); break;
        case MsgType::Ack: ack(m.index, mem, m); break;
        case MsgType::Bye: leave(m.index, WSYNC_FAILURE_DETACHED, "was destroyed"); break;
        default: break;
        }
    }
    release();
}

void UcxSender::hello(const Msg &m) {
    std::string why;
    wsync_status_t st = WSYNC_OK;
    if (m.seq != info_.session) {
        st = WSYNC_ERR_MISMATCH;
        why = "its init info is from another trainer session";
    } else if (m.index >= members_.size()) {
        st = WSYNC_ERR_INVALID_ARGUMENT;
        // Read the same in every language ("0..0" read as a Rust range is empty).
        const std::size_t n = members_.size();
        why = "receiver index " + std::to_string(m.index) + " is out of range: this sync has " +
              (n == 1 ? std::string("1 receiver, index 0")
                      : std::to_string(n) + " receivers, indices 0 to " + std::to_string(n - 1));
    } else if (members_[m.index].ep && members_[m.index].ep->error == UCS_OK && !members_[m.index].dropped) {
        st = WSYNC_ERR_WRONG_STATE;  // as every kind says of an index in use (wsync.h)
        // Not who holds it: a refusal names no other engine (issue 37); what to do instead.
        why = "receiver index " + std::to_string(m.index) +
              " is already attached: an index serves one engine at a time: destroy that "
              "receiver or end its process first, or attach another index (a frozen engine: "
              "the trainer drops it, wsync_sender_drop_receiver, then end its process)";
    }
    std::unique_ptr<Endpoint> ep;
    const std::string name = "receiver " + std::to_string(m.index) + " (pid " + std::to_string(m.pid) + ")";
    try {
        ep = w_->connect(m.address, name);
    } catch (const Error &) {
        return;  // cannot answer it; it times out naming the trainer
    }
    Msg reply;
    reply.type = MsgType::Welcome;
    reply.index = m.index;
    reply.token = m.token;
    reply.number = 1;
    reply.status = st;
    reply.text = why;
    if (st == WSYNC_OK) reply.text = stream_address_;  // empty: Data travels over UCX
    sys::random_bytes(reply.nonce.data(), reply.nonce.size());
    const Key key = connection_key(info_.key, m.index, m.token, m.nonce, reply.nonce);
    w_->send(*ep, seal_msg(reply, key, Dir::ToEngine));
    if (st != WSYNC_OK) {
        // Closed by the destructor, after the reply, or when kRefusedKept later refusals need
        // the place (the trainer's connections stay bounded by receivers + kRefusedKept).
        if (refused_.size() >= kRefusedKept) {
            w_->close(std::move(refused_.front()), sys::Deadline(0));
            refused_.erase(refused_.begin());
        }
        refused_.push_back(std::move(ep));
        return;
    }
    Member &mem = members_[m.index];
    // A predecessor at this index, dead or dropped: its leases end. One whose death was not yet
    // seen (its connection has not failed yet) died now; either way, a version it began and
    // did not complete is named DIED before the index changes hands.
    if (mem.ep && !mem.dropped)
        leave(m.index, WSYNC_FAILURE_DIED, "is unreachable (its connection failed) and a new engine took its index");
    if (mem.dead) name_dead(m.index, mem);
    if (mem.ep) forget(m.index);
    w_->close(std::move(mem.ep), sys::Deadline(0));
    mem = Member{};
    mem.token = m.token;
    mem.name = name;
    mem.pid = m.pid;
    mem.ep = std::move(ep);
    mem.key = key;
    mem.sent = 1;  // the welcome
    // It owes versions that begin after it attached (a version the core has begun,
    // began_, counts as begun even before its first chunk is published); it may still pull
    // any kept one. It holds no base: its first owed version goes dense (begin_version).
    mem.from_version = std::max({open_version_, began_, last_committed_}) + 1;
    mem.acked_through = last_seq_;
}

void UcxSender::lease(uint32_t index, Member &mem, uint64_t seq) {
    Msg reply;
    reply.type = MsgType::Grant;
    reply.seq = seq;
    auto it = chunks_.find(seq);
    if (mem.dropped) {
        reply.status = WSYNC_ERR_PEER;
        reply.text = "this receiver was dropped by the trainer";
    } else if (it == chunks_.end() || it->second.retired) {
        reply.status = WSYNC_ERR_ABANDONED;
        reply.text = gone_text(seq);
    } else if (it->second.buf.borrowed && mem.from_version > it->second.version) {
        // Sent in place from the arena, which the caller may write once the version's flush
        // returns: only receivers that owe the version (whom that flush waits for) read it.
        reply.status = WSYNC_ERR_ABANDONED;
        reply.text = "chunk seq " + std::to_string(seq) + " of version " + std::to_string(it->second.version) +
                     " was sent in place from the trainer's arena and is read only by receivers that owe it; "
                     "this one owes versions from " + std::to_string(mem.from_version) + " on";
    } else if (mem.leases[seq] >= kLeasesPerChunk) {
        // Bounded per peer (issue 37): an honest engine holds one lease per chunk it reads.
        reply.status = WSYNC_ERR_WRONG_STATE;
        reply.text = "this receiver already holds " + std::to_string(kLeasesPerChunk) + " leases on chunk seq " +
                     std::to_string(seq) + ", the most one receiver may: acknowledge the chunk first";
    } else {
        ++it->second.leases;
        ++mem.leases[seq];
    }
    tell(index, mem, reply);
}

// A fetch waits its turn in the member's queue (dispatch()); one past kFetchesQueued waiting is
// refused at once (WRONG_STATE), with no byte.
void UcxSender::fetch(uint32_t index, Member &mem, const Msg &m) {
    if (mem.fetches.size() < kFetchesQueued) {
        mem.fetches.push_back(m);
        return;
    }
    Msg reply;
    reply.type = MsgType::Data;
    reply.seq = m.seq;
    reply.version = m.version;
    reply.offset = m.offset;
    reply.bytes = m.bytes;
    reply.index = index;
    reply.token = mem.token;
    reply.status = WSYNC_ERR_WRONG_STATE;
    reply.text = "this receiver already has " + std::to_string(kFetchesQueued) +
                 " fetches waiting, the most one receiver may: take their data first";
    w_->send_data(*mem.ep, seal_msg(reply, mem.key, Dir::ToEngine), nullptr, 0, 0);
}

// Fair service (issue 37: one engine's fetch loop halved another's throughput): waiting fetches
// are answered round-robin, one per receiver per turn, each receiver at most kFetchesInFlight
// payloads being sent; the first receiver served moves on by one each call.
void UcxSender::dispatch() {
    const uint32_t n = static_cast<uint32_t>(members_.size());
    if (n == 0) return;
    for (bool any = true; any;) {
        any = false;
        for (uint32_t k = 0; k < n; ++k) {
            const uint32_t i = (turn_ + k) % n;
            Member &mem = members_[i];
            if (mem.fetches.empty() || mem.in_flight >= kFetchesInFlight || !mem.ep) continue;
            // Checksums that follow the bytes go once their entries are hashed as sent, or
            // once nothing more is being sent to this member (then hashed from memory).
            if (mem.fetches.front().chunk == kFetchSums && mem.in_flight && !sums_ready(mem.fetches.front())) continue;
            const Msg m = std::move(mem.fetches.front());
            mem.fetches.pop_front();
            answer_fetch(i, mem, m);
            any = true;
        }
    }
    turn_ = (turn_ + 1) % n;
}

// Payloads done (sent or failed): their chunk's buffer and their receiver's place are free.
void UcxSender::sent(const std::vector<uint64_t> &ids) {
    for (uint64_t id : ids) {
        auto f = flights_.find(id);
        if (f == flights_.end()) continue;
        auto c = chunks_.find(f->second.seq);
        if (c != chunks_.end() && c->second.sending) --c->second.sending;
        Member &mem = members_[f->second.index];
        if (mem.token == f->second.token && mem.in_flight) --mem.in_flight;
        flights_.erase(f);
    }
}

// Serves bytes [offset, offset + bytes) of chunk seq to a member that holds a lease on it,
// as one Data message (eager or rendezvous, as UCX chooses) straight from the staging
// buffer, which stays until the send is done (release()). Anything else, a range past the
// chunk's end included, is answered with why not and no byte.
void UcxSender::answer_fetch(uint32_t index, Member &mem, const Msg &m) {
    Msg reply;
    reply.type = MsgType::Data;
    reply.seq = m.seq;
    reply.version = m.version;  // the fetch's number
    reply.offset = m.offset;
    reply.bytes = m.bytes;
    auto it = chunks_.find(m.seq);
    if (mem.dropped) {
        reply.status = WSYNC_ERR_PEER;
        reply.text = "this receiver was dropped by the trainer";
    } else if (it != chunks_.end() ? it->second.retired : m.seq != 0 && m.seq < next_seq_) {
        reply.status = WSYNC_ERR_ABANDONED;
        reply.text = gone_text(m.seq);
    } else if (it == chunks_.end() || mem.leases.count(m.seq) == 0) {
        reply.status = WSYNC_ERR_WRONG_STATE;
        reply.text = "chunk seq " + std::to_string(m.seq) + " is not leased to this receiver";
    } else if (m.chunk == kFetchSums) {
        answer_sums(index, mem, m, it->second, reply);
        return;
    } else if (m.bytes == 0 || m.offset > it->second.bytes || m.bytes > it->second.bytes - m.offset) {
        reply.status = WSYNC_ERR_MALFORMED;
        reply.text = "bytes [" + std::to_string(m.offset) + ", +" + std::to_string(m.bytes) +
                     ") are not within the " + std::to_string(it->second.bytes) + "-byte chunk seq " +
                     std::to_string(m.seq);
    }
    reply.index = index;
    reply.token = mem.token;
    // Data messages carry no rising number: the engine takes one only as the answer to a
    // fetch it has outstanding (its own number, in `version`, never reused).
    std::vector<uint8_t> sealed = seal_msg(reply, mem.key, Dir::ToEngine);
    if (reply.status != WSYNC_OK) {
        w_->send_data(*mem.ep, std::move(sealed), nullptr, 0, 0);
        return;
    }
    ++it->second.sending;
    ++mem.in_flight;
    const uint64_t id = ++flight_ids_;
    flights_[id] = Flight{m.seq, index, mem.token, {}};
    w_->send_data(*mem.ep, std::move(sealed), static_cast<const uint8_t *>(it->second.buf.base) + m.offset,
                  m.bytes, id, it->second.trail && !it->second.trail->complete());
}

// Whether a fetch of checksums that follow the bytes (kFetchSums, init_info.hpp) can be
// answered from hashes taken as its entries were sent (or is refused at once).
bool UcxSender::sums_ready(const Msg &m) const {
    auto c = chunks_.find(m.seq);
    if (c == chunks_.end() || !c->second.trail || m.bytes % 8 || m.offset > c->second.trail->entries() ||
        m.bytes / 8 > c->second.trail->entries() - m.offset)
        return true;  // answered at once: refused
    return c->second.trail->ready(static_cast<std::size_t>(m.offset), static_cast<std::size_t>(m.bytes / 8));
}

// The checksums of entries [offset, offset + bytes / 8) of a chunk whose request said they
// follow its bytes, to a member holding a lease on it (answer_fetch checked that): each entry's
// tree hash, the pieces no stream has hashed yet hashed now, from memory.
void UcxSender::answer_sums(uint32_t index, Member &mem, const Msg &m, Chunk &c, Msg &reply) {
    reply.chunk = kFetchSums;
    reply.index = index;
    reply.token = mem.token;
    const uint64_t n = c.trail ? c.trail->entries() : 0;
    if (!c.trail || m.bytes == 0 || m.bytes % 8 || m.offset > n || m.bytes / 8 > n - m.offset) {
        reply.status = WSYNC_ERR_MALFORMED;
        reply.text = !c.trail ? "chunk seq " + std::to_string(m.seq) + " carries its checksums in its request"
                              : "a fetch of checksums of chunk seq " + std::to_string(m.seq) +
                                    " must name a range of its " + std::to_string(n) + " entries, 8 bytes each";
        w_->send_data(*mem.ep, seal_msg(reply, mem.key, Dir::ToEngine), nullptr, 0, 0);
        return;
    }
    const uint64_t id = ++flight_ids_;
    Flight &f = flights_[id];
    f = Flight{m.seq, index, mem.token,
               c.trail->sums(static_cast<std::size_t>(m.offset), static_cast<std::size_t>(m.bytes / 8))};
    reply.nonce = sums_mac(mem.key, m.seq, m.version, f.sums.data(), f.sums.size());
    ++c.sending;
    ++mem.in_flight;
    w_->send_data(*mem.ep, seal_msg(reply, mem.key, Dir::ToEngine), f.sums.data(), f.sums.size(), id);
}

bool UcxSender::abandoned_here(uint64_t version) const {
    return std::find(abandoned_.begin(), abandoned_.end(), version) != abandoned_.end();
}

void UcxSender::ack(uint32_t index, Member &mem, const Msg &m) {
    auto l = mem.leases.find(m.seq);
    if (l != mem.leases.end()) {
        auto c = chunks_.find(m.seq);
        if (c != chunks_.end() && c->second.leases) --c->second.leases;
        if (--l->second == 0) mem.leases.erase(l);
    }
    mem.acked_through = std::max(mem.acked_through, m.seq);
    // An OK Ack's `offset` carries the engine's apply time of the chunk's patches in ns (after
    // 0.7.0; 0 from earlier engines). Another process's figure: a chunk's is capped, and it
    // counts for the version this sender published the chunk in.
    if (m.status == WSYNC_OK && m.offset > 0 && !mem.dropped) {
        auto c = chunks_.find(m.seq);
        constexpr uint64_t kMostNs = (uint64_t(1) << 40) - 1;
        const uint64_t ns = std::min(m.offset, kMostNs);
        if (c != chunks_.end() && ns > c->second.applied) {
            const uint64_t more = ns - c->second.applied;
            c->second.applied = ns;
            auto v = std::find_if(applied_.begin(), applied_.end(),
                                  [&](const auto &e) { return e.first == c->second.version; });
            if (v != applied_.end()) {
                v->second = more > UINT64_MAX - v->second ? UINT64_MAX : v->second + more;
            } else {
                if (applied_.size() == kAppliedKept) applied_.erase(applied_.begin());
                applied_.emplace_back(c->second.version, more);
            }
        }
    }
    // A receiver that re-attached and completed a version is not reported gone for it (a 5 s
    // link outage reported an engine DIED that had re-attached and loaded the version): the
    // DIED or DETACHED failure its old connection left, still unreported, is withdrawn.
    if (m.status == WSYNC_OK) {
        auto c = chunks_.find(m.seq);
        if (c != chunks_.end() && c->second.last && c->second.version == m.version) {
            failures_.withdraw(index, m.version, WSYNC_FAILURE_DIED);
            failures_.withdraw(index, m.version, WSYNC_FAILURE_DETACHED);
        }
    }
    // Named once per version: the later chunks of a version that failed here are refused
    // by the receiver's core with the same status. Not named: a receiver this sender
    // dropped (it stopped listening to it), and a version this sender abandoned (a late
    // request of it refused tells the trainer nothing it does not know; review: both
    // failed the trainer's next flush with PEER, and a controller following wsync.h would
    // then drop a healthy engine).
    if (m.status == WSYNC_OK || mem.dropped || m.version < mem.from_version ||
        m.version == mem.failed_version || abandoned_here(m.version) ||
        (m.status == WSYNC_ERR_ABANDONED && m.version <= retired_through_))
        return;
    mem.failed_version = m.version;
    const auto st = static_cast<wsync_status_t>(m.status);
    failures_.add(Failure{WSYNC_FAILURE_FAILED, st, index, m.version, m.chunk, mem.pid, m.text});
}

// A member's connection failed (UCX's error handler): it died, or the network between us
// did. Named once if it owed a chunk (a dropped one owes nothing); its leases end.
void UcxSender::check_members() {
    for (uint32_t i = 0; i < members_.size(); ++i) {
        Member &m = members_[i];
        if (m.ep && m.ep->error != UCS_OK)
            leave(i, WSYNC_FAILURE_DIED,
                  std::string("is unreachable (") + w_->api().ucs_status_string(m.ep->error) +
                      "): its process died or the network to it failed");
    }
}

void UcxSender::leave(uint32_t index, uint32_t what, const std::string &why) {
    Member &m = members_[index];
    const uint64_t v = last_version();
    // The version it completed: everything published, if that version is committed; the one
    // before, if it died between two chunks of an open version (it owes the rest of it).
    uint64_t completed = v;
    if (owes(m))
        failures_.add(Failure{what, WSYNC_ERR_PEER, index, v, WSYNC_NO_CHUNK, m.pid,
                              why + " owing chunk seq " + std::to_string(last_seq_)});
    else if (v > last_committed_ && v >= m.from_version)
        completed = last_committed_;
    forget(index);
    w_->close(std::move(m.ep), sys::Deadline(0));
    const bool died = what == WSYNC_FAILURE_DIED && !m.dropped;
    const int32_t pid = m.pid;
    const std::string name = m.name;
    m = Member{};
    if (died) {
        m.dead = true;
        m.dead_why = why;
        m.dead_reported = completed;
        m.pid = pid;
        m.name = name;
    }
}

// A dead member (Member::dead) owes every version published since it died: each one's flush
// names it DIED, once, until it is dropped or its index is taken by a new hello.
void UcxSender::name_dead(uint32_t index, Member &m) {
    const uint64_t v = last_version();
    if (!m.dead || m.dropped || !last_seq_ || v <= m.dead_reported) return;
    failures_.add(Failure{WSYNC_FAILURE_DIED, WSYNC_ERR_PEER, index, v, WSYNC_NO_CHUNK, m.pid,
                          m.dead_why + "; version " + std::to_string(v) +
                              " was published after (drop the receiver, or restart its engine)"});
    m.dead_reported = v;
}

// Ends a member's leases (it died, detached, was dropped or was replaced). Fetches serve
// only members holding a lease, so nothing of a chunk is sent for them afterwards; sends in
// flight keep their buffer (Chunk::sending).
void UcxSender::forget(uint32_t index) {
    Member &m = members_[index];
    for (auto &kv : m.leases) {
        auto c = chunks_.find(kv.first);
        if (c != chunks_.end()) c->second.leases -= std::min(c->second.leases, kv.second);
    }
    m.leases.clear();
    m.fetches.clear();
}

}  // namespace wsync::ucx
