// The acknowledgement board: a block of POSIX shared memory through which receivers on this
// machine tell senders that they are done with a chunk or why they failed it, and through
// which each side tells a dead peer from a slow one. Every strategy whose receivers are
// processes on the sender's host uses it (shm embeds it at the head of its segment; cuda_ipc
// keeps it in a small segment of its own). It knows chunks only as (slot, seq) pairs and
// versions only as numbers, nothing of any wire format.
//
// Who writes, reads and clears each word:
//
// | word                         | written by                         | read by            | cleared |
// |------------------------------|------------------------------------|--------------------|---------|
// | magic, layout, geometry      | creator, before the name exists    | attach (once; each | never   |
// |                              |                                    | side keeps its own |         |
// |                              |                                    | copy afterwards)   |         |
// | slot[s].seq                  | sender, release, after packing;    | receivers, acquire;| never   |
// |                              | kWithdrawn (seq_cst) when it takes | check again after  |         |
// |                              | back a chunk of an abandoned       | writing taken[r]   |         |
// |                              | version (withdraw)                 | (seq_cst)          |         |
// | slot[s].taken[r]             | receiver r, seq_cst: the seq it    | the sender, seq_cst| never   |
// |                              | begins reading, before it checks   | after writing      |         |
// |                              | slot[s].seq again                  | kWithdrawn         |         |
// | slot[s].ack[r]               | receiver r, release: seq<<8|status | senders, acquire   | never   |
// |                              | (also MISMATCH for a chunk it was  |                    |         |
// |                              | never given, once given a later    |                    |         |
// |                              | one: acknowledge_missed)           |                    |         |
// | slot[s].applied              | receivers, before their OK         | the sender that    | never   |
// |                              | acknowledgement: CAS to the max of | published seq, once|         |
// |                              | (seq tag, nanoseconds it spent     | acknowledged; a    |         |
// |                              | applying the chunk's patches);     | word of another    |         |
// |                              | a word of another seq's tag is     | seq's tag reads as |         |
// |                              | replaced (after 0.7.0; was padding)| not reported (0)   |         |
// | ack_futex                    | receivers (bump + wake)            | senders (futex)    | never   |
// | receiver[r].state            | receiver r: claim (JOINING/ATTACHED| senders, receiver | never   |
// |                              | via CAS), DETACHED at destroy;     |                    |         |
// |                              | senders: JOINING->ATTACHED (CAS,   |                    |         |
// |                              | with from_seq), any->DROPPED (CAS) |                    |         |
// | receiver[r].from_seq         | sender, before the CAS to ATTACHED | senders, receiver  | never   |
// | receiver[r].pid              | receiver r at claim (messages only)| senders            | never   |
// | receiver[r].failures, ring[] | receiver r (seqlock per record)    | every sender, each | never:  |
// |                              |                                    | with its own count | monotonic|
// | receiver[r].released        | receiver r, release: v once every  | senders, acquire   | 0 at    |
// |                              | IPC mapping versions <= v used and | (wait_released)    | attach  |
// |                              | v did not is closed (cuda_ipc);    |                    |         |
// |                              | kAllReleased after closing all,    |                    |         |
// |                              | before DETACHED                    |                    |         |
// | abandoned_version            | sender (max), when it abandons     | receivers          | never   |
// | newest_version, newest_seq   | sender (max), at each publish      | a sole sender made | never   |
// |                              |                                    | again on the board |         |
// |                              |                                    | (resume)           |         |
// | senders_seen                 | each sender once (fetch_add)       | receivers          | never   |
// | creator_pid                  | the segment's creator, before the  | attachers handed   | never   |
// |                              | name exists (plain; 0 before 0.7.0)| the segment by the |         |
// |                              |                                    | rendezvous: the pid|         |
// |                              |                                    | that served it     |         |
// | sender_pid[k]                | sender k: its pid by CAS when it   | senders (count of  | sender k|
// |                              | claims index k (0 -> pid, or a dead| attached senders;  | at      |
// |                              | claimer's pid -> pid)              | shm's audits every | destroy |
// |                              |                                    | word: one sender)  |         |
//
// Withdrawing a chunk of an abandoned version. A receiver that was never given such a chunk
// (its request was lost, or the trainer gave up before forwarding it) would never acknowledge
// it, and the sender could not reuse its slot or finish a flush. So before waiting on a slot
// whose chunk belongs to a version it abandoned, the sole sender of a board writes kWithdrawn
// to slot[s].seq and then reads each owing receiver's taken[r]; a receiver writes taken[r]
// before it reads a chunk and then checks slot[s].seq again. With sequentially consistent
// stores and loads on both sides, at least one of the two sees the other's write: either the
// sender sees taken[r] == seq and waits for that receiver's acknowledgement as usual, or the
// receiver sees kWithdrawn and refuses the chunk (WSYNC_ERR_ABANDONED) without reading a byte of
// it. Receivers that had not begun it owe it no more. Only a board's one sender may withdraw
// (with several cuda_ipc senders, another may still publish the same seq).
//
// Liveness is a kernel-held lock, not a pid: receiver r holds an OFD write lock on byte
// kLockBase + r of the segment's file, sender k on kLockBase + kMaxReceivers + k. A lock that is
// free where the state says ATTACHED means its holder died. Claiming an index is taking its
// lock (atomic in the kernel), so two processes can never hold one index.
//
// Nothing here trusts the shared words: every value read is range-checked, seqlocked records
// are copied out and validated, and the geometry used for addressing is the process's own copy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

