// The C ABI, trainer side: versions, blobs, strategies, senders, request merging. See
// abi/translate.hpp for what every entry point does and does not do.
#include "abi/translate.hpp"

using wsync::fail;
using namespace wsync::abi;

extern "C" {

uint32_t wsync_version_number(void) { return WSYNC_VERSION_NUMBER; }

const char *wsync_version_string(void) {
#define WSYNC_STR2(x) #x
#define WSYNC_STR(x) WSYNC_STR2(x)
    return WSYNC_STR(WSYNC_VERSION_MAJOR) "." WSYNC_STR(WSYNC_VERSION_MINOR) "." WSYNC_STR(
        WSYNC_VERSION_PATCH);
}

const char *wsync_status_string(wsync_status_t status) { return wsync::status_name(status); }

const char *wsync_last_error(void) { return wsync::last_error(); }

void wsync_blob_free(wsync_blob_t *blob) {
    if (!blob) return;
    std::free(blob->data);
    blob->data = nullptr;
    blob->size = 0;
}

void wsync_string_free(char *str) { std::free(str); }

// --- strategies -------------------------------------------------------------------------------

wsync_status_t wsync_strategy_create(const char *kind, const char *options_json,
                                     wsync_strategy_t **out) {
    if (out) *out = nullptr;
    return guard([&] {
        require(out, "wsync_strategy_create", "out");
        require(kind, "wsync_strategy_create", "kind");
        auto s = std::make_unique<wsync::Strategy>(wsync::find_kind(kind), options_json);
        *out = reinterpret_cast<wsync_strategy_t *>(s.release());
    });
}

void wsync_strategy_destroy(wsync_strategy_t *strategy) {
    // Options only (no init info made): nothing shared to spare, so a forked child frees its copy.
    auto *s = reinterpret_cast<wsync::Strategy *>(strategy);
    if (s && !s->made_init()) delete s;
    else destroy<wsync::Strategy>(strategy);
}

wsync_status_t wsync_strategy_kind(const wsync_strategy_t *strategy, const char **kind_out) {
    if (kind_out) *kind_out = nullptr;
    return guard([&] {
        require(strategy, "wsync_strategy_kind", "strategy");
        require(kind_out, "wsync_strategy_kind", "kind_out");
        *kind_out = reinterpret_cast<const wsync::Strategy *>(strategy)->kind().name;
    });
}

namespace {
wsync::json capabilities_json(const wsync::KindInfo &k) {
    const wsync::KindCapabilities &c = k.capabilities;
    wsync::json memory = wsync::json::array();
    for (const char *m : {"host", "cuda"})
        if (std::string(c.tensor_memory).find(m) != std::string::npos) memory.push_back(m);
    return {{"tensor_memory", memory},
            {"senders", k.merge_transports ? "many" : "one"},
            {"drop_receiver", c.drop_receiver},
            {"reattach", c.reattach},
            {"collective", c.collective},
            {"gpu_per_receiver", c.gpu_per_receiver},
            {"delta", !k.delta_sync ? "none" : k.delta_on_device ? "device" : "host"}};
}
}  // namespace

wsync_status_t wsync_strategy_kinds(char **json_out) {
    if (json_out) *json_out = nullptr;
    return guard([&] {
        require(json_out, "wsync_strategy_kinds", "json_out");
        wsync::json list = wsync::json::array();
        for (const wsync::KindInfo *k : wsync::registered_kinds()) {
            std::string why = k->unavailable_reason(nullptr);
            list.push_back({{"kind", k->name}, {"available", why.empty()}, {"reason", why},
                            {"runtime", why.empty() && k->runtime ? k->runtime() : ""},
                            {"stability", k->experimental ? "experimental" : "stable"},
                            {"capabilities", capabilities_json(*k)}});
        }
        *json_out = to_cstring(list.dump());
    });
}

wsync_status_t wsync_strategy_describe_options(const char *kind, char **json_out) {
    if (json_out) *json_out = nullptr;
    return guard([&] {
        require(kind, "wsync_strategy_describe_options", "kind");
        require(json_out, "wsync_strategy_describe_options", "json_out");
        *json_out =
            to_cstring(wsync::describe_options(wsync::option_specs(wsync::find_kind(kind))).dump(2));
    });
}

wsync_status_t wsync_strategy_create_init_info(wsync_strategy_t *strategy, wsync_blob_t *out) {
    if (out) *out = wsync_blob_t{nullptr, 0};
    return guard([&] {
        require(strategy, "wsync_strategy_create_init_info", "strategy");
        require(out, "wsync_strategy_create_init_info", "out");
        *out = to_blob(core(strategy)->create_init_info());
    });
}

// --- sender -----------------------------------------------------------------------------------

wsync_status_t wsync_sender_create(wsync_strategy_t *strategy, const uint8_t *init, size_t len,
                                   wsync_sender_t **out) {
    if (out) *out = nullptr;
    return guard([&] {
        require(strategy, "wsync_sender_create", "strategy");
        require(out, "wsync_sender_create", "out");
        require_bytes(init, len, "wsync_sender_create", "init");
        *out = reinterpret_cast<wsync_sender_t *>(core(strategy)->create_sender(init, len).release());
    });
}

void wsync_sender_destroy(wsync_sender_t *sender) { destroy<wsync::Sender>(sender); }

namespace {
wsync_status_t send_chunk(const char *fn, wsync_sender_t *sender, const wsync_chunk_t *chunk,
                          const wsync_part_t *parts, wsync_blob_t *request_out) {
    if (request_out) *request_out = wsync_blob_t{nullptr, 0};
    return guard([&] {
        require(sender, fn, "sender");
        require(chunk, fn, "chunk");
        require(request_out, fn, "request_out");
        check_struct_size(chunk, chunk->struct_size, "chunk");
        wsync_chunk_t c = *chunk;
        std::vector<wsync_tensor_t> copies;  // only for tensors of a newer, larger layout
        if (c.tensors && c.count) {
            uint32_t stride = c.tensors[0].struct_size;
            if (stride != 0 && stride != sizeof(wsync_tensor_t)) {
                check_struct_size(&c.tensors[0], stride, "tensors[0]");
                if (c.count > (std::size_t(1) << 22))
                    fail(WSYNC_ERR_INVALID_ARGUMENT, "chunk.count " + std::to_string(c.count) +
                                                         " exceeds the most tensors a chunk may have");
                const auto *base = reinterpret_cast<const unsigned char *>(c.tensors);
                for (size_t i = 0; i < c.count; ++i) {
                    const auto *t = reinterpret_cast<const wsync_tensor_t *>(base + i * stride);
                    if (t->struct_size != stride)
                        fail(WSYNC_ERR_INVALID_ARGUMENT,
                             "tensors[" + std::to_string(i) + "].struct_size differs from tensors[0]'s");
                    check_struct_size(t, stride, "tensor");
                    copies.push_back(*t);
                    copies.back().struct_size = 0;
                }
                c.tensors = copies.data();
            }
        }
        *request_out = to_blob(core(sender)->send_chunk(c, parts));
    });
}
}  // namespace

wsync_status_t wsync_sender_send_chunk(wsync_sender_t *sender, const wsync_chunk_t *chunk,
                                       wsync_blob_t *request_out) {
    return send_chunk("wsync_sender_send_chunk", sender, chunk, nullptr, request_out);
}

wsync_status_t wsync_sender_send_parts(wsync_sender_t *sender, const wsync_chunk_t *chunk,
                                       const wsync_part_t *parts, wsync_blob_t *request_out) {
    return send_chunk("wsync_sender_send_parts", sender, chunk, parts, request_out);
}

wsync_status_t wsync_sender_commit(wsync_sender_t *sender, wsync_blob_t *request_out) {
    if (request_out) *request_out = wsync_blob_t{nullptr, 0};
    return guard([&] {
        require(sender, "wsync_sender_commit", "sender");
        require(request_out, "wsync_sender_commit", "request_out");
        *request_out = to_blob(core(sender)->commit());
    });
}

wsync_status_t wsync_sender_abandon(wsync_sender_t *sender) {
    return guard([&] {
        require(sender, "wsync_sender_abandon", "sender");
        core(sender)->abandon();
    });
}

wsync_status_t wsync_sender_drop_receiver(wsync_sender_t *sender, uint32_t index) {
    return guard([&] {
        require(sender, "wsync_sender_drop_receiver", "sender");
        core(sender)->drop_receiver(index);
    });
}

wsync_status_t wsync_sender_set_stream(wsync_sender_t *sender, void *stream) {
    return guard([&] {
        require(sender, "wsync_sender_set_stream", "sender");
        core(sender)->set_stream(stream);
    });
}

wsync_status_t wsync_sender_failure_count(const wsync_sender_t *sender, size_t *count_out) {
    if (count_out) *count_out = 0;
    return guard([&] {
        require(sender, "wsync_sender_failure_count", "sender");
        require(count_out, "wsync_sender_failure_count", "count_out");
        *count_out = core(sender)->failures().size();
    });
}

wsync_status_t wsync_sender_failure(const wsync_sender_t *sender, size_t i, wsync_failure_t *out) {
    return guard([&] {
        require(sender, "wsync_sender_failure", "sender");
        require(out, "wsync_sender_failure", "out");
        const auto &fs = core(sender)->failures();
        if (i >= fs.size())
            fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_sender_failure: index " + std::to_string(i) +
                                                 " is out of range (" + std::to_string(fs.size()) +
                                                 " failures)");
        const wsync::Failure &f = fs[i];
        wsync_failure_t v{};
        v.what = f.what;
        v.status = f.status;
        v.receiver = f.receiver;
        v.version = f.version;
        v.chunk_index = f.chunk_index;
        v.pid = f.pid;
        std::size_t n = std::min(f.message.size(), sizeof v.message - 1);
        std::memcpy(v.message, f.message.data(), n);
        write_sized(out, v, "wsync_failure_t");
    });
}

