/*
 * c_peer: the C side of the Rust binding's cross-language tests. C99, public header only.
 *
 *   c_peer send [--versions N] [--receivers N] [--chunk-bytes N] [--bucket-bytes N]
 *               [--buckets N] [--timeout-ms N]            frames to stdout
 *   c_peer recv [--index N] [--end-early-at V] [--fail-at V]  frames from stdin
 *
 * It speaks the frame format of bindings/rust/wsync/examples/common/mod.rs:
 *
 *   tag (1 byte: 'I' init info, 'R' request, 'Q' end) | length (u64 little-endian) | payload
 *
 * where 'Q' carries the number of versions sent and flushed (u64 little-endian), and builds
 * the same toy model with the same weights: element i of tensor t at version v comes from
 * w = splitmix64(splitmix64(splitmix64(v) ^ t) ^ i) as
 *   float32  ((w >> 40) as float) * 2^-23 - 1    bfloat16  bits (w >> 48)
 *   uint8    w >> 56                             int64     (int64_t)w
 * stored little-endian. So either side checks the other bit for bit without trusting libwsync.
 *
 * --fail-at V takes every view of version V's last chunk, then fails it with wsync_recv_fail
 * (WSYNC_ERR_INTEGRITY), as a loader failing after its last view does. send prints every
 * wsync_failure_t of a failed flush to stderr, field by field.
 *
 * Exit status: 0 success (for recv with --end-early-at or --fail-at: failed exactly as asked),
 * 1 failure, 2 usage. Diagnostics go to stderr; recv prints one summary line to stdout.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync.h"

#define TAG_INIT 'I'
#define TAG_REQUEST 'R'
#define TAG_DONE 'Q'
#define MAX_FRAME ((uint64_t)64 << 20)

/* --- model and weights ------------------------------------------------------------------- */

enum kind { K_F32, K_BF16, K_U8, K_I64 };

typedef struct {
    const char *name;
    enum kind kind;
    int32_t ndim;
    int64_t shape[3];
} param_t;

#define MODEL_N 11
static const param_t MODEL[MODEL_N] = {
    {"embed.weight", K_F32, 2, {64, 32, 0}},
    {"layers.0.attn.q.weight", K_BF16, 2, {32, 32, 0}},
    {"layers.0.attn.k.weight", K_BF16, 2, {32, 32, 0}},
    {"layers.0.attn.v.weight", K_BF16, 2, {32, 32, 0}},
    {"layers.0.attn.o.weight", K_F32, 2, {32, 32, 0}},
    {"layers.0.mlp.up.weight", K_F32, 2, {128, 32, 0}},
    {"layers.0.mlp.down.weight", K_F32, 2, {32, 128, 0}},
    {"layers.0.norm.weight", K_F32, 1, {32, 0, 0}},
    {"layers.0.norm.quant", K_U8, 3, {3, 5, 7}},
    {"lm_head.weight", K_F32, 2, {64, 32, 0}},
    {"step", K_I64, 0, {0, 0, 0}},
};

static wsync_dtype_t dtype_of(enum kind k) {
    wsync_dtype_t d = {0, 0, 1};
    switch (k) {
    case K_F32: d.code = WSYNC_DTYPE_FLOAT; d.bits = 32; break;
    case K_BF16: d.code = WSYNC_DTYPE_BFLOAT; d.bits = 16; break;
    case K_U8: d.code = WSYNC_DTYPE_UINT; d.bits = 8; break;
    case K_I64: d.code = WSYNC_DTYPE_INT; d.bits = 64; break;
    }
    return d;
}

static size_t elements(const param_t *p) {
    size_t n = 1;
    for (int32_t d = 0; d < p->ndim; ++d) n *= (size_t)p->shape[d];
    return n;
}

static size_t nbytes(const param_t *p) { return elements(p) * (dtype_of(p->kind).bits / 8u); }

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t word(uint64_t v, uint64_t t, uint64_t i) {
    return splitmix64(splitmix64(splitmix64(v) ^ t) ^ i);
}