#include "error.hpp"
#include "sys.hpp"
#include "wsync.h"

namespace wsync::board {

constexpr uint32_t kMaxReceivers = 64;
constexpr uint32_t kMaxSlots = 64;
constexpr uint32_t kMaxSenders = 64;
constexpr uint32_t kFailureRing = 4;        // failure records kept per receiver
constexpr std::size_t kMessageBytes = 240;  // of each record, NUL included
constexpr uint64_t kLockBase = uint64_t(1) << 40;  // lock bytes lie past any segment's end
// ReceiverSlot::released once a receiver has closed every mapping (it is detaching).
constexpr uint64_t kAllReleased = UINT64_MAX;
// slot[s].seq of a chunk its sender withdrew (never a chunk's seq: those fit in 56 bits).
constexpr uint64_t kWithdrawn = UINT64_MAX;
// The most failures one gathering wait (a flush) holds before it reports them: every record
// each receiver's ring can hold.
constexpr std::size_t kMaxHeldFailures = std::size_t(kMaxReceivers) * kFailureRing;

enum ReceiverState : uint32_t {
    kFree = 0,      // never attached
    kAttached = 1,  // owes every chunk from from_seq on
    kDetached = 2,  // destroyed its receiver
    kJoining = 3,   // (re)attached; owes nothing until a sender starts a version after it
    kDropped = 4,   // dropped by a sender; owes nothing
};

struct FailureRecord {
    std::atomic<uint32_t> gen;  // seqlock: odd while the receiver writes the record
    uint32_t status;
    uint64_t version;
    uint32_t chunk;
    int32_t pid;
    char message[kMessageBytes];
};

struct alignas(64) ReceiverSlot {
    std::atomic<uint32_t> state;
    std::atomic<int32_t> pid;
    std::atomic<uint64_t> from_seq;
    std::atomic<uint64_t> failures;  // records written so far; record n is ring[n % kFailureRing]
    std::atomic<uint64_t> released;  // IPC mappings closed up to this version (see the table)
    FailureRecord ring[kFailureRing];
};

struct alignas(64) ChunkSlot {
    std::atomic<uint64_t> seq;                 // chunk now held (0: never used)
    std::atomic<uint64_t> ack[kMaxReceivers];  // per receiver: seq << 8 | status
    std::atomic<uint64_t> taken[kMaxReceivers];  // per receiver: the seq it began reading
    // The most time one receiver spent applying the patches of the chunk (after 0.7.0: in what was
    // the slot's zeroed padding, so the layout version stays): seq's low kApplyTagBits bits
    // above kApplyNsBits bits of nanoseconds (see report_apply and reported_apply).
    std::atomic<uint64_t> applied;
};
constexpr unsigned kApplyNsBits = 40;  // up to 2^40 ns (18 minutes) a chunk
constexpr unsigned kApplyTagBits = 64 - kApplyNsBits;

// The shared layout. Zeroed memory plus init() is an empty board.
struct Board {
    char magic[8];
    uint32_t layout;
    uint32_t receivers;
    uint32_t slots;
    int32_t creator_pid;  // the segment's creator, which serves its rendezvous (0 before 0.7.0)
    std::atomic<uint32_t> ack_futex;  // bumped on every acknowledgement, failure and detach
    std::atomic<uint32_t> senders_seen;
    std::atomic<uint64_t> abandoned_version;
    std::atomic<uint64_t> newest_version;  // the newest version a sender published a chunk of
    std::atomic<uint64_t> newest_seq;      // the newest chunk seq a sender published
    std::atomic<int32_t> sender_pid[kMaxSenders];  // 0: index free
    ReceiverSlot receiver[kMaxReceivers];
    ChunkSlot slot[kMaxSlots];
};
// The layout is shared by every process of one board, possibly built apart (a trainer and an
// engine of different releases with the same kLayoutVersion): its sizes and offsets are pinned
// here, so a change that moves a word fails to compile instead of corrupting a peer. A change
// that must move one bumps kLayoutVersion (board_words.hpp) and these figures together.
static_assert(std::is_standard_layout<Board>::value, "the board is plain shared memory");
static_assert(sizeof(FailureRecord) == 264 && sizeof(ReceiverSlot) == 1088 &&
                  sizeof(ChunkSlot) == 1088 && sizeof(Board) == 139584,
              "the board's layout is pinned (layout version 5)");
static_assert(offsetof(ChunkSlot, applied) == 1032, "applied lies in what was padding");
static_assert(offsetof(Board, creator_pid) == 20 && offsetof(Board, ack_futex) == 24 &&
                  offsetof(Board, sender_pid) == 56 && offsetof(Board, receiver) == 320 &&
                  offsetof(Board, slot) == 69952,
              "the board's words stay where peers of layout version 5 read them");
// Receiver sets travel as 64-bit masks (list_indices, a flush's pending set): the cap is a type.
static_assert(kMaxReceivers <= 64 && kMaxSenders <= 64, "receiver and sender masks are 64 bits");
// An acknowledgement word is seq << 8 | status: every status must fit in its 8 bits (the
// failure records hold statuses whole, in 32 bits).
static_assert(WSYNC_ERR_SKIPPED < 256, "an acknowledgement carries a status in 8 bits");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "acks must be lock-free in shared memory");
static_assert(std::atomic<int32_t>::is_always_lock_free, "pids must be lock-free in shared memory");

