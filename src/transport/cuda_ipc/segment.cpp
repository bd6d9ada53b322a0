#include "transport/cuda_ipc/segment.hpp"

#include <cstring>
#include <fcntl.h>
#include <new>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.hpp"
#include "transport/cuda_ipc/init_info.hpp"

namespace wsync::cuda_ipc {

namespace {
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'I', 'P', 'C'};
constexpr uint32_t kLayoutVersion = 2;  // 2: senders counted per index on the board
}  // namespace

// The shared segment: identity, sender count, then the acknowledgement board.
struct Control {
    char magic[8];
    uint32_t layout;
    uint32_t senders;
    board::Board board;  // senders attach per index there (sender_pid), receivers per index
};

std::shared_ptr<BoardSegment> BoardSegment::create(uint32_t senders, uint32_t receivers,
                                                   uint32_t slots) {
    auto seg = std::shared_ptr<BoardSegment>(new BoardSegment());
    seg->name_ = "/wsync-ipc-" + sys::random_hex(16);
    seg->rendezvous_ = "wsync-ipc-" + sys::random_hex(16);
    int fd = sys::shm_create(seg->name_, sizeof(Control), false, kKind);
    seg->owner_ = true;
    seg->fd_ = fd;
    seg->receivers_ = receivers;
    seg->slots_ = slots;
    void *p;
    try {
        p = sys::map_shared(fd, 0, sizeof(Control), true, true, "cuda_ipc: board");
    } catch (...) {
        shm_unlink(seg->name_.c_str());
        throw;
    }
    auto *c = new (p) Control();
    std::memcpy(c->magic, kMagic, sizeof kMagic);
    c->layout = kLayoutVersion;
    c->senders = senders;
    board::init(&c->board, receivers, slots);
    seg->c_ = c;
    // A restarted engine re-attaches after the name is gone: this process hands the
    // segment's descriptor over an abstract socket (same user only), as shm does.
    seg->server_ = std::make_unique<sys::FdServer>(seg->rendezvous_, seg->fd_, kKind);
    return seg;
}

std::shared_ptr<BoardSegment> BoardSegment::attach(const std::string &name,
                                                   const std::string &rendezvous, uint32_t senders,
                                                   uint32_t receivers, uint32_t slots,
                                                   int64_t timeout_ms) {
    auto seg = std::shared_ptr<BoardSegment>(new BoardSegment());
    seg->name_ = name;
    const std::string gone = "the trainer is gone (the name was removed once every sender "
                             "and receiver had attached, and no live trainer answers for it)";
    int fd;
    try {
        fd = sys::shm_open_existing(name, sizeof(Control), kKind, gone);
    } catch (const Error &e) {
        if (e.status() != WSYNC_ERR_UNAVAILABLE) throw;
        fd = sys::fetch_fd(rendezvous, sys::Deadline(timeout_ms),
                           std::string(kKind) + ": segment '" + name + "'", gone);
        struct stat st;
        if (fstat(fd, &st) != 0 || uint64_t(st.st_size) != sizeof(Control)) {
            close(fd);
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": the segment handed over for '" +
                                         name + "' does not have the size of a board");
        }
    }
    seg->fd_ = fd;
    seg->receivers_ = receivers;
    seg->slots_ = slots;
    void *p = sys::map_shared(fd, 0, sizeof(Control), true, false, "cuda_ipc: board");
    seg->c_ = static_cast<Control *>(p);
    const Control *c = seg->c_;
    if (std::memcmp(c->magic, kMagic, sizeof kMagic) != 0 || c->layout != kLayoutVersion ||
        c->senders != senders || !board::matches(&c->board, receivers, slots))
        fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": segment '" + name +
                                     "' does not match its init info (layout or geometry)");
    return seg;
}

BoardSegment::~BoardSegment() {
    server_.reset();  // before the descriptor it serves is closed
    if (owner_) unlink();
    if (c_) munmap(c_, sizeof(Control));
    if (fd_ >= 0) close(fd_);
}

void BoardSegment::unlink_if_complete() {
    // Counted per sender index, so a destroyed sender is not counted.
    board::Waiter probe(&c_->board, fd_, receivers_, slots_, kKind);
    if (probe.attached_senders() >= c_->senders && probe.all_present()) unlink();
}

void BoardSegment::unlink() noexcept {
    if (!unlinked_) {
        shm_unlink(name_.c_str());  // ENOENT when another process removed it first: fine
        unlinked_ = true;
    }
}

board::Board *BoardSegment::board() const { return &c_->board; }

}  // namespace wsync::cuda_ipc
