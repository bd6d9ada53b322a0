// The C ABI, engine side: receivers, receive iterations, the planner, introspection. See
// abi/translate.hpp for what every entry point does and does not do.
#include "abi/translate.hpp"
#include "apply.hpp"

using wsync::fail;
using namespace wsync::abi;

extern "C" {

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

void wsync_receiver_destroy(wsync_receiver_t *receiver) { destroy<wsync::Receiver>(receiver); }

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
        caller_size<wsync_receiver_state_t>(out->struct_size, "wsync_receiver_state_t");
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
        *has_view = core(it)->next(view, nullptr);
        view->struct_size = static_cast<uint32_t>(sizeof *view);
    });
}

wsync_status_t wsync_recv_next_part(wsync_recv_t *it, wsync_tensor_t *view, wsync_part_t *part,
                                    bool *has_view) {
    if (has_view) *has_view = false;
    return guard([&] {
        require(it, "wsync_recv_next_part", "it");
        require(view, "wsync_recv_next_part", "view");
        require(part, "wsync_recv_next_part", "part");
        require(has_view, "wsync_recv_next_part", "has_view");
        *has_view = core(it)->next(view, part);
        view->struct_size = static_cast<uint32_t>(sizeof *view);
    });
}

wsync_status_t wsync_recv_part(const wsync_recv_t *it, size_t i, wsync_part_t *out) {
    return guard([&] {
        require(it, "wsync_recv_part", "it");
        require(out, "wsync_recv_part", "out");
        core(it)->part(i, out);
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

wsync_status_t wsync_recv_patch(wsync_recv_t *it, size_t i, wsync_patch_t *out) {
    return guard([&] {
        require(it, "wsync_recv_patch", "it");
        require(out, "wsync_recv_patch", "out");
        write_sized(out, wsync_patch_t{}, "wsync_patch_t");  // zeroed, should the call fail
        wsync_patch_t v{};
        core(it)->patch(i, &v);
        write_sized(out, v, "wsync_patch_t");
    });
}

wsync_status_t wsync_dest_table_create(wsync_receiver_t *receiver, const wsync_dest_t *dests,
                                       size_t n, wsync_dest_table_t **out) {
    if (out) *out = nullptr;
    return guard([&] {
        require(receiver, "wsync_dest_table_create", "receiver");
        require(out, "wsync_dest_table_create", "out");
        if (n) require(dests, "wsync_dest_table_create", "dests");
        *out = reinterpret_cast<wsync_dest_table_t *>(new wsync::DestTable(*core(receiver), dests, n));
    });
}

void wsync_dest_table_destroy(wsync_dest_table_t *table) {
    delete reinterpret_cast<wsync::DestTable *>(table);
}

wsync_status_t wsync_receiver_land(wsync_receiver_t *receiver, const wsync_dest_table_t *table) {
    return guard([&] {
        require(receiver, "wsync_receiver_land", "receiver");
        core(receiver)->land(reinterpret_cast<const wsync::DestTable *>(table));
    });
}

wsync_status_t wsync_recv_apply(wsync_recv_t *it, const wsync_dest_table_t *table, uint32_t flags,
                                wsync_apply_result_t *out) {
    return guard([&] {
        require(it, "wsync_recv_apply", "it");
        require(table, "wsync_recv_apply", "table");
        if (out) write_sized(out, wsync_apply_result_t{}, "wsync_apply_result_t");
        wsync_apply_result_t r{};
        // The table's written-version marks change; the destinations it names are the caller's.
        core(it)->apply(*const_cast<wsync::DestTable *>(reinterpret_cast<const wsync::DestTable *>(table)),
                        flags, &r);
        if (out) write_sized(out, r, "wsync_apply_result_t");
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

wsync_status_t wsync_plan_chunk_parts(const wsync_plan_t *plan, size_t i,
                                      const wsync_part_t **parts_out) {
    if (parts_out) *parts_out = nullptr;
    return guard([&] {
        require(plan, "wsync_plan_chunk_parts", "plan");
        require(parts_out, "wsync_plan_chunk_parts", "parts_out");
        const auto &chunks = core(plan)->chunks();
        if (i >= chunks.size())
            fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_plan_chunk_parts: chunk " +
                                                 std::to_string(i) +
                                                 " is out of range (the plan has " +
                                                 std::to_string(chunks.size()) + ")");
        *parts_out = chunks[i].parts.data();
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
            WSYNC_STRUCT(wsync_part_t, WSYNC_FIELD(wsync_part_t, offset),
                         WSYNC_FIELD(wsync_part_t, bytes)),
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
            WSYNC_STRUCT(wsync_patch_t, WSYNC_FIELD(wsync_patch_t, struct_size),
                         WSYNC_FIELD(wsync_patch_t, index_bits),
                         WSYNC_FIELD(wsync_patch_t, base_version),
                         WSYNC_FIELD(wsync_patch_t, count), WSYNC_FIELD(wsync_patch_t, elements),
                         WSYNC_FIELD(wsync_patch_t, indices), WSYNC_FIELD(wsync_patch_t, values),
                         WSYNC_FIELD(wsync_patch_t, base_xxh3),
                         WSYNC_FIELD(wsync_patch_t, result_xxh3)),
            WSYNC_STRUCT(wsync_receiver_state_t, WSYNC_FIELD(wsync_receiver_state_t, struct_size),
                         WSYNC_FIELD(wsync_receiver_state_t, flags),
                         WSYNC_FIELD(wsync_receiver_state_t, completed_version),
                         WSYNC_FIELD(wsync_receiver_state_t, open_version),
                         WSYNC_FIELD(wsync_receiver_state_t, failed_version),
                         WSYNC_FIELD(wsync_receiver_state_t, failed_status),
                         WSYNC_FIELD(wsync_receiver_state_t, reserved_)),
            WSYNC_STRUCT(wsync_dest_t, WSYNC_FIELD(wsync_dest_t, name), WSYNC_FIELD(wsync_dest_t, data),
                         WSYNC_FIELD(wsync_dest_t, shape), WSYNC_FIELD(wsync_dest_t, ndim),
                         WSYNC_FIELD(wsync_dest_t, dtype), WSYNC_FIELD(wsync_dest_t, src_offset),
                         WSYNC_FIELD(wsync_dest_t, bytes), WSYNC_FIELD(wsync_dest_t, flags),
                         WSYNC_FIELD(wsync_dest_t, struct_size)),
            WSYNC_STRUCT(wsync_apply_result_t, WSYNC_FIELD(wsync_apply_result_t, struct_size),
                         WSYNC_FIELD(wsync_apply_result_t, launches),
                         WSYNC_FIELD(wsync_apply_result_t, tensors),
                         WSYNC_FIELD(wsync_apply_result_t, writes),
                         WSYNC_FIELD(wsync_apply_result_t, unmatched),
                         WSYNC_FIELD(wsync_apply_result_t, bytes),
                         WSYNC_FIELD(wsync_apply_result_t, device_copies)),
            {"wsync_status_t", json{{"size", sizeof(wsync_status_t)}, {"align", alignof(wsync_status_t)}}},
        };
#undef WSYNC_STRUCT
#undef WSYNC_FIELD
        *json_out = to_cstring(layout.dump());
    });
}

}  // extern "C"