// Starts the lifetimes in zeroed shared memory and writes the geometry.
Board *init(void *zeroed_memory, uint32_t receivers, uint32_t slots);
// True if the board's magic, layout and geometry are what the init info says.
bool matches(const Board *b, uint32_t receivers, uint32_t slots);

// "[0, 3]" for a bit mask of receiver indices.
std::string list_indices(uint64_t mask);

// ---- sender side --------------------------------------------------------------------------
// A sender's end of the board: it claims a sender index, publishes chunks, admits joiners,
// abandons versions, drops receivers, and waits for acknowledgements and releases.
class SenderEnd {
public:
    // `kind` prefixes every message ("shm: receiver 1 (pid 42) died ..."). `fd` is this
    // process's own descriptor of the board's file (for the liveness locks). receivers and
    // slots come from the init info, never from the shared words.
    SenderEnd(Board *b, int fd, uint32_t receivers, uint32_t slots, std::string kind);
    // Claims a sender index (sender_pid) and its lock (so receivers can tell the trainer died).
    void register_sender();
    // Gives the sender index back (the sender is destroyed): it no longer counts as attached.
    void unregister_sender() noexcept;
    // Senders attached now: claimed indices whose claimer is this process or holds its lock.
    uint32_t attached_senders() const;
    // Before publishing the first chunk of a version as `seq`: receivers that (re)attached
    // since the last version start owing chunks from `seq` on. Returns how many it admitted.
    uint32_t admit_joiners(uint64_t seq);
    // Publishes chunk `seq` in `slot`; `version` and `chunk` (this process's own record, never
    // shared) name it in failures that know only the seq (died, detached, timed out).
    void publish(uint32_t slot, uint64_t seq, uint64_t version, uint32_t chunk);
    // Marks the chunks of `version` this SenderEnd published as abandoned (so wait() may
    // withdraw them) and tells receivers.
    void abandon(uint64_t version);
    // This SenderEnd is its board's only sender: wait() may withdraw chunks of abandoned
    // versions that a receiver has not begun (see the table's notes). Off by default.
    // It also audits, at every wait(), the words only it writes (below).
    // `exclusive`: by design no other sender ever uses this board (shm: one segment, one
    // sender), so another index claimed in sender_pid is another process's write, reported
    // and put back by the audit, rather than a sender it must stand aside for (adversarial
    // trial: one forged 4-byte claim turned the audit and withdrawal off for good).
    void set_sole_sender(bool sole, bool exclusive = false) {
        sole_ = sole;
        exclusive_ = sole && exclusive;
    }
    void drop(uint32_t r);
    // Makes this SenderEnd go on after an earlier sole sender of the board, and returns where
    // it goes on from: the newest version (that one's, or an abandoned one's) and chunk seq
    // published here, so its first version and seq come after them. Receivers that stayed
    // attached then take its versions as newer ones, and no acknowledgement of an earlier chunk
    // can answer one of its own (a seq restarting at 1 would find the old sender's answer to
    // seq 1 in the slot). The seq is the newest the board shows anywhere (the newest_seq word,
    // slot, acknowledgement and taken words), so a word lowered by another process cannot
    // bring that back. From here on this SenderEnd waits only for its own chunks (the earlier
    // sender's were in its own buckets: undelivered or withdrawn ones no longer hold a slot)
    // and reports only failures recorded from now on (the earlier sender reported or abandoned
    // the rest) of its own versions (an engine records the earlier sender's open version lost
    // only when this one's first chunk reaches it). {0, 0} on a fresh board. Throws
    // WSYNC_ERR_PEER if the words are beyond what a sender writes (seqs fit 56 bits, versions
    // 62), so the next would not fit.
    std::pair<uint64_t, uint64_t> resume();
    // True once every receiver that is not dropped holds its index (attached or joining).
    // `self`: the index the calling process holds itself (its own lock is invisible to it).
    bool all_present(uint32_t self = UINT32_MAX) const;
    // Waits until every receiver that owes it has acknowledged, for each slot in `slots`, the
    // newest chunk up to `max_seq` that went to that slot (bucket reuse: seq - 1; flush: this
    // sender's last seq). Fails first, with WSYNC_ERR_PEER, when a receiver wrote a
    // failure record this SenderEnd has not reported yet (each once, oldest first, every receiver
    // in one error), or when a receiver owing a chunk died, detached or was replaced; with
    // WSYNC_ERR_TIMEOUT at the deadline naming the receivers that did not answer. The thrown
    // Error carries the failures as data. A sole sender first withdraws those chunks that
    // belong to a version it abandoned: receivers that had not begun one are not waited for.
    // `gather` (a flush): a failure does not end the wait at once. The receivers that failed
    // (or died, or detached owing a chunk) are no longer waited for, the others are, until each
    // has answered or failed or the deadline passes; then one WSYNC_ERR_PEER names every
    // failure (and, at the deadline, the receivers that did not answer). So a version that
    // fails on several engines is reported whole by its flush, not one engine per call, with
    // the slower engines' failures failing the next version's sends (Python trainer trial).
    void wait(const std::vector<uint32_t> &slots, const sys::Deadline &deadline, const char *what,
              uint64_t max_seq, bool gather = false);

