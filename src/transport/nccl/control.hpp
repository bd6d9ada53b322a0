// nccl_broadcast's control channel: one TCP connection from each receiver to the sender, beside
// the communicator. NCCL carries the bytes; this carries what a collective cannot: which rank
// joined which broadcast, each chunk's outcome, and a loader's failure with its message, back to
// the trainer; and the abandon of a version forward to the engines. Why a socket and not a
// collective (docs/architecture.md, "nccl_broadcast's control channel"): a collective that one
// frozen rank never joins cannot name that rank, and a dead rank ends every collective.
//
// Frames are fixed 32-byte headers, then up to kMaxText bytes of text (a failure's message).
// Nothing read from a peer is trusted: a bad magic, type or length closes the connection, named.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sys.hpp"

namespace wsync::nccl {

enum class Msg : uint32_t {
    Hello = 1,      // receiver -> sender: a = group tag, b = index << 32 | pid
    Joined = 2,     // receiver -> sender: a = seq whose broadcast this rank has posted
    Ack = 3,        // receiver -> sender: a = seq this rank is done with, status = its outcome
    Failed = 4,     // receiver -> sender: a = version, b = chunk index, status, text = message
    Abandoned = 5,  // sender -> receiver: a = version the sender abandoned
};

struct Frame {
    uint32_t magic = 0;
    uint32_t type = 0;
    uint64_t a = 0;
    uint64_t b = 0;
    int32_t status = 0;
    uint32_t text_len = 0;
};
static_assert(sizeof(Frame) == 32, "the control frame is 32 bytes on the wire (both ends x86-64 "
                                   "or aarch64: little-endian, naturally aligned)");
inline constexpr uint32_t kFrameMagic = 0x4e435743;  // "CWCN"
inline constexpr uint32_t kMaxText = 255;            // a failure's message, as wsync_recv_fail keeps

struct Received {
    Frame frame;
    std::string text;
};

// Where receivers reach the sender: a port on each address of the sender's host.
struct ControlAddress {
    uint16_t port = 0;
    std::vector<std::string> hosts;  // numeric IPv4, tried in order
};

// The sender's listening socket, opened by create_init_info (its address goes into the init
// info) and handed to the sender made from that init info.
class Listener {
public:
    Listener();  // every IPv4 address of this host, an ephemeral port; WSYNC_ERR_SYSTEM
    ~Listener();
    Listener(const Listener &) = delete;
    Listener &operator=(const Listener &) = delete;
    int fd() const { return fd_; }
    const ControlAddress &address() const { return address_; }
    // A connection waiting to be accepted (non-blocking), or -1.
    int accept_one() noexcept;

private:
    int fd_ = -1;
    ControlAddress address_;
};

// One end of a connection: non-blocking, frames read as they arrive, writes bounded.
class Conn {
public:
    explicit Conn(int fd) : fd_(fd) {}
    ~Conn();
    Conn(const Conn &) = delete;
    Conn &operator=(const Conn &) = delete;
    int fd() const { return fd_; }
    // Sends one frame and its text within `deadline`; false (and closed) when the peer is
    // gone or the deadline passed with the frame half written.
    bool send(Msg type, uint64_t a, uint64_t b, int32_t status, const std::string &text,
              const sys::Deadline &deadline) noexcept;
    // Appends the whole frames that have arrived; never waits. A peer that closed, or sent
    // bytes that are not frames, leaves the connection closed with why() saying so.
    void read(std::vector<Received> *out) noexcept;
    bool closed() const { return fd_ < 0; }
    const std::string &why() const { return why_; }
    void close(const std::string &why) noexcept;

private:
    int fd_;
    std::string why_;
    std::vector<uint8_t> in_;
};

// Connects to the first address of `to` that answers within `deadline` (each address gets an
// equal share of what is left). Throws WSYNC_ERR_TIMEOUT or WSYNC_ERR_PEER naming `who`.
int connect_control(const ControlAddress &to, const sys::Deadline &deadline, const std::string &who);

// Waits up to `ms` for any of `fds` to be readable (negative entries skipped).
void wait_readable(const std::vector<int> &fds, int64_t ms) noexcept;

}  // namespace wsync::nccl
