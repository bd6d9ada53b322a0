// nccl_broadcast's control channel: one TCP connection from each receiver to the sender, beside
// the communicator. NCCL carries the bytes; this carries what a collective cannot: which rank
// joined which broadcast, each chunk's outcome, and a loader's failure with its message, back to
// the trainer; and the abandon of a version forward to the engines. Why a socket and not a
// collective (docs/architecture.md, "nccl_broadcast's control channel"): a collective that one
// frozen rank never joins cannot name that rank, and a dead rank ends every collective.
//
// Who may talk to the sender (docs/failure-model.md, "Who may talk to a trainer"): only a
// process that holds the init info. create_init_info draws a 32-byte key that travels only in
// the init info. A receiver's hello carries a fresh 16-byte nonce and an HMAC-SHA256 with that
// key over the hello; the sender refuses a hello whose MAC is wrong, whose nonce it has seen,
// or whose index is taken. Every later frame, both ways, carries HMAC(connection key, direction
// | frame number | frame), the connection key being HMAC(key, "wsync-nccl-conn" | index |
// group | nonce), and frame numbers rising by one per direction: a stranger can neither open a
// receiver's connection nor add a frame to one. Frames are a fixed 32-byte header, up to
// kMaxText bytes of payload (a failure's message, a hello's nonce), then the 32-byte MAC.
// Nothing read from a peer is trusted: a bad magic, type, length or MAC closes the connection.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "auth/hmac.hpp"
#include "sys.hpp"

namespace wsync::nccl {

enum class Msg : uint32_t {
    Hello = 1,      // receiver -> sender: a = group tag, b = index << 32 | pid, text = nonce
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
    auth::Mac mac;  // checked by the connection once it has its key; a hello's by the sender
};

// Where receivers reach the sender: a port on each address of the sender's host, and the key.
struct ControlAddress {
    uint16_t port = 0;
    std::vector<std::string> hosts;  // numeric IPv4, tried in order
    auth::Key key{};
};

// The MAC of a hello made with the init info's key.
auth::Mac hello_mac(const auth::Key &key, const Frame &f, const std::string &nonce);
// The key of a receiver's connection.
auth::Key connection_key(const auth::Key &key, uint32_t index, uint64_t group, const std::string &nonce);

// The sender's listening socket, opened by create_init_info (its address goes into the init
// info) and handed to the sender made from that init info.
class Listener {
public:
    // An ephemeral port on `interface`'s IPv4 address ("" : every IPv4 address of this host),
    // and a fresh key. WSYNC_ERR_INVALID_ARGUMENT for an interface without one, else
    // WSYNC_ERR_SYSTEM.
    explicit Listener(const std::string &interface);
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
    // From now on frames are sent with, and read frames checked against, `key` (the sender
    // sends 'S' frames and reads 'R' ones; a receiver the other way round).
    void authenticate(const auth::Key &key, char sends) noexcept;
    // The hello: sent with the init info's key, before authenticate().
    bool send_hello(const auth::Key &key, uint64_t group, uint64_t index_pid, const std::string &nonce,
                    const sys::Deadline &deadline) noexcept;
    ~Conn();
    Conn(const Conn &) = delete;
    Conn &operator=(const Conn &) = delete;
    int fd() const { return fd_; }
    // Sends one frame and its text within `deadline`; false (and closed) when the peer is
    // gone or the deadline passed with the frame half written.
    bool send(Msg type, uint64_t a, uint64_t b, int32_t status, const std::string &text,
              const sys::Deadline &deadline) noexcept;
    // Appends the whole frames that have arrived; never waits. Before authenticate(), at most
    // one (the hello, its MAC unchecked). A peer that closed, or sent bytes that are not frames
    // or a frame whose MAC is wrong, leaves the connection closed with why() saying so.
    void read(std::vector<Received> *out) noexcept;
    bool closed() const { return fd_ < 0; }
    const std::string &why() const { return why_; }
    void close(const std::string &why) noexcept;

private:
    bool write(const uint8_t *buf, std::size_t n, const sys::Deadline &deadline) noexcept;
    auth::Mac frame_mac(char dir, uint64_t number, const uint8_t *frame, std::size_t n) const;

    int fd_;
    std::string why_;
    std::vector<uint8_t> in_;
    bool keyed_ = false;
    auth::Key key_{};
    char sends_ = 0;
    uint64_t sent_ = 0, read_ = 0;  // frames numbered, per direction
};

// Connects to the first address of `to` that answers within `deadline` (each address gets an
// equal share of what is left). Throws WSYNC_ERR_TIMEOUT or WSYNC_ERR_PEER naming `who`.
int connect_control(const ControlAddress &to, const sys::Deadline &deadline, const std::string &who);

// Waits up to `ms` for any of `fds` to be readable (negative entries skipped).
void wait_readable(const std::vector<int> &fds, int64_t ms) noexcept;

}  // namespace wsync::nccl