    // Waits until every receiver that may still map memory of `version` has closed every IPC
    // mapping that versions <= `version` used and `version` did not (kAllReleased: every
    // mapping), i.e. receiver[r].released >= version. Receivers that are dropped, detached,
    // dead, never attached, or joined after the version's last chunk `last_seq` map nothing of
    // it. WSYNC_ERR_TIMEOUT at the deadline names the receivers and how far each has released.
    void wait_released(uint64_t version, uint64_t last_seq, const sys::Deadline &deadline,
                       const char *what);

    // The engines' apply time of `version` as reported on the board (report_apply), in
    // nanoseconds: per chunk this SenderEnd published, the largest report of any receiver,
    // summed over the version's chunks (so at least the slowest engine's, when one engine is
    // the slowest at every chunk). Reports arrive before the acknowledgements: after a flush
    // the figure is whole, before it, it holds the chunks answered so far. 0: no report
    // (engines of 0.7.0 and before, no patches, an abandoned version). The newest kAppliedKept
    // versions are kept. Untrusted: each chunk's report is at most 2^40 - 1 ns.
    uint64_t applied_ns(uint64_t version);

private:
    // Adds what receivers reported since the last look for the chunk published in `slot`.
    void harvest_apply(uint32_t slot);
    static constexpr std::size_t kAppliedKept = 8;
    std::vector<std::pair<uint64_t, uint64_t>> applied_;  // (version, ns), oldest first
    uint64_t releases_pending(uint64_t version, uint64_t last_seq) const;
    uint64_t want(uint32_t slot, uint64_t max_seq) const;
    bool owes(uint32_t r, uint64_t seq) const;
    // Whether receiver r still has to acknowledge chunk `want` in `slot` (it owes it, has not
    // acknowledged it, and was not excused when the chunk was withdrawn).
    bool awaits(uint32_t r, uint32_t slot, uint64_t want) const;
    void withdraw_abandoned(const std::vector<uint32_t> &slots, uint64_t max_seq);
    uint64_t pending(const std::vector<uint32_t> &slots, uint64_t max_seq) const;
    uint64_t oldest_pending_seq(uint32_t r, const std::vector<uint32_t> &slots,
                                uint64_t max_seq) const;
    void collect_failures(std::vector<Failure> &out);
    // A sole sender's check of the words only it writes: each slot's seq (what it published or
    // withdrew there), abandoned_version (the newest version it abandoned, or the board's value
    // when it was made), each receiver's from_seq and a DROPPED state it did not set. A word
    // that differs was written by another process (a stray or forged write: hostile-peer
    // trial, where one such write made every later flush time out, or made the trainer's
    // flush return OK while engines refused every version): each is put back, and wait()
    // fails with WSYNC_ERR_PEER naming them (the version in flight is abandoned: the words
    // receivers acted on were not the sender's). Nothing happens while another sender is
    // attached (its writes are legitimate).
    void audit();
    // An exclusive sender's part of the audit: sender_pid words other than its own claim.
    void audit_claims(std::vector<std::string> &words);
    // A sole sender: WSYNC_ERR_PEER, once per chunk and receiver, for an acknowledgement with
    // status ABANDONED of a chunk of a version this sender did not abandon. A receiver answers
    // so only when the board's abandoned_version names its version, so another process wrote
    // that word (even if it put it back before the audit looked): the receiver failed the
    // version while its acknowledgement alone would count it done (adversarial trial: the
    // trainer's flush said OK, the engine held a mix of two versions).
    void check_abandoned_acks(const std::vector<uint32_t> &slots, uint64_t max_seq);
    // WSYNC_ERR_PEER with every failure record not reported yet, if there is one.
    void throw_new_failures();
    // Marks receiver r's failure records so far as read (not reported).
    void skip_records(uint32_t r);
    void check_alive(uint64_t mask, const std::vector<uint32_t> &slots, uint64_t max_seq);
    int32_t pid_of(uint32_t r) const;
    friend struct SenderEndProbe;  // tests/test_board.cpp: races replayed one step at a time

