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

// The "Structs" rule of wsync.h: struct_size 0 means the 0.2 layout (this one); a larger one
// must have zeros past the fields this version knows.
template <class T>
void check_struct_size(const T *p, uint32_t size, const char *what) {
    if (size == 0 || size == sizeof(T)) return;
    if (size < sizeof(T))
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(what) + ".struct_size is " + std::to_string(size) + ", less than " +
                 std::to_string(sizeof(T)) + " (the smallest layout this library knows)");
    if (size > (1u << 16))
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(what) + ".struct_size " + std::to_string(size) + " is implausibly large");
    const auto *extra = reinterpret_cast<const unsigned char *>(p) + sizeof(T);
    for (uint32_t i = 0; i < size - sizeof(T); ++i)
        if (extra[i])
            fail(WSYNC_ERR_UNSUPPORTED, std::string(what) + " sets fields newer than this library (" +
                                            wsync_version_string() + ") knows");
}

// Output structs: the caller's struct_size says how much may be written.
template <class T>
void write_sized(T *out, const T &value, const char *what) {
    uint32_t size = out->struct_size;
    if (size != 0 && size < sizeof(T))
        fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(what) + ".struct_size is " +
                                             std::to_string(size) + ", less than " +
                                             std::to_string(sizeof(T)));
    // Only the fields this version knows are written; a caller's larger struct keeps its tail.
    T v = value;
    v.struct_size = static_cast<uint32_t>(sizeof(T));
    std::memcpy(out, &v, sizeof(T));
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
        *request_out = to_blob(core(sender)->send_chunk(c));
    });
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

wsync_status_t wsync_receiver_poll(wsync_receiver_t *receiver, wsync_receiver_state_t *out) {
    return guard([&] {
        require(receiver, "wsync_receiver_poll", "receiver");
        require(out, "wsync_receiver_poll", "out");
        if (out->struct_size != 0 && out->struct_size < sizeof *out)
            fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_receiver_state_t.struct_size is too small");
        write_sized(out, core(receiver)->poll(), "wsync_receiver_state_t");
    });
}

wsync_status_t wsync_receiver_set_stream(wsync_receiver_t *receiver, void *stream) {
    return guard([&] {
        require(receiver, "wsync_receiver_set_stream", "receiver");
        core(receiver)->set_stream(stream);
    });
}

wsync_status_t wsync_recv_info(const wsync_recv_t *it, wsync_recv_info_t *info) {
    return guard([&] {
        require(it, "wsync_recv_info", "it");
        require(info, "wsync_recv_info", "info");
        wsync_recv_info_t v{};
        core(it)->info(&v);
        write_sized(info, v, "wsync_recv_info_t");
    });
}

wsync_status_t wsync_recv_peek(const wsync_recv_t *it, size_t i, wsync_tensor_t *view) {
    return guard([&] {
        require(it, "wsync_recv_peek", "it");
        require(view, "wsync_recv_peek", "view");
        core(it)->peek(i, view);  // views are written in the 0.2 layout, struct_size set
        view->struct_size = static_cast<uint32_t>(sizeof *view);
    });
}

wsync_status_t wsync_recv_next(wsync_recv_t *it, wsync_tensor_t *view, bool *has_view) {
    if (has_view) *has_view = false;
    return guard([&] {
        require(it, "wsync_recv_next", "it");
        require(view, "wsync_recv_next", "view");
        require(has_view, "wsync_recv_next", "has_view");
        *has_view = core(it)->next(view);
        view->struct_size = static_cast<uint32_t>(sizeof *view);
    });
}

wsync_status_t wsync_recv_copy(wsync_recv_t *it, size_t i, uint64_t offset, void *dst,
                               uint64_t len) {
    return guard([&] {
        require(it, "wsync_recv_copy", "it");
        require(dst, "wsync_recv_copy", "dst");
        core(it)->copy(i, offset, dst, len);
    });
}

wsync_status_t wsync_recv_end(wsync_recv_t *it) {
    if (!it) return WSYNC_OK;
    return guard([&] {
        wsync::Iteration *i = core(it);
        i->owner()->end(i);
    });
}

wsync_status_t wsync_recv_fail(wsync_recv_t *it, wsync_status_t status, const char *message) {
    if (!it) return WSYNC_OK;
    return guard([&] {
        wsync::Iteration *i = core(it);
        i->owner()->fail_iteration(i, status, message);
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
                         WSYNC_FIELD(wsync_tensor_t, struct_size)),
            WSYNC_STRUCT(wsync_chunk_t, WSYNC_FIELD(wsync_chunk_t, tensors),
                         WSYNC_FIELD(wsync_chunk_t, count), WSYNC_FIELD(wsync_chunk_t, flags),
                         WSYNC_FIELD(wsync_chunk_t, struct_size)),
            WSYNC_STRUCT(wsync_blob_t, WSYNC_FIELD(wsync_blob_t, data),
                         WSYNC_FIELD(wsync_blob_t, size)),
            WSYNC_STRUCT(wsync_recv_info_t, WSYNC_FIELD(wsync_recv_info_t, struct_size),
                         WSYNC_FIELD(wsync_recv_info_t, flags),
                         WSYNC_FIELD(wsync_recv_info_t, version),
                         WSYNC_FIELD(wsync_recv_info_t, bytes),
                         WSYNC_FIELD(wsync_recv_info_t, count),
                         WSYNC_FIELD(wsync_recv_info_t, chunk_index),
                         WSYNC_FIELD(wsync_recv_info_t, version_chunks),
                         WSYNC_FIELD(wsync_recv_info_t, version_tensors),
                         WSYNC_FIELD(wsync_recv_info_t, version_bytes)),
            WSYNC_STRUCT(wsync_failure_t, WSYNC_FIELD(wsync_failure_t, struct_size),
                         WSYNC_FIELD(wsync_failure_t, what), WSYNC_FIELD(wsync_failure_t, status),
                         WSYNC_FIELD(wsync_failure_t, receiver),
                         WSYNC_FIELD(wsync_failure_t, version),
                         WSYNC_FIELD(wsync_failure_t, chunk_index),
                         WSYNC_FIELD(wsync_failure_t, pid), WSYNC_FIELD(wsync_failure_t, message)),
            WSYNC_STRUCT(wsync_receiver_state_t, WSYNC_FIELD(wsync_receiver_state_t, struct_size),
                         WSYNC_FIELD(wsync_receiver_state_t, flags),
                         WSYNC_FIELD(wsync_receiver_state_t, completed_version),
                         WSYNC_FIELD(wsync_receiver_state_t, open_version),
                         WSYNC_FIELD(wsync_receiver_state_t, failed_version),
                         WSYNC_FIELD(wsync_receiver_state_t, failed_status),
                         WSYNC_FIELD(wsync_receiver_state_t, reserved_)),
            {"wsync_status_t", json{{"size", sizeof(wsync_status_t)}, {"align", alignof(wsync_status_t)}}},
        };
#undef WSYNC_STRUCT
#undef WSYNC_FIELD
        *json_out = to_cstring(layout.dump());
    });
}

}  // extern "C"
