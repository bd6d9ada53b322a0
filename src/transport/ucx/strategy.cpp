// ucx: engines pull committed versions from the trainer over UCX's UCP API, across machines
// (tcp, shared memory, RDMA: whatever the loaded UCX offers), as active messages.
//
// create_init_info creates the trainer's UCP worker; its address travels in the init info with
// a random session number and a random 32-byte key, the secret every control message is
// authenticated with (auth.hpp: who may connect, and what a peer can do). The sender stages
// each chunk in host memory registered for no peer (packing and hashing in one pass) and
// returns a request carrying the chunk's sequence number and size. A receiver attaches by
// sending the trainer its own worker address (hello; the trainer answers welcome, or why not);
// for each chunk it asks for a lease (so the trainer keeps the chunk for it), fetches the
// chunk's bytes (the trainer checks the lease and the range and sends them as one active
// message) into its own buffer, lets the core verify checksums and the loader take the
// tensors, and acknowledges. A progress thread on the trainer serves fetches and control
// messages while the trainer computes.
//
// Elastic: receivers attach at any time and owe the versions that begin after they attached;
// they may pull any version the trainer still keeps (the last "keep_versions" committed ones).
// A receiver whose connection fails (UCP_ERR_HANDLING_MODE_PEER) is named once in the next
// flush if it owed a chunk, and is no longer waited for. Every wait has a deadline
// ("timeout_ms"); teardown force-closes endpoints (no flush towards a dead peer).
//
// The files of this folder: api (the dlopen'ed UCP table), worker (context, worker, endpoints,
// messages, memory registration, bounded waits), init_info (the wire: init info, request map,
// control messages), sender, receiver, and this one (options, strategy, registration).
#include <memory>
#include <unistd.h>

#include "error.hpp"
#include "plan/select.hpp"
#include "strategy.hpp"
#include "sys.hpp"
#include "transport/ucx/api.hpp"
#include "transport/ucx/auth.hpp"
#include "transport/ucx/receiver.hpp"
#include "transport/ucx/sender.hpp"
#include "transport/ucx/worker.hpp"

namespace wsync {
namespace ucx {
namespace {

const std::vector<OptionSpec> &option_specs() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        option::receivers(kMaxReceivers, "receiver indices that may attach (0..receivers-1); "
                                         "engines attach and leave at any time"),
        {"keep_versions", T::UInt, 2, 1, kMaxKeepVersions, "sender",
         "committed versions the trainer keeps pullable for late or slow engines (each costs its "
         "size in registered host memory)"},
        option::checksum(),
        {"block_checksum_bytes", T::UInt, 0, 0, kMaxBlockBytes, "sender",
         "also carry an XXH3-64 of every block of this many bytes of each tensor (a multiple of "
         "4096; 0: none), so engines that pull byte ranges (\"select\") verify each block their "
         "range covers whole; costs one more hashing pass over each chunk",
         nullptr, nullptr, /*experimental=*/true},
        {"arena_bytes", T::UInt, 0, 0, kMaxArenaBytes, "sender",
         "bytes of host memory for the trainer's own tensors (rounded up to 4096; 0: none): "
         "wsync_sender_arena() hands it out, and a chunk whose tensors lie in it as the sender "
         "would pack them (each at the next multiple of 256 bytes, in order) is sent from there "
         "with no pack copy, borrowed until its version's flush returns OK"},
        option::verify(),
        option::copy_threads(),
        option::timeout_ms(1, "both",
                           "deadline for attaching, for each lease and fetch, and for closing "
                           "endpoints"),
        {"transports", T::String, 0, 0, 0, "both",
         "UCX transports (UCX_TLS), e.g. \"tcp\" or \"rc,sm\"; \"\": UCX's own choice", ""},
        {"net_devices", T::String, 0, 0, 0, "both",
         "network devices UCX may use and listen on (UCX_NET_DEVICES), e.g. \"eth0\", \"mlx5_0:1\" "
         "or \"lo\"; required: \"all\" listens on every interface (UCX's own choice)",
         ""},
        {"data_path", T::String, 0, 0, 0, "both",
         "how chunk bytes travel: \"auto\": over tcp (\"transports\" \"tcp\"), on one plain TCP "
         "connection per engine beside UCX's, on the first device of \"net_devices\", proven with "
         "the connection's key (the kernel copies each byte once, into the engine's buffer); "
         "else as UCX active messages. \"ucx\": always as UCX active messages. An engine takes "
         "the stream its trainer offers unless its own is \"ucx\"",
         "auto", "auto|ucx"},
        {"select", T::Json, 0, 0, 0, "receiver",
         "partial pull: the tensors, byte ranges or dimension-0 shards this engine loads, checked "
         "against each request before any byte moves; only those bytes are fetched: "
         "[{\"tensor\": name}, {\"tensor\": name, \"offset\": B, \"bytes\": B}, {\"tensors\": "
         "[names], \"rank\": r, \"ranks\": n}, ...], each optionally with \"dtype\" and \"shape\" "
         "to check; unset: every tensor (docs/architecture.md, \"Partial pulls\")",
         nullptr, nullptr, /*experimental=*/true},
        {"select_rest", T::String, 0, 0, 0, "receiver",
         "with \"select\": what happens to tensors it does not name: \"skip\" them, or pull them "
         "\"whole\"",
         "skip", "skip|whole", /*experimental=*/true},
        {"device", T::UInt, 0, 0, 4095, "receiver",
         "the engine's GPU, an ordinal in its process (after CUDA_VISIBLE_DEVICES): chunks land in "
         "pinned host memory, and wsync_recv_copy() into device memory of that GPU is verified on "
         "the host and queued as one asynchronous copy on the loader's stream, which each "
         "wsync_recv_end() waits for; unset: a host engine, no CUDA",
         nullptr, nullptr, /*experimental=*/false, /*unset_by_default=*/true},
        {"ucx_library", T::String, 0, 0, 0, "both",
         "path of libucp.so.0 to use; else $WSYNC_UCX_LIBRARY, else the system's libucp.so.0", ""},
    };
    return specs;
}

// "net_devices", required (issue 37: a trainer listened on every interface by default, so
// anyone who could reach any of its addresses could reach its port): the devices named, or
// "all" (UCX's own choice, "" to UCX), said in so many words.
std::string net_devices(const Options &o) {
    const std::string nd = o.text("net_devices");
    if (nd.empty())
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(kKind) + ": option 'net_devices' is not set: name the network devices UCX may use and "
                                  "listen on (e.g. \"eth0\", \"mlx5_0:1\", or \"lo\" on one host), or \"all\" to "
                                  "listen on every interface");
    return nd == "all" ? std::string() : nd;
}