    Board *b_;
    int fd_;
    uint32_t receivers_, slots_;
    std::string kind_;
    // Names `f` (version, chunk index) by the chunk `seq` this sender published, when it did
    // and the slot still holds it; the message then says "chunk c of version v (seq s)".
    std::string label(uint64_t seq, Failure &f) const;
    uint64_t reported_[kMaxReceivers] = {};
    uint64_t floor_seq_ = 0;  // resume(): chunks before this seq are an earlier sender's
    uint64_t floor_version_ = 0;  // resume(): versions up to this are an earlier sender's
    uint32_t sender_index_ = UINT32_MAX;  // claimed by register_sender
    struct Published {
        uint64_t seq = 0, version = 0;
        uint32_t chunk = 0;
        bool abandoned = false;  // its version was abandoned
        bool withdrawn = false;  // slot word set to kWithdrawn
        uint64_t excused = 0;    // receivers that had not begun it when it was withdrawn
        uint64_t odd_acks = 0;   // receivers whose ABANDONED answer to it was reported
        uint64_t applied = 0;    // the apply time reported for it, as far as counted
    };
    bool sole_ = false;
    bool exclusive_ = false;
    // What this SenderEnd last wrote (or found when it was made) in words only senders write,
    // for audit().
    uint64_t abandoned_floor_ = 0;
    uint64_t from_seq_[kMaxReceivers] = {};
    uint64_t dropped_ = 0;  // receivers this SenderEnd dropped (and has not re-admitted)
    uint64_t expect_slot_[kMaxSlots] = {};  // each slot's seq word as last written here (0: not known)
    bool stale_ = false;  // another sender may have written since the last look: look again
    // Takes what the board says now as what this SenderEnd expects (see stale_).
    void snapshot();
    // Versions this SenderEnd abandoned (the newest kAbandonedKept): a receiver's failure record
    // of one of them tells the trainer nothing it does not know (a late request of an abandoned
    // version refused) and is not reported; nor are records of a receiver the sender dropped.
    static constexpr std::size_t kAbandonedKept = 256;
    std::vector<uint64_t> abandoned_;
    bool abandoned_here(uint64_t version) const;
    Published published_[kMaxSlots];  // per slot: the last chunk this sender published there
};

