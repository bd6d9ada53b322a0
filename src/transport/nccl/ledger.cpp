#include "transport/nccl/ledger.hpp"

#include <algorithm>
#include <cinttypes>

#include "error.hpp"
#include "transport/nccl/init_info.hpp"
#include "wire.hpp"

namespace wsync::nccl {

namespace {
constexpr std::size_t kMaxHeldFailures = 256;
constexpr std::size_t kMaxSent = 4096;       // chunks remembered while some receiver owes them
constexpr std::size_t kMaxAbandoned = 64;    // abandoned versions remembered
constexpr int64_t kNoticeMs = 100;           // the most an abandon notice may wait to be written
constexpr std::size_t kSlack = 16;           // connections without a hello kept beyond receivers
constexpr std::size_t kMaxNonces = 4096;     // hello nonces remembered (replays refused)
}  // namespace

Ledger::Ledger(std::unique_ptr<Listener> listener, uint32_t receivers, uint64_t group)
    : listener_(std::move(listener)), key_(listener_->address().key), group_(group), peers_(receivers),
      failures_(kMaxHeldFailures) {}

void Ledger::sent(uint64_t seq, uint64_t version, uint32_t chunk, uint64_t bytes) {
    sent_[seq] = Sent{version, chunk, bytes, false};
    last_seq_ = std::max(last_seq_, seq);
    prune();
}

void Ledger::abandon(uint64_t version) {
    for (auto &[seq, s] : sent_)
        if (s.version == version) s.abandoned = true;
    abandoned_.push_back(version);
    if (abandoned_.size() > kMaxAbandoned) abandoned_.pop_front();
    failures_.withdraw_version(version);
    const sys::Deadline notice(kNoticeMs);
    for (Peer &p : peers_)
        if (p.conn) p.conn->send(Msg::Abandoned, version, 0, 0, "", notice);
}

uint64_t Ledger::abandoned_bytes(uint64_t seq) const {
    auto it = sent_.find(seq);
    return it != sent_.end() && it->second.abandoned ? it->second.bytes : 0;
}

std::vector<uint64_t> Ledger::undrained(uint64_t seq) const {
    uint64_t floor = UINT64_MAX;
    for (const Peer &p : peers_) floor = std::min(floor, p.joined);
    std::vector<uint64_t> out;
    for (auto it = sent_.upper_bound(floor); it != sent_.end() && it->first < seq; ++it)
        if (it->second.abandoned && it->second.bytes) out.push_back(it->first);
    return out;
}

bool Ledger::version_abandoned(uint64_t version) const {
    return std::find(abandoned_.begin(), abandoned_.end(), version) != abandoned_.end();
}

void Ledger::prune() {
    uint64_t floor = last_seq_ > 2 ? last_seq_ - 2 : 0;  // the sender asks about the last two
    for (const Peer &p : peers_) floor = std::min(floor, p.acked);
    sent_.erase(sent_.begin(), sent_.lower_bound(floor + 1));
    while (sent_.size() > kMaxSent) sent_.erase(sent_.begin());
}

std::map<uint64_t, Ledger::Sent>::const_iterator Ledger::owed(const Peer &p) const {
    for (auto it = sent_.upper_bound(p.acked); it != sent_.end(); ++it)
        if (!it->second.abandoned) return it;
    return sent_.end();
}

void Ledger::greet(std::unique_ptr<Conn> conn) {
    std::vector<Received> got;
    conn->read(&got);  // the hello at most
    if (got.empty()) {
        if (!conn->closed()) greeting_.push_back(std::move(conn));
        return;
    }
    // Anything but an authentic, fresh hello for a free index closes the connection (the
    // stranger learns nothing: no answer is sent).
    const Received &h = got[0];
    const Frame &f = h.frame;
    const uint32_t index = static_cast<uint32_t>(f.b >> 32);
    if (f.type != static_cast<uint32_t>(Msg::Hello) || f.a != group_ || h.text.size() != auth::kNonceBytes)
        return;
    const auth::Mac want = hello_mac(key_, f, h.text);
    if (!auth::same_mac(want.data(), h.mac.data()) || seen_.count(h.text)) return;
    seen_.insert(h.text);  // a hello replayed later is refused, whatever else it holds
    seen_order_.push_back(h.text);
    if (seen_order_.size() > kMaxNonces) {
        seen_.erase(seen_order_.front());
        seen_order_.pop_front();
    }
    if (index >= peers_.size() || peers_[index].conn || peers_[index].acked || peers_[index].died_reported)
        return;
    Peer &p = peers_[index];
    conn->authenticate(connection_key(key_, index, group_, h.text), 'S');
    p.conn = std::move(conn);
    p.pid = static_cast<int32_t>(f.b & 0xffffffffu);
    read_peer(index);  // what came with the hello
}

void Ledger::read_peer(uint32_t index) {
    std::vector<Received> got;
    peers_[index].conn->read(&got);
    for (const Received &r : got) dispatch(index, r);
}

void Ledger::dispatch(uint32_t index, const Received &r) {
    Peer &p = peers_[index];
    {
        const Frame &f = r.frame;
        switch (static_cast<Msg>(f.type)) {
        case Msg::Joined:
            p.joined = std::max(p.joined, std::min(f.a, last_seq_));
            break;
        case Msg::Ack:
            p.acked = std::max(p.acked, std::min(f.a, last_seq_));
            p.joined = std::max(p.joined, p.acked);
            break;
        case Msg::Failed: {
            if (version_abandoned(f.a)) break;  // not reported: the trainer gave the version up
            Failure x;
            x.what = WSYNC_FAILURE_FAILED;
            x.status = f.status > 0 && f.status <= WSYNC_ERR_SKIPPED ? static_cast<wsync_status_t>(f.status)
                                                                   : WSYNC_ERR_PEER;
            x.receiver = index;
            x.version = f.a;
            x.chunk_index = f.b <= UINT32_MAX ? static_cast<uint32_t>(f.b) : WSYNC_NO_CHUNK;
            x.pid = p.pid;
            x.message = wire::printable(r.text, kMaxText);
            failures_.add(std::move(x));
            break;
        }
        default:
            p.conn->close(strf("it sent a control frame of type %u, which only a sender sends", f.type));
        }
    }
}

void Ledger::pump(int64_t wait_ms) {
    std::vector<int> fds{listener_->fd()};
    for (const auto &c : greeting_) fds.push_back(c->fd());
    for (const Peer &p : peers_) fds.push_back(p.conn ? p.conn->fd() : -1);
    if (wait_ms > 0) wait_readable(fds, wait_ms);
    for (int fd; (fd = listener_->accept_one()) >= 0;) {
        greet(std::make_unique<Conn>(fd));
        // Receivers say hello as they connect; a crowd of silent connections (a flood) costs
        // its oldest member, never a receiver's hello read already.
        if (greeting_.size() > peers_.size() + kSlack) greeting_.erase(greeting_.begin());
    }
    std::vector<std::unique_ptr<Conn>> waiting;
    waiting.swap(greeting_);
    for (auto &c : waiting) greet(std::move(c));
    for (uint32_t i = 0; i < peers_.size(); ++i)
        if (peers_[i].conn && !peers_[i].conn->closed()) read_peer(i);
}

std::string Ledger::chunk_text(const Sent &s) {
    return strf("chunk %" PRIu32 " of version %" PRIu64, s.chunk, s.version);
}

Failure Ledger::owing(uint32_t index, uint32_t what, wsync_status_t status, std::string message) const {
    const auto o = owed(peers_[index]);
    Failure x;
    x.what = what;
    x.status = status;
    x.receiver = index;
    x.version = o->second.version;
    x.chunk_index = o->second.chunk;
    x.pid = peers_[index].pid;
    x.message = std::move(message);
    return x;
}

void Ledger::wait(const sys::Deadline &deadline, const std::function<std::string(bool)> &stuck) {
    bool died = false;
    for (;;) {
        pump(0);
        std::vector<uint32_t> waiting;
        for (uint32_t i = 0; i < peers_.size(); ++i) {
            Peer &p = peers_[i];
            auto o = owed(p);
            if (o == sent_.end() || failures_.holds(i)) continue;
            if (p.conn && p.conn->closed() && !p.died_reported) {
                failures_.add(owing(i, WSYNC_FAILURE_DIED, WSYNC_ERR_PEER,
                                    "died owing " + chunk_text(o->second) + " (" + p.conn->why() + ")"));
                p.died_reported = died = true;
            } else if (!p.died_reported) {
                waiting.push_back(i);
            }
        }
        if (waiting.empty()) break;
        if (deadline.passed()) {
            std::vector<Failure> more;
            for (int joined = 0; joined < 2; ++joined)  // those that never joined first
                for (uint32_t i : waiting) {
                    const Peer &p = peers_[i];
                    auto o = owed(p);
                    if ((p.joined >= o->first) != (joined == 1)) continue;
                    const std::string chunk = chunk_text(o->second);
                    const std::string ms = std::to_string(deadline.budget_ms()) + " ms";
                    const std::string why =
                        !p.conn ? "timed out: it never connected to the sender's control channel (not "
                                  "created, or created from other init info), owing " + chunk
                        : joined ? "timed out: it received " + chunk + " but did not end its iteration "
                                   "within " + ms + " (its loader is still at it, or frozen)"
                                 : "timed out: it did not join the broadcast of " + chunk + " within " + ms +
                                       " (frozen, or its loader never asked for that chunk)";
                    more.push_back(owing(i, WSYNC_FAILURE_TIMEOUT, WSYNC_ERR_TIMEOUT, why));
                }
            const std::string tail = stuck(died);
            if (!failures_.empty()) failures_.report(kKind, std::move(more), tail);
            throw Error(WSYNC_ERR_TIMEOUT, describe_failures(kKind, more) + tail, more);
        }
        pump(std::min<int64_t>(deadline.remaining_ms(), 100) + 1);
    }
    if (!failures_.empty()) failures_.report(kKind, {}, died ? stuck(true) : std::string());
}

}  // namespace wsync::nccl
