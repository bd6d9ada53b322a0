// The C ABI. Each entry point only translates: it checks pointer arguments, clears outputs,
// calls the core, and turns exceptions into a status plus the per-thread message. No exception
// leaves this file.
#include <cstdlib>
#include <cstring>
#include <new>

#include "core.hpp"
#include "error.hpp"
#include "planner.hpp"
#include "wsync.h"

using wsync::Error;
using wsync::fail;

namespace {

template <class F>
wsync_status_t guard(F &&f) noexcept {
    try {
        f();
        return WSYNC_OK;
    } catch (const Error &e) {
        wsync::set_last_error(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        wsync::set_last_error("out of memory");
        return WSYNC_ERR_NO_MEMORY;
    } catch (const std::exception &e) {
        wsync::set_last_error(e.what());  // a library bug: nothing else should escape the core
        return WSYNC_ERR_INTERNAL;
    } catch (...) {
        wsync::set_last_error("unknown internal error");
        return WSYNC_ERR_INTERNAL;
    }
}

void require(const void *p, const char *fn, const char *arg) {
    if (!p) fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + arg + " is NULL");
}

void require_bytes(const uint8_t *p, size_t len, const char *fn, const char *arg) {
    if (!p || len == 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + arg + " is NULL or empty");
}

wsync_blob_t to_blob(const std::vector<uint8_t> &bytes) {
    auto *p = static_cast<uint8_t *>(std::malloc(bytes.size()));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, bytes.data(), bytes.size());
    return wsync_blob_t{p, bytes.size()};
}

char *to_cstring(const std::string &s) {
    auto *p = static_cast<char *>(std::malloc(s.size() + 1));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

template <class T> wsync::Strategy *core(T *h) { return reinterpret_cast<wsync::Strategy *>(h); }
wsync::Sender *core(wsync_sender_t *h) { return reinterpret_cast<wsync::Sender *>(h); }
const wsync::Sender *core(const wsync_sender_t *h) { return reinterpret_cast<const wsync::Sender *>(h); }
wsync::Receiver *core(wsync_receiver_t *h) { return reinterpret_cast<wsync::Receiver *>(h); }
const wsync::Receiver *core(const wsync_receiver_t *h) {
    return reinterpret_cast<const wsync::Receiver *>(h);
}
wsync::Iteration *core(wsync_recv_t *h) { return reinterpret_cast<wsync::Iteration *>(h); }
const wsync::Iteration *core(const wsync_recv_t *h) {
    return reinterpret_cast<const wsync::Iteration *>(h);
}
wsync::Plan *core(wsync_plan_t *h) { return reinterpret_cast<wsync::Plan *>(h); }
const wsync::Plan *core(const wsync_plan_t *h) { return reinterpret_cast<const wsync::Plan *>(h); }

}  // namespace

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

void wsync_strategy_destroy(wsync_strategy_t *strategy) { delete core(strategy); }

wsync_status_t wsync_strategy_kind(const wsync_strategy_t *strategy, const char **kind_out) {
    if (kind_out) *kind_out = nullptr;
    return guard([&] {
        require(strategy, "wsync_strategy_kind", "strategy");
        require(kind_out, "wsync_strategy_kind", "kind_out");
        *kind_out = reinterpret_cast<const wsync::Strategy *>(strategy)->kind().name;
    });
}