// "data_path": a trainer offers its stream when UCX may use tcp only (over RDMA or shared
// memory UCX's own path is the faster one); an engine takes what is offered unless told "ucx".
bool tcp_only(const std::string &transports) {
    if (transports.empty()) return false;
    for (std::size_t at = 0; at <= transports.size();) {
        std::size_t comma = transports.find(',', at);
        if (comma == std::string::npos) comma = transports.size();
        const std::string t = transports.substr(at, comma - at);
        if (t != "tcp") return false;
        at = comma + 1;
    }
    return true;
}

Config make_config(const Options &o) {
    Config c{o.text("ucx_library"), o.text("transports"), net_devices(o)};
    c.stream = o.text("data_path") == "auto";
    return c;
}

class UcxStrategy final : public StrategyImpl {
public:
    explicit UcxStrategy(const Options &o)
        : config_(make_config(o)),
          receivers_(static_cast<uint32_t>(o.uint("receivers"))),
          keep_(static_cast<uint32_t>(o.uint("keep_versions"))), checksum_(o.boolean("checksum")),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))), block_bytes_(o.uint("block_checksum_bytes")),
          arena_bytes_(o.uint("arena_bytes")) {
        if (block_bytes_ % kMinBlockBytes)
            fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(kKind) + ": option 'block_checksum_bytes' = " +
                                                 std::to_string(block_bytes_) + " is not a multiple of " +
                                                 std::to_string(kMinBlockBytes));
        receiver_.config = config_;
        receiver_.verify = o.boolean("verify");
        receiver_.copy_threads = static_cast<unsigned>(o.uint("copy_threads"));
        receiver_.timeout_ms = timeout_ms_;
        if (o.given("device")) receiver_.device = static_cast<int>(o.uint("device"));
        if (!o.value("select").is_null())
            receiver_.selection = select::parse(o.value("select"), o.text("select_rest"), kKind);
        else if (o.values().count("select_rest") && o.text("select_rest") != "skip")
            fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(kKind) + ": option 'select_rest' needs 'select'");
    }

    json create_init_info() override {
        Config c = config_;
        c.stream = c.stream && tcp_only(c.transports);
        worker_ = std::make_unique<Worker>(c, std::string(kKind) + " sender");
        info_.address = worker_->address();
        sys::random_bytes(info_.key.data(), info_.key.size());  // the secret engines prove they hold
        sys::random_bytes(&info_.session, sizeof info_.session);
        info_.receivers = receivers_;
        info_.keep_versions = keep_;
        info_.checksum = checksum_;
        return encode_init_info(info_);
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init_info(body);
        if (!worker_)
            fail(WSYNC_ERR_WRONG_STATE, "ucx: a sender must be made by the strategy that created the init "
                                        "info (this one has not created one, or already made its sender)");
        if (info.session != info_.session)
            fail(WSYNC_ERR_MISMATCH, "ucx: the init info is not the one this strategy created");
        return make_sender(std::move(worker_), info, timeout_ms_, block_bytes_, receiver_.copy_threads,
                           arena_bytes_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init_info(body);
        check_receiver_index(kKind, index, info.receivers);
        return make_receiver(info, index, receiver_);
    }

private:
    Config config_;
    uint32_t receivers_, keep_;
    bool checksum_;
    int64_t timeout_ms_;
    uint64_t block_bytes_;
    uint64_t arena_bytes_;  // the sender's arena (0: none)
    ReceiverOptions receiver_;
    std::unique_ptr<Worker> worker_;
    InitInfo info_;
};

std::unique_ptr<StrategyImpl> create_strategy(const Options &o) { return std::make_unique<UcxStrategy>(o); }

std::string unavailable(const Options *o) {
    std::string why = unavailable_reason(o ? o->text("ucx_library") : "");
    return why.empty() ? crypto_unavailable_reason() : why;
}

// "UCX 1.13.1 (libucp.so.0); memory types: host; transports: tcp, posix, sysv, cma"
std::string runtime_text() {
    const Api &a = api("");
    std::string out = "UCX " + version_text(a) + " (" + a.path + ")";
    try {
        Worker w(Config{}, "ucx");
        out += "; memory types: " + w.memory_types() + "; transports: " + w.transports();
    } catch (const std::exception &e) {
        out += std::string("; no UCP context: ") + e.what();
    }
    return out;
}

}  // namespace
}  // namespace ucx

const KindInfo kUcxKind = {ucx::kKind,          ucx::option_specs, ucx::unavailable,
                           ucx::create_strategy, nullptr,           ucx::runtime_text,
                           /*delta_sync=*/true,   /*experimental=*/true,
                           /*delta_on_device=*/false, {/*tensor_memory=*/"host,cuda"}};

}  // namespace wsync
