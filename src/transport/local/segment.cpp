#include "transport/local/segment.hpp"

#include <algorithm>

#include <cinttypes>
#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.hpp"
#include "plan/layout.hpp"

namespace wsync {

namespace {

// The head (table in segment.hpp).
struct Head {
    char magic[8];
    uint32_t layout;
    uint32_t senders;
    uint64_t bucket_bytes;
    uint64_t data_offset;
    uint64_t total_bytes;
    board::Board board;
};
// Pinned like the board (board.hpp): peers of one layout find the head's words where they are.
static_assert(std::is_standard_layout<Head>::value && offsetof(Head, board) == 64 &&
                  sizeof(Head) == 139648,
              "the segment head's layout is pinned");

constexpr uint64_t kDataAlign = 65536;  // the data region starts on a 64 KiB boundary

}  // namespace

SharedSegment::SharedSegment(const SegmentGeometry &g) : g_(g) {
    data_offset_ = g.bucket_bytes ? layout::round_up(sizeof(Head), kDataAlign) : sizeof(Head);
    auto data = mul_u64(g.slots, g.bucket_bytes);
    auto with_arena = data ? add_u64(*data, g.arena_bytes) : std::nullopt;
    auto total = with_arena ? add_u64(data_offset_, *with_arena) : std::nullopt;
    if (!total)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(g.kind) + ": buckets x bucket_bytes + arena_bytes overflows");
    total_ = *total;
}

void SharedSegment::map(bool creator) {
    const std::string kind = g_.kind;
    head_ = static_cast<uint8_t *>(
        sys::map_shared(fd_, 0, data_offset_, true, creator, kind + ": segment head"));
    if (total_ > data_offset_)
        data_ = static_cast<uint8_t *>(sys::map_shared(fd_, data_offset_, total_ - data_offset_,
                                                       creator, true, kind + ": data buckets"));
}

void SharedSegment::open_lock_description() {
    lock_fd_ = sys::open_parent_only([&] {
        int fd = sys::open_own(fd_);
        if (fd < 0 && !unlinked_) fd = shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
        return fd;
    });
    if (lock_fd_ < 0) lock_fd_ = fd_;  // no /proc and no name: a forked child keeps the locks
}

std::shared_ptr<SharedSegment> SharedSegment::create(const SegmentGeometry &g) {
    auto seg = std::shared_ptr<SharedSegment>(new SharedSegment(g));
    seg->name_ = "/" + std::string(g.name_prefix) + sys::random_hex(16);
    seg->rendezvous_ = g.name_prefix + sys::random_hex(16);
    seg->fd_ = sys::shm_create(seg->name_, seg->total_, /*reserve=*/g.bucket_bytes != 0, g.kind);
    seg->owner_ = true;  // from here the destructor removes the name
    seg->map(true);
    seg->open_lock_description();
    Head *h = new (seg->head_) Head();  // the file is zero; this just starts lifetimes
    std::memcpy(h->magic, g.magic, sizeof h->magic);
    h->layout = g.layout;
    h->senders = g.senders;
    h->bucket_bytes = g.bucket_bytes;
    h->data_offset = seg->data_offset_;
    h->total_bytes = seg->total_;
    board::init(&h->board, g.receivers, g.slots);
    h->board.creator_pid = static_cast<int32_t>(getpid());
    seg->server_ = std::make_unique<sys::FdServer>(seg->rendezvous_, seg->fd_, g.kind);
    return seg;
}

std::shared_ptr<SharedSegment> SharedSegment::attach(const std::string &name,
                                                     const std::string &rendezvous,
                                                     const SegmentGeometry &g,
                                                     int64_t timeout_ms) {
    auto seg = std::shared_ptr<SharedSegment>(new SharedSegment(g));
    seg->name_ = name;
    const std::string kind = g.kind;
    const std::string gone = "the sender is gone (the segment's name was removed once every "
                             "process had attached, and no live sender answers for it)";
    int32_t server_pid = 0;  // who handed the segment over, if the rendezvous did
    try {
        seg->fd_ = sys::shm_open_existing(name, seg->total_, kind, gone);
    } catch (const Error &e) {
        if (e.status() != WSYNC_ERR_UNAVAILABLE) throw;
        // The handed-over descriptor shares the sender's open file description; this
        // process's liveness lock must be its own (sys::reopen_own).
        seg->fd_ = sys::reopen_own(sys::fetch_fd(rendezvous, sys::Deadline(timeout_ms),
                                                 kind + ": segment '" + name + "'", gone,
                                                 &server_pid),
                                   kind + ": segment '" + name + "'");
        struct stat st;
        if (fstat(seg->fd_, &st) != 0 || uint64_t(st.st_size) != seg->total_)
            fail(WSYNC_ERR_MISMATCH, kind + ": the segment handed over for '" + name +
                                         "' does not have the size its init info implies");
    }
    seg->map(false);
    seg->open_lock_description();
    const Head *h = reinterpret_cast<const Head *>(seg->head_);
    if (std::memcmp(h->magic, g.magic, sizeof h->magic) != 0 || h->layout != g.layout ||
        h->senders != g.senders || h->bucket_bytes != g.bucket_bytes ||
        h->data_offset != seg->data_offset_ || h->total_bytes != seg->total_ ||
        !board::matches(&h->board, g.receivers, g.slots))
        fail(WSYNC_ERR_MISMATCH, kind + ": segment '" + name +
                                     "' does not match its init info (layout or geometry)");
    // Handed over by the rendezvous: the process that served it must be the one that created
    // it, where this process can tell (same PID namespace, a creator of 0.7.0 or later).
    const int32_t creator = h->board.creator_pid;
    if (server_pid > 0 && creator > 0 && server_pid != creator && sys::same_pid_namespace(server_pid))
        fail(WSYNC_ERR_UNAVAILABLE,
             kind + ": refused segment '" + name + "': the process that handed it over (pid " +
                 std::to_string(server_pid) + ") is not the one that created it (pid " +
                 std::to_string(creator) + "); " + gone);
    return seg;
}

