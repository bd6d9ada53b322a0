// What the ucx kind puts on the wire: the init-info body, the request's "transport" map, and
// the small control messages receivers and the sender exchange as UCP active messages
// (docs/wire-format.md). Everything here comes from another process and is checked before use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transport/ucx/auth.hpp"

namespace wsync::ucx {

using json = nlohmann::json;

inline constexpr const char *kKind = "ucx";
inline constexpr uint32_t kMaxReceivers = 4096;
inline constexpr uint32_t kMaxKeepVersions = 64;
// The sender's "arena_bytes" at most (1 TiB, as shm's).
inline constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 40;
inline constexpr std::size_t kMaxAddressBytes = 64 << 10;  // a UCP worker address
inline constexpr std::size_t kMaxText = 255;               // names and failure messages

// The ucx kind's own wire version (init body and control messages; docs/wire-format.md).
// 2: an authenticated hello and MACed control messages (auth.hpp), the init info's "key";
// version 1 peers (libwsync 0.6 and older) are refused by name or, where they speak first with
// an unauthenticated hello, not answered.
// 3 (0.8): a chunk's checksums may follow its bytes (Where::sums_follow, kFetchSums), which a
// version 2 engine would take for a request without checksums; each side refuses the other's
// init info by name.
inline constexpr uint64_t kWireVersion = 3;

struct InitInfo {
    std::vector<uint8_t> address;  // the trainer's UCP worker address
    Key key{};                     // the secret that authenticates engines (auth.hpp): never in requests
    uint64_t session = 0;          // random per sender: requests of another trainer are refused
    uint32_t receivers = 0;        // receiver indices 0..receivers-1
    uint32_t keep_versions = 0;    // committed versions the trainer keeps pullable
    bool checksum = false;         // every request carries tensor checksums
};

json encode_init_info(const InitInfo &info);
// Validates an init-info body; WSYNC_ERR_MALFORMED names the bad field.
InitInfo parse_init_info(const json &body);

// Which chunk a request is, for the ucx transport. It says nothing of where the chunk sits in
// the trainer's memory: an engine fetches byte ranges of a chunk it holds a lease on, and the
// trainer serves them (Fetch/Data below); nothing of the trainer's memory is registered for
// peers to read or write.
struct Where {
    uint64_t session = 0;
    uint64_t seq = 0;    // chunk number since the sender began, from 1
    uint64_t bytes = 0;  // chunk size
    // Optional (the sender's "block_checksum_bytes"): XXH3-64 of every block_bytes-sized block
    // of each entry, counted from the entry's first byte (the last one may be shorter), entries
    // in table order; little-endian in "block_sums". block_bytes 0: none carried.
    uint64_t block_bytes = 0;
    std::vector<uint64_t> block_sums;
    // "sums_follow": the request's table carries no checksums; the trainer hashes the chunk as
    // it sends it and an engine fetches the tree hashes after the bytes (kFetchSums).
    bool sums_follow = false;
};

inline constexpr uint64_t kMinBlockBytes = 4096;
inline constexpr uint64_t kMaxBlockBytes = uint64_t(1) << 30;

json encode_where(const Where &w);
// Validates the request's transport map (WSYNC_ERR_MALFORMED naming the field).
Where parse_where(const json &transport);

// Control messages (wire version 2). Receiver -> sender: Hello (attach, with its worker
// address), Lease (may I read chunk seq?), Fetch (send me bytes [offset, offset + bytes) of
// chunk seq, which I hold a lease on; `version` is the fetch's number, echoed), Ack (done with
// chunk seq: status, and a message when it failed; an OK one's `offset`, after 0.7.0, the
// nanoseconds the engine spent applying the chunk's patches, 0 before), Bye (destroyed). Sender -> receiver:
// Welcome (status: attached or refused), Grant (status: chunk seq may be read, or why not),
// Data (the bytes of a fetch, or why not: the header of a message on kAmDataId whose payload is
// the bytes), Abandon (version), Dropped.
enum class MsgType : uint32_t { Hello = 1, Welcome, Lease, Grant, Ack, Bye, Abandon, Dropped, Fetch, Data };

// A Fetch whose `chunk` is kFetchSums asks for the checksums of a chunk whose request said they
// follow its bytes (Where::sums_follow): `offset` 0, `bytes` 8 per entry of its table. The
// trainer answers it once it has sent this engine every byte it fetched before, with a Data
// message (the same `chunk`) whose payload is each entry's tree hash, 8 bytes little-endian,
// in table order, and whose nonce is sums_mac() of that payload (auth.hpp).
inline constexpr uint32_t kFetchSums = 1;

struct Msg {
    MsgType type = MsgType::Hello;
    uint32_t index = 0;     // receiver index
    uint64_t token = 0;     // the receiver's attach token (random per receiver object)
    uint64_t number = 0;    // per connection and direction, from 1, rising (hello: 0)
    uint64_t seq = 0;
    uint64_t version = 0;
    uint64_t offset = 0;    // fetch and data: the range of the chunk
    uint64_t bytes = 0;
    uint32_t chunk = 0;
    int32_t status = 0;     // wsync_status_t
    int32_t pid = 0;
    Nonce nonce{};          // hello: the engine's; welcome: the trainer's
    std::string text;       // ack/welcome/grant: the message
    std::vector<uint8_t> address;  // hello only
    // Filled by decode_msg: the bytes the MAC covers, and the MAC.
    std::vector<uint8_t> signed_bytes;
    Mac mac{};
    // Data only, filled by the worker: the payload of an eager message, or UCX's descriptor of
    // a rendezvous one (to receive with Worker::receive or give back with Worker::release).
    std::vector<uint8_t> payload;
    void *desc = nullptr;
    std::size_t length = 0;  // the payload's size
};

// The active-message id of every control message (either direction). UCX 1.13.1 reads the
// handler-table entry of a received id before checking it against the table, and does not
// initialise the entries it grows the table by: with 0x5753 (wire version 1) an unregistered id
// near 28000 killed the trainer, and a small id alone does not help. So every worker registers
// a handler for every id up to kAmTableEnd, the largest the wire can carry (UCP's AM header
// holds 16 bits): ours at kAmId, one that drops the message at the others (worker.cpp).
inline constexpr unsigned kAmId = 1;
inline constexpr unsigned kAmDataId = 2;  // Data: the sealed message as the header, the bytes as the payload
inline constexpr unsigned kAmTableEnd = 0xffff;

// Which side sent a message: part of every MAC, so no message is reflected back as the other's.
enum class Dir : uint8_t { ToTrainer = 'E', ToEngine = 'T' };

// Encodes and appends the MAC: a hello's with the init info's key, any other message's with
// the connection's key and the direction.
std::vector<uint8_t> seal_msg(const Msg &m, const Key &key, Dir dir);
// False for anything malformed or of another wire version (a peer's garbage is dropped, not
// trusted). Checks no MAC: see authentic().
bool decode_msg(const void *data, std::size_t size, Msg &out);
// Whether m's MAC is right for the key (and direction, for anything but a hello).
bool authentic(const Msg &m, const Key &key, Dir dir);

}  // namespace wsync::ucx
