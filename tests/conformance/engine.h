/* The rig's engine process (included by rig.h). It waits for a start frame (its receiver index,
 * 4 bytes, and its mode, 1 byte) and the init info, makes its strategy and receiver, and answers
 * the status of wsync_receiver_create (0: attached; anything else: it exits). Then, for each
 * frame: "Q" ends it; "P" answers its receiver's poll as a rig_poll_t; any other frame is a
 * request, answered with one byte: 0 chunk loaded, the status of a refused or failed chunk
 * (its receive, a view, its end, or its loader's planned failure), 50 if a completed version
 * is not bit-exact, 51 if the last chunk ended but the version did not complete. */
#ifndef WSYNC_CONFORMANCE_ENGINE_H
#define WSYNC_CONFORMANCE_ENGINE_H

static const rig_failure_t *rig_planned_failure(int mode, uint64_t version, uint32_t chunk) {
    for (size_t i = 0; i < sizeof kRigFailures / sizeof kRigFailures[0]; ++i)
        if (kRigFailures[i].mode == mode && kRigFailures[i].version == version &&
            kRigFailures[i].chunk == chunk)
            return &kRigFailures[i];
    return NULL;
}

/* Loads one request; returns the answer byte. `weights` keeps what the views held. */
static uint8_t rig_engine_load(wsync_receiver_t *rc, int mode, const uint8_t *req, size_t len,
                               uint8_t weights[RIG_TENSORS][RIG_BYTES]) {
    wsync_recv_t *it;
    wsync_status_t st = wsync_receiver_receive(rc, req, len, &it);
    if (st != WSYNC_OK) return (uint8_t)st;
    wsync_recv_info_t info = {.struct_size = sizeof info};
    wsync_recv_info(it, &info);
    wsync_tensor_t v;
    bool has = true;
    while (has && (st = wsync_recv_next(it, &v, &has)) == WSYNC_OK && has)
        for (int k = 0; k < RIG_TENSORS; ++k)
            if (strcmp(v.name, kRigNames[k]) == 0) memcpy(weights[k], v.data, RIG_BYTES);
    const rig_failure_t *fail = rig_planned_failure(mode, info.version, info.chunk_index);
    if (st == WSYNC_OK && fail) { /* every view was taken; the loader fails afterwards */
        wsync_recv_fail(it, fail->status, fail->message);
        return (uint8_t)fail->status;
    }
    wsync_status_t end = wsync_recv_end(it);
    if (st == WSYNC_OK) st = end;
    if (st != WSYNC_OK || !(info.flags & WSYNC_CHUNK_LAST)) return (uint8_t)st;
    uint64_t done = 0;
    wsync_receiver_completed_version(rc, &done);
    if (done != info.version) return 51;
    for (int k = 0; k < RIG_TENSORS; ++k)
        if (!tu_check(weights[k], RIG_BYTES, info.version, (uint64_t)k)) return 50;
    return 0;
}

static int rig_engine_main(const void *p, int in, int out) {
    const rig_t *r = (const rig_t *)p;
    uint8_t *start, *init;
    size_t n, init_len;
    if (tu_recv_frame(in, &start, &n, 120000)) return 10;
    if (n == 1 && start[0] == 'Q') return free(start), 0; /* a spare never started */
    if (n != 5) return 10;
    uint32_t index;
    memcpy(&index, start, 4);
    int mode = start[4];
    free(start);
    if (tu_recv_frame(in, &init, &init_len, 20000) || !init) return 10;
    if (r->caps.gpu_per_receiver) { /* this receiver alone sees GPU index + 1 */
        char visible[16];
        snprintf(visible, sizeof visible, "%u", index + 1);
        setenv("CUDA_VISIBLE_DEVICES", visible, 1);
    }
    char opts[512];
    rig_engine_options(r, opts, sizeof opts);
    wsync_strategy_t *s;
    wsync_receiver_t *rc = NULL;
    wsync_status_t st = wsync_strategy_create(r->kind, opts, &s);
    if (st == WSYNC_OK) st = wsync_receiver_create(s, init, init_len, index, &rc);
    free(init);
    uint8_t b = (uint8_t)st;
    if (st != WSYNC_OK) fprintf(stderr, "engine %u: %s\n", index, wsync_last_error());
    tu_write_all(out, &b, 1);
    if (st != WSYNC_OK) return 11;
    static uint8_t weights[RIG_TENSORS][RIG_BYTES];
    for (;;) {
        uint8_t *req;
        size_t len;
        if (tu_recv_frame(in, &req, &len, 60000) != 0 || !req) break;
        if (len == 1 && req[0] == 'Q') {
            free(req);
            break;
        }
        if (len == 1 && req[0] == 'P') {
            free(req);
            wsync_receiver_state_t stt = {.struct_size = sizeof stt};
            rig_poll_t got = {0, 0, 0xffffffffu, 0};
            if (wsync_receiver_poll(rc, &stt) == WSYNC_OK)
                got = (rig_poll_t){stt.failed_version, stt.completed_version,
                                   (uint32_t)stt.failed_status, stt.flags};
            tu_write_all(out, &got, sizeof got);
            continue;
        }
        b = rig_engine_load(rc, mode, req, len, weights);
        if (b && b < 50 && *wsync_last_error()) fprintf(stderr, "engine %u: %s\n", index, wsync_last_error());
        free(req);
        tu_write_all(out, &b, 1);
    }
    wsync_receiver_destroy(rc);
    wsync_strategy_destroy(s);
    return 0;
}

#endif
