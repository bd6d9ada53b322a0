// The shared segment of the same-host strategies: one named POSIX shared-memory object whose
// head is the acknowledgement board (board.hpp), optionally followed by a data region of
// `slots` buckets (shm puts the weights there; cuda_ipc's segment is the board alone, its bytes
// stay on the GPU).
//
// Lifetime of the name: the creator makes it under a fresh random name and serves the
// descriptor over an abstract socket (the rendezvous), so a process that attaches after the
// name is gone (an engine restarted) still gets it from a live creator. The name is removed as
// soon as every process that must attach has (unlink_if_complete), and at the latest when the
// creator's object goes away: from then on a killed trainer leaves nothing in /dev/shm.
//
// The data region: shm's buckets (the sender writes bucket b only once every receiver has
// acknowledged its previous chunk; receivers read it between a request and their
// acknowledgement), then, with "arena_bytes" (layout 4), the sender's arena: written by the
// trainer's own code only, between syncs (after the flush that covers its tensors), read by
// receivers for the chunks that list its tensors, cleared by nobody. Receivers map the whole
// region read-only.
//
// The head, written once by the creator before the name exists and read once by each attacher
// (who keeps its own copy of the geometry and never re-reads it for addressing):
//
// | word         | meaning                                                                  |
// |--------------|--------------------------------------------------------------------------|
// | magic[8]     | the kind's magic ("WSYNCSHM", "WSYNCIPC")                                |
// | layout       | the kind's layout version; another version is WSYNC_ERR_MISMATCH         |
// | senders      | sender indices that must attach before the name goes (0: not counted)    |
// | bucket_bytes | bytes per bucket of the data region (0: no data region)                  |
// |              | (shm layout 4: the region ends with the sender's arena, after the buckets) |
// | data_offset  | where the data region starts (64 KiB aligned; the head's size if none)   |
// | total_bytes  | the object's size                                                        |
// | board        | the acknowledgement board; its own table is in board.hpp                 |
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/local/board.hpp"
#include "strategy.hpp"
#include "sys.hpp"

namespace wsync {

// What a kind's segment looks like; every field comes from the strategy's options or its init
// info, never from shared memory.
struct SegmentGeometry {
    const char *kind;         // prefixes messages: "shm", "cuda_ipc"
    const char *name_prefix;  // "wsync-", "wsync-ipc-": names are prefix + 16 random hex digits
    char magic[8];
    uint32_t layout;
    uint32_t senders;         // see the table; 0 for shm, whose creator is its only sender
    uint32_t receivers, slots;
    uint64_t bucket_bytes;    // 0: a board-only segment
    uint64_t arena_bytes = 0; // shm: the sender's arena after the buckets (a whole number of pages)
};

// Where the board lies in a segment (bytes from its start); for white-box tests.
std::size_t board_offset() noexcept;

class SharedSegment {
public:
    // Creates, sizes (reserving the data region with posix_fallocate, so a full /dev/shm is an
    // error now and not a SIGBUS later), pre-faults and initialises the segment, then serves its
    // descriptor on a fresh rendezvous name. WSYNC_ERR_INVALID_ARGUMENT if the size overflows,
    // WSYNC_ERR_SYSTEM / WSYNC_ERR_RESOURCE from the OS.
    static std::shared_ptr<SharedSegment> create(const SegmentGeometry &g);
    // Maps an existing segment, head read-write (for acknowledgements), data read-only: by name
    // while it exists, else through the creator's rendezvous socket within timeout_ms.
    // WSYNC_ERR_UNAVAILABLE when neither answers (the message says the trainer is gone),
    // WSYNC_ERR_MISMATCH when the segment does not match `g` (layout, geometry or size).
    static std::shared_ptr<SharedSegment> attach(const std::string &name,
                                                 const std::string &rendezvous,
                                                 const SegmentGeometry &g, int64_t timeout_ms);
    ~SharedSegment();
    SharedSegment(const SharedSegment &) = delete;
    SharedSegment &operator=(const SharedSegment &) = delete;

    // Removes the name if every sender (when counted) and every receiver that is not dropped
    // holds its index. `self`: the receiver index this process holds (its own lock is invisible
    // to it). Any process may call it; never throws (a failed probe leaves the name for later).
    void unlink_if_complete(uint32_t self = UINT32_MAX) noexcept;
    // Removes the name now (ENOENT, when another process removed it first, is fine).
    void unlink() noexcept;