wsync_status_t wsync_strategy_kinds(char **json_out) {
    if (json_out) *json_out = nullptr;
    return guard([&] {
        require(json_out, "wsync_strategy_kinds", "json_out");
        wsync::json list = wsync::json::array();
        for (const wsync::KindInfo *k : wsync::registered_kinds()) {
            std::string why = k->unavailable_reason(nullptr);
            list.push_back({{"kind", k->name}, {"available", why.empty()}, {"reason", why},
                            {"runtime", why.empty() && k->runtime ? k->runtime() : ""}});
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
            to_cstring(wsync::describe_options(wsync::find_kind(kind).options()).dump(2));
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

void wsync_sender_destroy(wsync_sender_t *sender) { delete core(sender); }

wsync_status_t wsync_sender_send_chunk(wsync_sender_t *sender, const wsync_chunk_t *chunk,
                                       wsync_blob_t *request_out) {
    if (request_out) *request_out = wsync_blob_t{nullptr, 0};
    return guard([&] {
        require(sender, "wsync_sender_send_chunk", "sender");
        require(chunk, "wsync_sender_send_chunk", "chunk");
        require(request_out, "wsync_sender_send_chunk", "request_out");
        *request_out = to_blob(core(sender)->send_chunk(*chunk));
    });
}

wsync_status_t wsync_sender_flush(wsync_sender_t *sender, int64_t timeout_ms) {
    return guard([&] {
        require(sender, "wsync_sender_flush", "sender");
        core(sender)->flush(timeout_ms);
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

// --- receiver ---------------------------------------------------------------------------------

wsync_status_t wsync_receiver_create(wsync_strategy_t *strategy, const uint8_t *init, size_t len,
                                     uint32_t index, wsync_receiver_t **out) {
    if (out) *out = nullptr;
    return guard([&] {
        require(strategy, "wsync_receiver_create", "strategy");
        require(out, "wsync_receiver_create", "out");
        require_bytes(init, len, "wsync_receiver_create", "init");
        *out = reinterpret_cast<wsync_receiver_t *>(
            core(strategy)->create_receiver(init, len, index).release());
    });
}

void wsync_receiver_destroy(wsync_receiver_t *receiver) { delete core(receiver); }

wsync_status_t wsync_receiver_receive(wsync_receiver_t *receiver, const uint8_t *request,
                                      size_t len, wsync_recv_t **out) {
    if (out) *out = nullptr;
    return guard([&] {
        require(receiver, "wsync_receiver_receive", "receiver");
        require(out, "wsync_receiver_receive", "out");
        require_bytes(request, len, "wsync_receiver_receive", "request");
        *out = reinterpret_cast<wsync_recv_t *>(core(receiver)->receive(request, len));
    });
}

wsync_status_t wsync_receiver_completed_version(const wsync_receiver_t *receiver,
                                                uint64_t *version_out) {
    if (version_out) *version_out = 0;
    return guard([&] {
        require(receiver, "wsync_receiver_completed_version", "receiver");
        require(version_out, "wsync_receiver_completed_version", "version_out");
        *version_out = core(receiver)->completed_version();
    });
}

wsync_status_t wsync_recv_info(const wsync_recv_t *it, wsync_recv_info_t *info) {
    return guard([&] {
        require(it, "wsync_recv_info", "it");
        require(info, "wsync_recv_info", "info");
        *info = core(it)->info();
    });
}

wsync_status_t wsync_recv_peek(const wsync_recv_t *it, size_t i, wsync_tensor_t *view) {
    return guard([&] {
        require(it, "wsync_recv_peek", "it");
        require(view, "wsync_recv_peek", "view");
        core(it)->peek(i, view);
    });
}

wsync_status_t wsync_recv_next(wsync_recv_t *it, wsync_tensor_t *view, bool *has_view) {
    if (has_view) *has_view = false;
    return guard([&] {
        require(it, "wsync_recv_next", "it");
        require(view, "wsync_recv_next", "view");
        require(has_view, "wsync_recv_next", "has_view");
        *has_view = core(it)->next(view);
    });
}

wsync_status_t wsync_recv_end(wsync_recv_t *it) {
    if (!it) return WSYNC_OK;
    return guard([&] {
        wsync::Iteration *i = core(it);
        i->owner()->end(i);
    });
}

// --- planner ----------------------------------------------------------------------------------

wsync_status_t wsync_plan_create(const wsync_tensor_t *metas, size_t n, const char *options_json,
                                 wsync_plan_t **out) {
    if (out) *out = nullptr;
    return guard([&] {
        require(out, "wsync_plan_create", "out");
        require(metas, "wsync_plan_create", "metas");
        *out = reinterpret_cast<wsync_plan_t *>(new wsync::Plan(metas, n, options_json));
    });
}

void wsync_plan_destroy(wsync_plan_t *plan) { delete core(plan); }

wsync_status_t wsync_plan_chunk_count(const wsync_plan_t *plan, size_t *count_out) {
    if (count_out) *count_out = 0;
    return guard([&] {
        require(plan, "wsync_plan_chunk_count", "plan");
        require(count_out, "wsync_plan_chunk_count", "count_out");
        *count_out = core(plan)->chunks().size();
    });
}

wsync_status_t wsync_plan_chunk(const wsync_plan_t *plan, size_t i, const size_t **indices_out,
                                size_t *count_out, uint64_t *bytes_out) {
    if (indices_out) *indices_out = nullptr;
    if (count_out) *count_out = 0;
    if (bytes_out) *bytes_out = 0;
    return guard([&] {
        require(plan, "wsync_plan_chunk", "plan");
        require(indices_out, "wsync_plan_chunk", "indices_out");
        require(count_out, "wsync_plan_chunk", "count_out");
        const auto &chunks = core(plan)->chunks();
        if (i >= chunks.size())
            fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_plan_chunk: chunk " + std::to_string(i) +
                                                 " is out of range (the plan has " +
                                                 std::to_string(chunks.size()) + ")");
        *indices_out = chunks[i].indices.data();
        *count_out = chunks[i].indices.size();
        if (bytes_out) *bytes_out = chunks[i].bytes;
    });
}

// --- introspection ----------------------------------------------------------------------------

wsync_status_t wsync_blob_describe(const uint8_t *blob, size_t len, char **json_out) {
    if (json_out) *json_out = nullptr;
    return guard([&] {
        require(json_out, "wsync_blob_describe", "json_out");
        require_bytes(blob, len, "wsync_blob_describe", "blob");
        *json_out = to_cstring(wsync::describe_blob(blob, len));
    });
}

wsync_status_t wsync_abi_layout(char **json_out) {
    if (json_out) *json_out = nullptr;
    return guard([&] {
        require(json_out, "wsync_abi_layout", "json_out");
        using wsync::json;
#define WSYNC_FIELD(T, f) {#f, offsetof(T, f)}
#define WSYNC_STRUCT(T, ...) \
    {#T, json{{"size", sizeof(T)}, {"align", alignof(T)}, {"fields", json{__VA_ARGS__}}}}
        json layout = {
            WSYNC_STRUCT(wsync_dtype_t, WSYNC_FIELD(wsync_dtype_t, code),
                         WSYNC_FIELD(wsync_dtype_t, bits), WSYNC_FIELD(wsync_dtype_t, lanes)),
            WSYNC_STRUCT(wsync_device_t, WSYNC_FIELD(wsync_device_t, type),
                         WSYNC_FIELD(wsync_device_t, index)),
            WSYNC_STRUCT(wsync_tensor_t, WSYNC_FIELD(wsync_tensor_t, name),
                         WSYNC_FIELD(wsync_tensor_t, data), WSYNC_FIELD(wsync_tensor_t, shape),
                         WSYNC_FIELD(wsync_tensor_t, strides), WSYNC_FIELD(wsync_tensor_t, ndim),
                         WSYNC_FIELD(wsync_tensor_t, dtype), WSYNC_FIELD(wsync_tensor_t, device),
                         WSYNC_FIELD(wsync_tensor_t, flags),
                         WSYNC_FIELD(wsync_tensor_t, reserved_)),
            WSYNC_STRUCT(wsync_chunk_t, WSYNC_FIELD(wsync_chunk_t, tensors),
                         WSYNC_FIELD(wsync_chunk_t, count), WSYNC_FIELD(wsync_chunk_t, flags),
                         WSYNC_FIELD(wsync_chunk_t, reserved_)),
            WSYNC_STRUCT(wsync_blob_t, WSYNC_FIELD(wsync_blob_t, data),
                         WSYNC_FIELD(wsync_blob_t, size)),
            WSYNC_STRUCT(wsync_recv_info_t, WSYNC_FIELD(wsync_recv_info_t, version),
                         WSYNC_FIELD(wsync_recv_info_t, bytes),
                         WSYNC_FIELD(wsync_recv_info_t, chunk_index),
                         WSYNC_FIELD(wsync_recv_info_t, flags),
                         WSYNC_FIELD(wsync_recv_info_t, count)),
            {"wsync_status_t", json{{"size", sizeof(wsync_status_t)}, {"align", alignof(wsync_status_t)}}},
        };
#undef WSYNC_STRUCT
#undef WSYNC_FIELD
        *json_out = to_cstring(layout.dump());
    });
}

}  // extern "C"