// ---- receiver side ------------------------------------------------------------------------
// Claims receiver index `index` for this process through its own descriptor `fd` of the board's
// file: atomic (the kernel lock). Throws WSYNC_ERR_WRONG_STATE if a live receiver holds it. A
// never-used index is owed every chunk from the start; a used one (restart) joins at the next
// version a sender begins.
void attach(Board *b, int fd, uint32_t index, const std::string &kind);
// Marks the receiver detached and wakes waiting senders (the lock goes with the descriptor).
void detach(Board *b, uint32_t index) noexcept;
// Receiver `index` has closed every IPC mapping that versions <= `version` used and `version`
// did not (kAllReleased: all of them). Monotonic: a smaller value than the current is ignored.
void release(Board *b, uint32_t index, uint64_t version) noexcept;
// The chunk a slot holds now (acquire): a request for another seq is stale or replayed.
uint64_t published_seq(const Board *b, uint32_t slot);
// Writes a failure record (status, version, chunk, message) for the sender to report; before
// the failed acknowledgement, so a sender that sees the ack finds the record.
void record_failure(Board *b, uint32_t index, wsync_status_t status, uint64_t version,
                    uint32_t chunk, const std::string &message) noexcept;
void acknowledge(Board *b, uint32_t index, uint32_t slot, uint64_t seq,
                 wsync_status_t outcome) noexcept;
// Before its OK acknowledgement of chunk `seq` in `slot`: this receiver spent `ns`
// nanoseconds applying the chunk's patches. Raises the slot's applied word to the largest
// report for `seq` (a word tagged with another seq is replaced); `ns` is capped to what the
// word holds. 0 writes nothing. Never throws.
void report_apply(Board *b, uint32_t slot, uint64_t seq, uint64_t ns) noexcept;
// The largest apply time receivers reported for chunk `seq` in `slot`, in nanoseconds; 0 when
// none did (engines of 0.7.0 and before, a chunk without patches) or the word is tagged with another
// seq. A hint from other processes: the caller bounds what it makes of it.
uint64_t reported_apply(const Board *b, uint32_t slot, uint64_t seq) noexcept;
// The seq receiver `index` last took in `slot`.
uint64_t taken_seq(const Board *b, uint32_t index, uint32_t slot) noexcept;
// Acknowledges chunk `seq` with `outcome` unless this receiver's acknowledgement of `slot` is
// already at `seq` or later (never moves it back).
void acknowledge_taken(Board *b, uint32_t index, uint32_t slot, uint64_t seq,
                       wsync_status_t outcome) noexcept;
// Before reading chunk `seq` in `slot`: records that receiver `index` begins it (taken), then
// checks that the slot still holds it. False if the sender withdrew it (or replaced it) in the
// meantime: the receiver must not read it.
bool take(Board *b, uint32_t index, uint32_t slot, uint64_t seq) noexcept;
// Whether receiver `index` has been dropped by a sender, which may then reuse the buckets it
// was reading. Reads of shared chunk memory made before the call are covered: if one of them
// saw bytes the sender wrote after dropping, this answers true (an acquire fence here pairs
// with the release fence in SenderEnd::drop).
bool dropped(const Board *b, uint32_t index) noexcept;
// Whether receiver `index`'s acknowledgement word of `slot` says chunk `seq` (or a later one)
// is answered. A receiver still reading that chunk has not answered it: if the word says so,
// another process wrote it, and the sender may be reusing the bucket under the reader. An
// acquire fence orders the read after the reader's reads of the chunk; nothing on the sender's
// side pairs with it (the forger's write is not the sender's to order), so this is certain on
// x86 and ARMv8 as they order stores, and a best effort against a stray write elsewhere.
bool acknowledged(const Board *b, uint32_t index, uint32_t slot, uint64_t seq) noexcept;
// What the receiver's own slot says now.
struct Standing {
    uint32_t state;
    uint64_t from_seq;
    uint64_t abandoned_version;
    bool sender_gone;  // a sender registered and none holds its lock any more
};
Standing standing(const Board *b, int fd, uint32_t index);

}  // namespace wsync::board