    board::Board *board() const;
    // Bucket b's first byte (b < slots; data region only; read-only in attachers).
    uint8_t *bucket(uint32_t b) const { return data_ + uint64_t(b) * g_.bucket_bytes; }
    // The arena (shm's "arena_bytes"): the data region's last arena_bytes() bytes, after the
    // buckets; nullptr when it has none. Read-only in attachers.
    uint8_t *arena() const { return g_.arena_bytes ? bucket(g_.slots) : nullptr; }
    uint64_t arena_bytes() const { return g_.arena_bytes; }
    // Whether [p, p + len) overlaps the data region (buckets and arena), read-only in attachers.
    bool data_overlaps(const void *p, uint64_t len) const noexcept {
        const auto a = reinterpret_cast<uintptr_t>(p), d = reinterpret_cast<uintptr_t>(data_);
        return len != 0 && a < d + (total_ - data_offset_) && d < a + len;
    }
    const std::string &name() const { return name_; }
    const std::string &rendezvous() const { return rendezvous_; }
    // The descriptor the liveness locks live on (board.hpp): an open file description of this
    // process's own that nothing is mapped from and that a forked child does not keep
    // (sys::open_parent_only), so the locks die with this process whatever its children do
    // (issue 38: a mapping, inherited by fork, holds its description, and the locks with it).
    int lock_fd() const { return lock_fd_; }
    const char *kind() const { return g_.kind; }  // "shm", "cuda_ipc": prefixes messages
    uint32_t receivers() const { return g_.receivers; }
    uint32_t slots() const { return g_.slots; }
    uint64_t bucket_bytes() const { return g_.bucket_bytes; }
    bool unlinked() const { return unlinked_; }

    // What receiver `index`'s board entries say of its link (dropped, sender gone, newest
    // abandoned version): ReceiverImpl::link for every strategy with a board.
    Link link(uint32_t index) const;

    // A request for chunk `seq` in `slot` to receiver `index`, checked against the board:
    // WSYNC_ERR_MISMATCH when the receiver (re)attached while the chunk's version was in flight
    // (it takes part from the next version), or when the slot holds another chunk (a stale or
    // replayed request), WSYNC_ERR_ABANDONED when the sender withdrew it (board.hpp). On
    // success the receiver has taken the chunk: the sender waits for its acknowledgement.
    // `what` names the request in the message ("request", "commit request").
    void check_owed(uint32_t index, uint32_t slot, uint64_t seq, const char *what) const;
    // Whether receiver `index` may answer chunk `seq` in `slot` (acknowledge or refuse it): the
    // slot holds that chunk and the receiver, attached, owes it. Never throws.
    bool may_answer(uint32_t index, uint32_t slot, uint64_t seq) const noexcept;
    // Receiver `index`, answering chunk `seq` (which it may answer), has not been given the
    // chunks between `last` (the newest it was given; 0: none) and `seq`: a request lost on the
    // way, or one of a version the sender abandoned before its requests were delivered. Each
    // such chunk still in its slot and owed is acknowledged as missed (WSYNC_ERR_MISMATCH), so
    // the sender's bucket reuse and flush do not wait for requests that will never come; a
    // late one is then refused as stale (its slot may hold another chunk by then). Never throws.
    void acknowledge_missed(uint32_t index, uint64_t last, uint64_t seq) const noexcept;

    bool sender_made = false;  // shm: the strategy that created it makes one sender only

private:
    explicit SharedSegment(const SegmentGeometry &g);
    void map(bool creator);
    void open_lock_description();

    SegmentGeometry g_;
    std::string name_, rendezvous_;
    std::unique_ptr<sys::FdServer> server_;  // the creator's: serves fd_ to late attachers
    int fd_ = -1;       // the mapped description; the one served to late attachers
    int lock_fd_ = -1;  // see lock_fd(); fd_ itself only where no second description can be had
    uint8_t *head_ = nullptr;  // data_offset_ bytes, read-write
    uint8_t *data_ = nullptr;  // total_ - data_offset_ bytes; read-only in attachers
    uint64_t data_offset_ = 0, total_ = 0;
    bool owner_ = false;
    bool unlinked_ = false;
};

}  // namespace wsync