wsync_status_t wsync_sender_flush(wsync_sender_t *sender, int64_t timeout_ms) {
    return guard([&] {
        require(sender, "wsync_sender_flush", "sender");
        core(sender)->flush(timeout_ms);
    });
}

wsync_status_t wsync_sender_wait_released(wsync_sender_t *sender, uint64_t version,
                                          int64_t timeout_ms) {
    return guard([&] {
        require(sender, "wsync_sender_wait_released", "sender");
        core(sender)->wait_released(version, timeout_ms);
    });
}

wsync_status_t wsync_sender_version(const wsync_sender_t *sender, uint64_t *version_out) {
    if (version_out) *version_out = 0;
    return guard([&] {
        require(sender, "wsync_sender_version", "sender");
        require(version_out, "wsync_sender_version", "version_out");
        *version_out = core(sender)->version();
    });
}

wsync_status_t wsync_sender_arena(const wsync_sender_t *sender, void **base, uint64_t *bytes) {
    if (base) *base = nullptr;
    if (bytes) *bytes = 0;
    return guard([&] {
        require(sender, "wsync_sender_arena", "sender");
        require(base, "wsync_sender_arena", "base");
        require(bytes, "wsync_sender_arena", "bytes");
        const auto [p, n] = core(sender)->arena();
        *base = p;
        *bytes = n;
    });
}

wsync_status_t wsync_request_merge(const wsync_blob_t *parts, size_t n, wsync_blob_t *out) {
    if (out) *out = wsync_blob_t{nullptr, 0};
    return guard([&] {
        require(out, "wsync_request_merge", "out");
        if (n > 0) require(parts, "wsync_request_merge", "parts");
        std::vector<std::pair<const uint8_t *, std::size_t>> v;
        for (size_t i = 0; i < n; ++i) {
            if (!parts[i].data || parts[i].size == 0)
                fail(WSYNC_ERR_INVALID_ARGUMENT,
                     "wsync_request_merge: part " + std::to_string(i) + " is NULL or empty");
            v.emplace_back(parts[i].data, parts[i].size);
        }
        *out = to_blob(wsync::merge_requests(v));
    });
}

}  // extern "C"