SharedSegment::~SharedSegment() {
    server_.reset();  // before the descriptor it serves is closed
    if (owner_) unlink();
    if (data_) munmap(data_, total_ - data_offset_);
    if (head_) munmap(head_, data_offset_);
    if (lock_fd_ >= 0 && lock_fd_ != fd_) sys::close_parent_only(lock_fd_);
    if (fd_ >= 0) close(fd_);
}

void SharedSegment::unlink_if_complete(uint32_t self) noexcept {
    try {
        board::SenderEnd probe(board(), lock_fd_, g_.receivers, g_.slots, g_.kind);
        // Senders are counted per index, so a destroyed sender is not counted.
        if ((g_.senders == 0 || probe.attached_senders() >= g_.senders) && probe.all_present(self))
            unlink();
    } catch (...) {
    }
}

void SharedSegment::unlink() noexcept {
    if (!unlinked_) {
        shm_unlink(name_.c_str());
        unlinked_ = true;
    }
}

Link SharedSegment::link(uint32_t index) const {
    board::Standing s = board::standing(board(), lock_fd_, index);
    Link l;
    l.dropped = s.state == board::kDropped;
    l.joining = s.state == board::kJoining;
    l.sender_gone = s.sender_gone;
    l.abandoned_version = s.abandoned_version;
    return l;
}

void SharedSegment::check_owed(uint32_t index, uint32_t slot, uint64_t seq,
                               const char *what) const {
    const board::Standing st = board::standing(board(), lock_fd_, index);
    if (st.state == board::kJoining || seq < st.from_seq)
        failf(WSYNC_ERR_MISMATCH,
              "%s: this receiver (re)attached after chunk seq %" PRIu64
              "'s version began; it takes part from the next version on",
              g_.kind, seq);
    const uint64_t held = board::published_seq(board(), slot);
    // Taken before it is read, so the sender either waits for this receiver or sees that it
    // had not begun a chunk it withdraws (board.hpp).
    if (held == seq && board::take(board(), index, slot, seq)) return;
    if (held == seq) {
        // Taken, then found withdrawn: the sender may have seen our take too (both sides can
        // see each other), and then it waits for this receiver's answer. Nothing was read.
        board::acknowledge_taken(board(), index, slot, seq, WSYNC_ERR_ABANDONED);
    }
    if (held == board::kWithdrawn || board::published_seq(board(), slot) == board::kWithdrawn)
        failf(WSYNC_ERR_ABANDONED,
              "%s: chunk seq %" PRIu64 " was withdrawn: the sender abandoned its version before "
              "this receiver began it",
              g_.kind, seq);
    failf(WSYNC_ERR_MISMATCH,
          "%s: stale or replayed %s: slot %u holds chunk seq %" PRIu64 ", the %s is for seq %" PRIu64,
          g_.kind, what, slot, board::published_seq(board(), slot), what, seq);
}

bool SharedSegment::may_answer(uint32_t index, uint32_t slot, uint64_t seq) const noexcept {
    try {
        const board::Standing st = board::standing(board(), lock_fd_, index);
        // A chunk this receiver took before the sender withdrew it is still awaited from it.
        const uint64_t held = board::published_seq(board(), slot);
        const bool ours = held == seq || (held == board::kWithdrawn &&
                                          board::taken_seq(board(), index, slot) == seq);
        return ours && st.state == board::kAttached && seq >= st.from_seq;
    } catch (...) {
        return false;
    }
}

void SharedSegment::acknowledge_missed(uint32_t index, uint64_t last, uint64_t seq) const noexcept {
    // Only the last `slots` seqs before `seq` can still be in their slots.
    const uint64_t slots = g_.slots;
    uint64_t from = std::max<uint64_t>(last + 1, seq > slots ? seq - slots : 1);
    for (uint64_t s = from; s < seq; ++s) {
        const uint32_t slot = static_cast<uint32_t>((s - 1) % slots);
        if (may_answer(index, slot, s)) board::acknowledge(board(), index, slot, s, WSYNC_ERR_MISMATCH);
    }
}

board::Board *SharedSegment::board() const { return &reinterpret_cast<Head *>(head_)->board; }

std::size_t board_offset() noexcept { return offsetof(Head, board); }

}  // namespace wsync
