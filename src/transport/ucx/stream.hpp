// The ucx kind's data stream (issue 37 item 6): over tcp, a chunk's bytes go from the trainer's
// staging buffer to the engine's receive buffer on one plain TCP connection per engine, beside
// UCX's, which keeps every control message. UCX's own tcp path moves a rendezvous payload as
// fragments the engine's worker copies out of its receive segments (about a tenth of a 1 GiB
// sync's CPU over a veth on 2 cores, and 49,000 epoll calls a sync); on the stream the kernel
// copies each byte once, straight into the engine's buffer (docs/architecture.md, "Against gloo").
//
// Who may use it (docs/failure-model.md, "Who may talk to a trainer"): the trainer listens on
// the address of the first device named in "net_devices" and offers that address only in its
// welcome, which only an authenticated engine gets. A connection is worth nothing until it
// proves the connection key: the trainer sends a fresh 16-byte nonce, and the engine answers
// with its index, its token and HMAC-SHA256(connection key, "wsync-ucx-stream" | nonce | index
// | token) (stream_proof). Anything else, or nothing within kProofMs, is closed; at most
// kMaxHalfOpen connections wait for their proof at once (more are closed at accept). The
// trainer reads nothing from a proven stream: it only writes Data frames for fetches it checked
// (lease and bounds, as for UCX). The engine reads frames only from the address the
// authenticated welcome named, and takes a frame's payload only into the range it asked for,
// after its header's MAC checks (Worker, the receiver's drain()).
//
// A frame: u32 header length, u64 payload length (little-endian), the header (a sealed Data
// message, seal_msg, at most kMaxFrameHeader bytes), the payload.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <sys/socket.h>
#include <vector>

#include "transport/ucx/auth.hpp"

namespace wsync::ucx {

inline constexpr uint32_t kProofMagic = 0x31445357;  // "WSD1"
inline constexpr std::size_t kProofBytes = 4 + 4 + 8 + kMacBytes;
inline constexpr std::size_t kFrameHead = 4 + 8;
inline constexpr std::size_t kMaxFrameHeader = 4096;
inline constexpr std::size_t kMaxHalfOpen = 64;
inline constexpr int kProofMs = 2000;
inline constexpr uint8_t kStreamAccepted = 'K';  // the trainer's answer to a right proof

// What an engine proves on a new stream (see above).
Mac stream_proof(const Key &connection_key, const Nonce &nonce, uint32_t index, uint64_t token);

// The trainer's stream address as its welcome carries it, in the text of an OK welcome (which
// engines of 0.8 and older ignore; a welcome's address field they would refuse):
// "data stream at 10.0.0.1:40123" or "data stream at [2001:db8::1]:40123". decode: false for
// anything else.
inline constexpr const char *kStreamOffer = "data stream at ";
std::string encode_stream_address(const sockaddr_storage &a);
bool decode_stream_address(const std::string &text, sockaddr_storage *out, socklen_t *len);
// Where a trainer listens: the first IPv4 address (else IPv6) of the first device in the
// comma-separated `devices` that has one. False: none ("" or "all" names no device).
bool device_stream_address(const std::string &devices, sockaddr_storage *out, socklen_t *len);
// "10.0.0.1:40123" / "[fe80::1]:40123", for messages.
std::string address_text(const sockaddr_storage &a);

// One side of one data stream. The trainer's queues Data frames to write; the engine's reads
// one frame at a time: its header into the worker's inbox, then (once the owner says where, or
// that it does not want it) the payload into place or away.
struct Stream {
    int fd = -1;
    // The trainer's: frames not yet written whole. `data` stays valid until the frame's tag is
    // reported sent (Worker::take_sent).
    struct Out {
        std::vector<uint8_t> head;  // the frame head and the sealed header
        const uint8_t *data = nullptr;
        std::size_t n = 0;
        std::size_t done = 0;  // bytes of head + payload written
        uint64_t tag = 0;
        bool hashed = false;  // written kHashSlice at a time, each slice told (Worker::set_written)
    };
    std::deque<Out> out;
    // The engine's.
    enum class In { Head, Held, Payload, Discard } in = In::Head;
    std::vector<uint8_t> head;  // the frame head and header, `got` bytes of them arrived
    std::size_t got = 0;
    uint64_t payload = 0;       // the held frame's payload length
    // In::Payload: where the payload goes, in order (one run, or a scatter over the engine's
    // own destinations, Worker::receive_scattered); `run`/`run_done`: the run being filled.
    struct Run {
        uint8_t *dst = nullptr;
        uint64_t n = 0;
    };
    std::vector<Run> runs;
    std::size_t run = 0;
    uint64_t run_done = 0;
    std::function<void(uint64_t)> landed;  // told the payload bytes in place after each read
    uint64_t left = 0;          // In::Payload and In::Discard: bytes still to read
    struct Req;                 // the receive in flight (Worker::receive)
    Req *req = nullptr;

    Stream() = default;
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    ~Stream();
};

// A receive into place from a stream, as Worker::receive returns it for UCX's request.
struct Stream::Req {
    int status = 1;  // 1: in progress, 0: done, < 0: failed (ucs_status_t)
    Stream *stream = nullptr;
};

}  // namespace wsync::ucx
