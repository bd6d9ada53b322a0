// Checksums that follow the bytes (issue 37 item 6; docs/data-path.md, "Checksums that follow
// the bytes"): the trainer's half. A chunk sent over the data stream with checksums on is not
// hashed when it is staged or lent from the arena; each 64 KiB piece of each entry is hashed
// right after an engine's stream has written it to the socket, while the kernel's read of it
// has left it in the cache (a hot hash: about a fifth of the cold one it replaces). An engine
// asks for the tree hashes of the entries that end in each piece it pulls right after that
// piece (kFetchSums), so it verifies each entry as soon as its bytes are in.
//
// One Trail per such chunk, used under the sender's mutex only (the progress thread, or a
// caller holding caller_lock()). Pieces are hashed once, by whichever engine's stream sends
// them first whole in one run of its bytes; a piece no stream has (bytes fetched out of order,
// a selection's ranges, an engine without a stream) is hashed when its entry's sum is asked
// for and nothing more is being sent to that engine, from memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor.hpp"

namespace wsync::ucx {

class Trail {
public:
    // `base`: the chunk's bytes (its staging buffer or its place in the arena), laid out by
    // `table` (dense entries only: a chunk with patches carries its checksums in its request).
    Trail(const uint8_t *base, const TensorTable &table);

    // Bytes [lo, hi) of the chunk were just written to engine `to`'s socket: hashes every piece
    // that now lies whole in the run of bytes written to it one after the other ending at hi.
    void written(uint32_t to, uint64_t lo, uint64_t hi);
    // Whether every piece of entries [first, first + count) is hashed.
    bool ready(std::size_t first, std::size_t count) const;
    // Those entries' tree hashes, 8 bytes little-endian each in table order, hashing the pieces
    // not hashed yet (first + count <= entries()).
    std::vector<uint8_t> sums(std::size_t first, std::size_t count);
    std::size_t entries() const { return first_.size(); }
    // Every piece hashed: a later send needs no hashing (nor slicing).
    bool complete() const { return hashed_ == pieces_.size(); }

private:
    struct Piece {
        uint64_t lo = 0, hi = 0;  // its bytes in the chunk
    };
    void hash(std::size_t k);

    const uint8_t *base_;
    std::vector<Piece> pieces_;    // by lo: each entry's pieces in turn
    std::vector<uint64_t> hash_;   // per piece, once done_
    std::vector<uint8_t> done_;
    std::vector<std::size_t> first_;  // per entry: its first piece; count_ of them
    std::vector<std::size_t> count_;
    std::vector<uint64_t> empty_;     // per entry without bytes: the tree hash of nothing
    struct Run {
        uint32_t to = 0;
        uint64_t lo = 0, hi = 0;  // the bytes written to it one after the other, last
    };
    std::vector<Run> runs_;  // one per engine that was sent bytes of the chunk
    std::size_t hashed_ = 0;
};

}  // namespace wsync::ucx