/* Writes tensor t's bytes at version v into buf (nbytes(&MODEL[t]) bytes), little-endian. */
static void fill(uint64_t v, size_t t, unsigned char *buf) {
    const param_t *p = &MODEL[t];
    size_t n = elements(p);
    for (size_t i = 0; i < n; ++i) {
        uint64_t w = word(v, (uint64_t)t, (uint64_t)i);
        switch (p->kind) {
        case K_F32: {
            float f = (float)(w >> 40) * (1.0f / 8388608.0f) - 1.0f;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            for (int b = 0; b < 4; ++b) buf[4 * i + b] = (unsigned char)(bits >> (8 * b));
            break;
        }
        case K_BF16: {
            uint16_t bits = (uint16_t)(w >> 48);
            buf[2 * i] = (unsigned char)bits;
            buf[2 * i + 1] = (unsigned char)(bits >> 8);
            break;
        }
        case K_U8: buf[i] = (unsigned char)(w >> 56); break;
        case K_I64:
            for (int b = 0; b < 8; ++b) buf[8 * i + b] = (unsigned char)(w >> (8 * b));
            break;
        }
    }
}

/* --- frames -------------------------------------------------------------------------------- */

static bool write_frame(char tag, const void *payload, uint64_t len) {
    unsigned char header[9];
    header[0] = (unsigned char)tag;
    for (int b = 0; b < 8; ++b) header[1 + b] = (unsigned char)(len >> (8 * b));
    if (fwrite(header, 1, 9, stdout) != 9) return false;
    if (len && fwrite(payload, 1, (size_t)len, stdout) != len) return false;
    return fflush(stdout) == 0;
}

/* 1: a frame was read (*payload malloc'd, free it); 0: clean end of stream; -1: error. */
static int read_frame(char *tag, unsigned char **payload, size_t *len) {
    unsigned char header[9];
    size_t got = fread(header, 1, 9, stdin);
    if (got == 0 && feof(stdin)) return 0;
    if (got != 9) {
        fprintf(stderr, "c_peer: truncated frame header\n");
        return -1;
    }
    uint64_t n = 0;
    for (int b = 0; b < 8; ++b) n |= (uint64_t)header[1 + b] << (8 * b);
    *tag = (char)header[0];
    if (*tag != TAG_INIT && *tag != TAG_REQUEST && *tag != TAG_DONE) {
        fprintf(stderr, "c_peer: unknown frame tag 0x%02x\n", header[0]);
        return -1;
    }
    if (n > MAX_FRAME) {
        fprintf(stderr, "c_peer: frame of %" PRIu64 " bytes is too large\n", n);
        return -1;
    }
    *payload = malloc(n ? (size_t)n : 1);
    if (!*payload) return -1;
    if (n && fread(*payload, 1, (size_t)n, stdin) != n) {
        fprintf(stderr, "c_peer: truncated frame payload\n");
        free(*payload);
        return -1;
    }
    *len = (size_t)n;
    return 1;
}

/* --- helpers --------------------------------------------------------------------------------- */

static bool ok(wsync_status_t st, const char *what) {
    if (st == WSYNC_OK) return true;
    fprintf(stderr, "c_peer: %s: %s: %s\n", what, wsync_status_string(st), wsync_last_error());
    return false;
}

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (!s || !*s || *s == '-') return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end) return false;
    *out = (uint64_t)v;
    return true;
}

static int find_param(const char *name) {
    for (int t = 0; t < MODEL_N; ++t)
        if (strcmp(MODEL[t].name, name) == 0) return t;
    return -1;
}

/* --- send -------------------------------------------------------------------------------------- */

/* Every receiver failure the sender's last failed call found, one line of fields each. */
static void print_failures(const wsync_sender_t *sender) {
    size_t n = 0;
    if (wsync_sender_failure_count(sender, &n) != WSYNC_OK) return;
    for (size_t i = 0; i < n; ++i) {
        wsync_failure_t f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        if (wsync_sender_failure(sender, i, &f) != WSYNC_OK) return;
        fprintf(stderr,
                "c_peer send: failure: receiver %" PRIu32 " what %" PRIu32 " status %s version %" PRIu64
                " chunk %" PRIu32 " pid %" PRId32 ": %s\n",
                f.receiver, f.what, wsync_status_string(f.status), f.version, f.chunk_index, f.pid,
                f.message);
    }
}

