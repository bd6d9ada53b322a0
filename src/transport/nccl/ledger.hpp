// The sender's side of nccl_broadcast's control channel (control.hpp): which receiver is
// connected, which broadcast each has joined, which chunk each is done with, and the failures
// they reported, gathered as the core's policy says (src/failures.hpp). flush waits on this, not
// on the communicator, so it names the receiver: the one that failed, died, or never joined.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "failures.hpp"
#include "transport/nccl/control.hpp"

namespace wsync::nccl {

class Ledger {
public:
    Ledger(std::unique_ptr<Listener> listener, uint32_t receivers, uint64_t group);

    // A chunk was published as `seq` (its broadcast posted when bytes > 0).
    void sent(uint64_t seq, uint64_t version, uint32_t chunk, uint64_t bytes);
    // The version gets no more chunks: no receiver owes its chunks, their failures are not
    // reported, and every receiver is told (best effort: the requests carry what a receiver
    // must drain, so a notice that arrives late changes nothing but the reason it gives).
    void abandon(uint64_t version);
    // Bytes of `seq`'s broadcast if it belongs to an abandoned version and carried data, else 0.
    uint64_t abandoned_bytes(uint64_t seq) const;
    // The abandoned broadcasts before `seq` that carried data and that some receiver has not
    // said it joined, oldest first.
    std::vector<uint64_t> undrained(uint64_t seq) const;

    // Accepts connections and reads what receivers sent, waiting up to `wait_ms` for any.
    void pump(int64_t wait_ms);

    // Waits until no receiver it has no failure of owes a chunk of a version not abandoned,
    // then reports the failures held (WSYNC_ERR_PEER, once each), if any. At the deadline:
    // WSYNC_ERR_TIMEOUT naming each receiver still owing, those that never joined the
    // broadcast they owe first. `stuck(died)` is called before a failure is thrown when a
    // receiver died or timed out: it returns text to append (the sender aborts a communicator
    // whose broadcasts cannot complete).
    void wait(const sys::Deadline &deadline, const std::function<std::string(bool)> &stuck);

private:
    struct Peer {
        std::unique_ptr<Conn> conn;
        int32_t pid = 0;
        uint64_t joined = 0, acked = 0;
        bool died_reported = false;
    };
    struct Sent {
        uint64_t version;
        uint32_t chunk;
        uint64_t bytes;
        bool abandoned;
    };
    void read_peer(uint32_t index);
    void dispatch(uint32_t index, const Received &r);
    void greet(std::unique_ptr<Conn> conn);
    bool version_abandoned(uint64_t version) const;
    // The first chunk `p` owes (of a version not abandoned), or sent_.end().
    std::map<uint64_t, Sent>::const_iterator owed(const Peer &p) const;
    void prune();
    static std::string chunk_text(const Sent &s);
    // A failure of receiver `index` at the first chunk it owes (there is one).
    Failure owing(uint32_t index, uint32_t what, wsync_status_t status, std::string message) const;

    std::unique_ptr<Listener> listener_;
    auth::Key key_;
    uint64_t group_;
    std::vector<Peer> peers_;
    std::vector<std::unique_ptr<Conn>> greeting_;  // accepted, no hello yet
    std::map<uint64_t, Sent> sent_;                // by seq
    uint64_t last_seq_ = 0;
    std::deque<uint64_t> abandoned_;  // the newest abandoned versions
    std::set<std::string> seen_;      // hello nonces, oldest dropped first past a bound
    std::deque<std::string> seen_order_;
    FailureGather failures_;
};

}  // namespace wsync::nccl
