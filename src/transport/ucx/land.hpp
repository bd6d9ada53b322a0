// Landing (wsync_receiver_land; docs/data-path.md, "Landing"): which entries of a chunk a ucx
// receiver reads from its data stream straight into the engine's destinations, where each piece
// of the chunk's bytes goes, and each landed entry's checksum, taken 64 KiB at a time as its
// bytes land (while they are in the cache). One Lander per receiver; its plan is remade for each
// chunk pulled in pieces.
//
// Who touches what: set() and plan() run on the receiver's caller thread while no pull runs;
// landed() on the puller thread only (its prefix and cursor are the puller's); sum() on the
// loader's thread. Each entry's piece hashes (sums, done) are shared by landed() and sum() under
// mu_; everything else is fixed from plan() until the next plan().
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "strategy.hpp"
#include "tensor.hpp"
#include "transport/ucx/stream.hpp"

namespace wsync::ucx {

class Lander {
public:
    // The engine's host destinations (ReceiverImpl::land); empty stops landing. A name with
    // several destinations, or whose destination shares memory with another name's, never
    // lands (its bytes come through the receive buffer).
    void set(std::vector<Landing> dests);
    bool on() const { return !dests_.empty(); }

    // The plan for the chunk about to be pulled (`table`: its wire table): each dense entry whose
    // name has exactly one destination, of the entry's dtype and its tensor's shape, holding all
    // the entry's bytes, lands there; nothing lands when entries overlap in the chunk. `hash`:
    // take checksums as bytes land (checksums verified, tree sums). `pieces`: the pull's
    // pieces, (first byte, bytes) each, in the order asked for.
    void plan(const TensorTable &table, bool hash, std::vector<std::pair<uint64_t, uint64_t>> pieces);
    // Forgets the plan (a chunk that does not land).
    void clear();
    bool active() const { return !entries_.empty(); }
    // Per table entry, where it lands (null: in the receive buffer), for the chunk's backing.
    std::vector<const uint8_t *> where() const;

    // Where bytes [at, at + n) of the chunk go: the landed entries' destinations, and `buffer`
    // (the receive buffer's place for byte `at`) between them.
    std::vector<Stream::Run> scatter(uint64_t at, uint64_t n, uint8_t *buffer) const;
    // The puller's, after every read of piece k: `upto` of its bytes are in place. Hashes the
    // landed entries' 64 KiB pieces that now lie wholly in the chunk's landed prefix.
    void landed(std::size_t k, uint64_t upto);
    // Entry i's checksum over its bytes as they landed, once they all have (the loader awaited
    // them): pieces not hashed yet (landed out of order) are hashed now. False when the plan
    // does not hash or entry i does not land.
    bool sum(std::size_t i, uint64_t *out);

private:
    struct Entry {
        std::size_t entry = 0;       // index in the chunk's table
        uint64_t lo = 0, n = 0;      // its bytes in the chunk
        uint8_t *dst = nullptr;      // where they land
        std::vector<uint64_t> sums;  // each 64 KiB piece's hash (copy::kTreePieceBytes)
        std::size_t done = 0;        // pieces hashed
    };
    // Hashes entry e's next piece (under mu_).
    static void hash_next(Entry &e);

    std::vector<Landing> dests_;
    std::unordered_map<std::string, long> by_name_;  // -> index in dests_, -1: several
    std::vector<Entry> entries_;                     // by lo
    std::vector<long> of_;                           // table entry -> index in entries_, -1: none
    bool hash_ = false;
    std::vector<std::pair<uint64_t, uint64_t>> pieces_;
    std::vector<uint64_t> got_;  // per piece, bytes in place (the puller's)
    std::size_t whole_ = 0;      // pieces from the first, in place whole (the puller's)
    std::size_t cursor_ = 0;     // the first entry not hashed whole (the puller's)
    std::mutex mu_;
};

}  // namespace wsync::ucx