static int run_send(uint64_t versions, uint64_t receivers, uint64_t chunk_bytes,
                    uint64_t bucket_bytes, uint64_t buckets, uint64_t timeout_ms) {
    int rc = 1;
    char options[256];
    snprintf(options, sizeof options,
             "{\"receivers\": %" PRIu64 ", \"buckets\": %" PRIu64 ", \"bucket_bytes\": %" PRIu64
             ", \"timeout_ms\": %" PRIu64 "}",
             receivers, buckets, bucket_bytes, timeout_ms);
    wsync_strategy_t *strategy = NULL;
    wsync_sender_t *sender = NULL;
    wsync_plan_t *plan = NULL;
    wsync_blob_t init = {NULL, 0};
    unsigned char *data[MODEL_N] = {NULL};
    wsync_tensor_t tensors[MODEL_N];

    if (!ok(wsync_strategy_create("shm", options, &strategy), "strategy")) goto out;
    if (!ok(wsync_strategy_create_init_info(strategy, &init), "init info")) goto out;
    if (!ok(wsync_sender_create(strategy, init.data, init.size, &sender), "sender")) goto out;
    if (!write_frame(TAG_INIT, init.data, init.size)) goto write_failed;

    for (int t = 0; t < MODEL_N; ++t) {
        data[t] = malloc(nbytes(&MODEL[t]));
        if (!data[t]) goto out;
        memset(&tensors[t], 0, sizeof tensors[t]);
        tensors[t].name = MODEL[t].name;
        tensors[t].data = data[t];
        tensors[t].shape = MODEL[t].shape;
        tensors[t].ndim = MODEL[t].ndim;
        tensors[t].dtype = dtype_of(MODEL[t].kind);
        tensors[t].device.type = WSYNC_DEVICE_CPU;
        tensors[t].struct_size = sizeof(wsync_tensor_t);
    }
    char plan_options[64];
    snprintf(plan_options, sizeof plan_options, "{\"chunk_bytes\": %" PRIu64 "}", chunk_bytes);
    if (!ok(wsync_plan_create(tensors, MODEL_N, plan_options, &plan), "plan")) goto out;
    size_t chunks;
    if (!ok(wsync_plan_chunk_count(plan, &chunks), "plan chunk count")) goto out;

    for (uint64_t v = 1; v <= versions; ++v) {
        uint64_t at;
        if (!ok(wsync_sender_version(sender, &at), "sender version")) goto out;
        if (at != v) {
            fprintf(stderr, "c_peer: sender is at version %" PRIu64 ", expected %" PRIu64 "\n", at, v);
            goto out;
        }
        for (int t = 0; t < MODEL_N; ++t) fill(v, (size_t)t, data[t]);
        for (size_t c = 0; c < chunks; ++c) {
            const size_t *idx;
            size_t count;
            if (!ok(wsync_plan_chunk(plan, c, &idx, &count, NULL), "plan chunk")) goto out;
            wsync_tensor_t batch[MODEL_N];
            for (size_t k = 0; k < count; ++k) batch[k] = tensors[idx[k]];
            wsync_chunk_t chunk = {batch, count, c + 1 == chunks ? WSYNC_CHUNK_LAST : 0u,
                                   sizeof(wsync_chunk_t)};
            wsync_blob_t request = {NULL, 0};
            if (!ok(wsync_sender_send_chunk(sender, &chunk, &request), "send_chunk")) {
                print_failures(sender);
                goto out;
            }
            bool written = write_frame(TAG_REQUEST, request.data, request.size);
            wsync_blob_free(&request);
            if (!written) goto write_failed;
        }
        if (!ok(wsync_sender_flush(sender, (int64_t)timeout_ms), "flush")) {
            print_failures(sender);
            goto out;
        }
        fprintf(stderr, "c_peer send: version %" PRIu64 " flushed (%zu chunks)\n", v, chunks);
    }
    unsigned char done[8];
    for (int b = 0; b < 8; ++b) done[b] = (unsigned char)(versions >> (8 * b));
    if (!write_frame(TAG_DONE, done, 8)) goto write_failed;
    rc = 0;
    goto out;
write_failed:
    fprintf(stderr, "c_peer: writing a frame to stdout failed\n");
out:
    for (int t = 0; t < MODEL_N; ++t) free(data[t]);
    wsync_plan_destroy(plan);
    wsync_sender_destroy(sender);
    wsync_blob_free(&init);
    wsync_strategy_destroy(strategy);
    return rc;
}

/* --- recv -------------------------------------------------------------------------------------- */

/* Checks one view against the model and the formula; marks it seen. */
static bool check_view(const wsync_tensor_t *view, uint64_t version, bool seen[MODEL_N],
                       unsigned char *scratch) {
    int t = find_param(view->name);
    if (t < 0) {
        fprintf(stderr, "c_peer: unknown tensor '%s'\n", view->name);
        return false;
    }
    const param_t *p = &MODEL[t];
    wsync_dtype_t want = dtype_of(p->kind);
    bool same = view->ndim == p->ndim && view->dtype.code == want.code &&
                view->dtype.bits == want.bits && view->dtype.lanes == want.lanes;
    for (int32_t d = 0; same && d < p->ndim; ++d) same = view->shape[d] == p->shape[d];
    if (!same) {
        fprintf(stderr, "c_peer: tensor '%s' has another dtype or shape\n", p->name);
        return false;
    }
    if (view->device.type != WSYNC_DEVICE_CPU || !(view->flags & WSYNC_TENSOR_READ_ONLY) ||
        !view->data) {
        fprintf(stderr, "c_peer: tensor '%s' is not a read-only host view\n", p->name);
        return false;
    }
    if (seen[t]) {
        fprintf(stderr, "c_peer: tensor '%s' arrived twice in version %" PRIu64 "\n", p->name, version);
        return false;
    }
    seen[t] = true;
    fill(version, (size_t)t, scratch);
    if (memcmp(view->data, scratch, nbytes(p)) != 0) {
        fprintf(stderr, "c_peer: tensor '%s' of version %" PRIu64 " differs\n", p->name, version);
        return false;
    }
    return true;
}

static int run_recv(uint32_t index, uint64_t end_early_at, uint64_t fail_at) {
    int rc = 1;
    wsync_strategy_t *strategy = NULL;
    wsync_receiver_t *receiver = NULL;
    unsigned char *frame = NULL, *scratch = NULL;
    size_t len;
    char tag;
    bool seen[MODEL_N] = {false};
    uint64_t version = 1, announced = 0, tensors = 0, chunks = 0, failed_version = 0;

    size_t biggest = 0;
    for (int t = 0; t < MODEL_N; ++t)
        if (nbytes(&MODEL[t]) > biggest) biggest = nbytes(&MODEL[t]);
    scratch = malloc(biggest);
    if (!scratch) goto out;

    if (read_frame(&tag, &frame, &len) != 1 || tag != TAG_INIT) {
        fprintf(stderr, "c_peer: the stream does not start with an init frame\n");
        goto out;
    }
    if (!ok(wsync_strategy_create("shm", NULL, &strategy), "strategy")) goto out;
    if (!ok(wsync_receiver_create(strategy, frame, len, index, &receiver), "receiver")) goto out;
    free(frame);
    frame = NULL;

    for (;;) {
        int got = read_frame(&tag, &frame, &len);
        if (got < 0) goto out;
        if (got == 0) {
            if (failed_version) break; /* expected: the trainer's flush failed */
            fprintf(stderr, "c_peer: the stream ended without 'Q': the trainer failed\n");
            goto out;
        }
        if (tag == TAG_DONE) {
            if (len != 8) goto out;
            for (int b = 0; b < 8; ++b) announced |= (uint64_t)frame[b] << (8 * b);
            break;
        }
        if (tag != TAG_REQUEST) {
            fprintf(stderr, "c_peer: unexpected frame '%c'\n", tag);
            goto out;
        }
        wsync_recv_t *it;
        wsync_status_t got_it = wsync_receiver_receive(receiver, frame, len, &it);
        if (got_it != WSYNC_OK && failed_version == version) {
            /* The rest of a version this receiver failed: refused with that version's status. */
            fprintf(stderr, "c_peer recv: skipping the rest of failed version %" PRIu64 ": %s\n",
                    version, wsync_last_error());
            free(frame);
            frame = NULL;
            continue;
        }
        if (!ok(got_it, "receive")) goto out;
        free(frame);
        frame = NULL;
        wsync_recv_info_t info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if (!ok(wsync_recv_info(it, &info), "recv info")) {
            wsync_recv_end(it);
            goto out;
        }
        ++chunks;
        if (info.version != version) {
            fprintf(stderr, "c_peer: chunk of version %" PRIu64 ", expected %" PRIu64 "\n",
                    info.version, version);
            wsync_recv_end(it);
            goto out;
        }
        if (info.chunk_index == 0) memset(seen, 0, sizeof seen);
        if (info.chunk_index == 0 && version == end_early_at) {
            /* Dry run only, then end without a single view: acknowledged as failed. */
            for (size_t i = 0; i < info.count; ++i) {
                wsync_tensor_t meta;
                if (!ok(wsync_recv_peek(it, i, &meta), "peek")) {
                    wsync_recv_end(it);
                    goto out;
                }
                int t = find_param(meta.name);
                if (t >= 0) seen[t] = true;
            }
            wsync_status_t st = wsync_recv_end(it);
            if (st != WSYNC_ERR_WRONG_STATE) {
                fprintf(stderr, "c_peer: ending early returned %s\n", wsync_status_string(st));
                goto out;
            }
            fprintf(stderr, "c_peer recv: ended version %" PRIu64 " chunk 0 early as asked\n", version);
            failed_version = version;
        } else {
            wsync_tensor_t view;
            bool has;
            for (;;) {
                if (!ok(wsync_recv_next(it, &view, &has), "next")) {
                    wsync_recv_end(it);
                    goto out;
                }
                if (!has) break;
                if (!check_view(&view, version, seen, scratch)) {
                    wsync_recv_end(it);
                    goto out;
                }
                ++tensors;
            }
            if ((info.flags & WSYNC_CHUNK_LAST) && version == fail_at) {
                /* Every view taken: only wsync_recv_fail can still fail the chunk. */
                char why[96];
                snprintf(why, sizeof why, "c_peer: refusing version %" PRIu64 " after its last view",
                         version);
                if (!ok(wsync_recv_fail(it, WSYNC_ERR_INTEGRITY, why), "fail")) goto out;
                fprintf(stderr, "%s as asked\n", why);
                failed_version = version;
            } else if (!ok(wsync_recv_end(it), "end")) {
                goto out;
            }
        }
        if (info.flags & WSYNC_CHUNK_LAST) {
            for (int t = 0; t < MODEL_N; ++t)
                if (!seen[t]) {
                    fprintf(stderr, "c_peer: version %" PRIu64 " lacks '%s'\n", version, MODEL[t].name);
                    goto out;
                }
            uint64_t done;
            if (!ok(wsync_receiver_completed_version(receiver, &done), "completed version")) goto out;
            uint64_t want = failed_version == version ? version - 1 : version;
            if (done != want) {
                fprintf(stderr, "c_peer: completed version %" PRIu64 ", expected %" PRIu64 "\n", done, want);
                goto out;
            }
            ++version;
        }
    }
    uint64_t completed;
    if (!ok(wsync_receiver_completed_version(receiver, &completed), "completed version")) goto out;
    if (!failed_version && completed != announced) {
        fprintf(stderr, "c_peer: trainer sent %" PRIu64 " versions, completed %" PRIu64 "\n",
                announced, completed);
        goto out;
    }
    printf("c_peer recv %" PRIu32 ": %" PRIu64 " chunks, %" PRIu64
           " tensors verified; completed version %" PRIu64 " (announced %" PRIu64 ")\n",
           index, chunks, tensors, completed, announced);
    rc = 0;
out:
    free(frame);
    free(scratch);
    wsync_receiver_destroy(receiver);
    wsync_strategy_destroy(strategy);
    return rc;
}

/* --- main ---------------------------------------------------------------------------------------- */

static int usage(void) {
    fprintf(stderr,
            "usage: c_peer send [--versions N] [--receivers N] [--chunk-bytes N]\n"
            "                   [--bucket-bytes N] [--buckets N] [--timeout-ms N]\n"
            "       c_peer recv [--index N] [--end-early-at V] [--fail-at V]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    bool send = strcmp(argv[1], "send") == 0;
    if (!send && strcmp(argv[1], "recv") != 0) return usage();
    uint64_t versions = 3, receivers = 1, chunk_bytes = 16 << 10, bucket_bytes = 32 << 10,
             buckets = 2, timeout_ms = 20000, index = 0, end_early_at = 0, fail_at = 0;
    struct {
        const char *key;
        uint64_t *value;
        bool for_send;
    } keys[] = {
        {"--versions", &versions, true},       {"--receivers", &receivers, true},
        {"--chunk-bytes", &chunk_bytes, true}, {"--bucket-bytes", &bucket_bytes, true},
        {"--buckets", &buckets, true},         {"--timeout-ms", &timeout_ms, true},
        {"--index", &index, false},            {"--end-early-at", &end_early_at, false},
        {"--fail-at", &fail_at, false},
    };
    for (int a = 2; a < argc; a += 2) {
        bool known = false;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; ++k) {
            if (strcmp(argv[a], keys[k].key) != 0 || keys[k].for_send != send) continue;
            if (a + 1 >= argc || !parse_u64(argv[a + 1], keys[k].value)) return usage();
            known = true;
        }
        if (!known) return usage();
    }
    if (send) return run_send(versions, receivers, chunk_bytes, bucket_bytes, buckets, timeout_ms);
    if (index > UINT32_MAX) return usage();
    return run_recv((uint32_t)index, end_early_at, fail_at);
}
