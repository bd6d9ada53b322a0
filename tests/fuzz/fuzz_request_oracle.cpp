// The request oracle (issue 9): a tampered request is never loaded.
//
// Every input is a small program of edits applied to a request a live shm sender has just
// published (checksums on), not raw bytes, so every run starts from a request the receiver
// would accept and the oracle knows exactly what the clean request carries:
//
//   input[0]  bit 0  reseal: recompute the blob's seal after editing, as a writer that knows
//                    the format would. Without it the edits must be caught by the seal; with it
//                    they reach the parser, the tensor table, the per-tensor checksums and the
//                    manifest.
//             bit 1  the version has two chunks (seq 1, then seq 2 flagged LAST) instead of one.
//             bit 2  with two chunks, the edits apply to the second request instead of the first.
//   then      4-byte edits {op, offset hi, offset lo, value}: op % 4 = 0 xor, 1 set, 2 insert,
//                    3 delete, offset taken modulo the current length (at most 16 edits).
//
// Oracle, after the receiver has been given every request of the version in order:
//   - the version completes  =>  every view it returned (name, dtype, shape, every byte) is the
//     clean request's, and without reseal the edited blob is byte-identical to the clean one;
//   - it does not complete   =>  the refusal has a status naming a cause (MALFORMED,
//     INTEGRITY, MISMATCH, ...), never INTERNAL or SYSTEM, and without reseal a changed blob is
//     refused by the seal itself (INTEGRITY or MALFORMED) before any view exists.
// Any violation aborts, which libFuzzer reports as a crash with the input that caused it.
//
// Each input gets its own strategy, sender and receiver, so runs do not depend on each other.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "wsync.h"

namespace {

[[noreturn]] void violated(const char *what) {
    std::fprintf(stderr, "request oracle violated: %s (last error: %s)\n", what,
                 wsync_last_error());
    std::abort();
}

void must(wsync_status_t st, const char *what) {
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "fuzz_request_oracle setup: %s: %s\n", what, wsync_last_error());
        std::abort();
    }
}

struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    wsync_dtype_t dtype;
    std::vector<uint8_t> bytes;
};

// Two chunks' worth of tensors with distinct names, dtypes, shapes and contents.
std::vector<Tensor> make_chunk(int chunk) {
    std::vector<Tensor> ts;
    auto add = [&](const char *name, std::vector<int64_t> shape, wsync_dtype_t dt) {
        size_t n = static_cast<size_t>(dt.bits) * dt.lanes / 8;
        for (int64_t d : shape) n *= static_cast<size_t>(d);
        Tensor t{name, shape, dt, std::vector<uint8_t>(n)};
        for (size_t i = 0; i < n; ++i) t.bytes[i] = static_cast<uint8_t>(i * 131 + chunk * 17 + 7);
        ts.push_back(std::move(t));
    };
    if (chunk == 0) {
        add("layers.0.attn.q.weight", {4, 6}, {WSYNC_DTYPE_FLOAT, 32, 1});
        add("layers.0.attn.k.weight", {6}, {WSYNC_DTYPE_BFLOAT, 16, 1});
    } else {
        add("layers.1.mlp.up.weight", {3, 5}, {WSYNC_DTYPE_INT, 8, 1});
        add("lm_head.weight", {2, 2, 2}, {WSYNC_DTYPE_FLOAT, 16, 1});
    }
    return ts;
}

wsync_status_t publish(wsync_sender_t *s, std::vector<Tensor> &ts, bool last,
                       std::vector<uint8_t> *out) {
    std::vector<wsync_tensor_t> desc(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
        desc[i] = {};
        desc[i].name = ts[i].name.c_str();
        desc[i].data = ts[i].bytes.data();
        desc[i].shape = ts[i].shape.data();
        desc[i].ndim = static_cast<int32_t>(ts[i].shape.size());
        desc[i].dtype = ts[i].dtype;
        desc[i].device = {WSYNC_DEVICE_CPU, 0};
    }
    wsync_chunk_t c = {desc.data(), desc.size(), last ? WSYNC_CHUNK_LAST : 0u, 0};
    wsync_blob_t req;
    wsync_status_t st = wsync_sender_send_chunk(s, &c, &req);
    if (st == WSYNC_OK) {
        out->assign(req.data, req.data + req.size);
        wsync_blob_free(&req);
    }
    return st;
}

void apply_edits(std::vector<uint8_t> &b, const uint8_t *e, size_t n) {
    for (size_t k = 0; k + 4 <= n && k < 16 * 4; k += 4) {
        if (b.empty()) return;
        size_t off = ((static_cast<size_t>(e[k + 1]) << 8) | e[k + 2]) % b.size();
        uint8_t v = e[k + 3];
        switch (e[k] % 4) {
            case 0: b[off] ^= v; break;
            case 1: b[off] = v; break;
            case 2: b.insert(b.begin() + static_cast<std::ptrdiff_t>(off), v); break;
            default: b.erase(b.begin() + static_cast<std::ptrdiff_t>(off)); break;
        }
    }
}

void reseal(std::vector<uint8_t> &b) {
    // The seal is the last 9 bytes (CBOR 0x1b + big-endian XXH3-64 of everything before).
    if (b.size() < 9) return;
    uint64_t h = XXH3_64bits(b.data(), b.size() - 9);
    for (int i = 0; i < 8; ++i) b[b.size() - 8 + i] = static_cast<uint8_t>(h >> (56 - 8 * i));
}

bool refusal_names_a_cause(wsync_status_t st) {
    return st != WSYNC_OK && st != WSYNC_ERR_INTERNAL && st != WSYNC_ERR_SYSTEM;
}

// Receives one request; appends its views to *seen. Returns the receive status, or the
// iteration's end status when the receive itself succeeded.
wsync_status_t take(wsync_receiver_t *r, const std::vector<uint8_t> &blob,
                    std::vector<Tensor> *seen, bool *had_views) {
    wsync_recv_t *it = nullptr;
    wsync_status_t st = wsync_receiver_receive(r, blob.data(), blob.size(), &it);
    if (st != WSYNC_OK) return st;
    for (;;) {
        wsync_tensor_t v;
        bool has = false;
        st = wsync_recv_next(it, &v, &has);
        if (st != WSYNC_OK) {
            wsync_recv_fail(it, st, "fuzz: next failed");
            return st;
        }
        if (!has) break;
        *had_views = true;
        Tensor t{v.name, std::vector<int64_t>(v.shape, v.shape + v.ndim), v.dtype, {}};
        size_t n = static_cast<size_t>(v.dtype.bits) * v.dtype.lanes / 8;
        for (int32_t d = 0; d < v.ndim; ++d) n *= static_cast<size_t>(v.shape[d]);
        const auto *p = static_cast<const uint8_t *>(v.data);
        t.bytes.assign(p, p + n);  // read in full: a bad offset shows under AddressSanitizer
        seen->push_back(std::move(t));
    }
    return wsync_recv_end(it);
}

bool same(const Tensor &a, const Tensor &b) {
    return a.name == b.name && a.shape == b.shape && a.dtype.code == b.dtype.code &&
           a.dtype.bits == b.dtype.bits && a.dtype.lanes == b.dtype.lanes && a.bytes == b.bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const bool do_reseal = data[0] & 1, two = data[0] & 2, edit_second = two && (data[0] & 4);

    wsync_strategy_t *strategy = nullptr;
    must(wsync_strategy_create(
             "shm", "{\"receivers\": 1, \"bucket_bytes\": 4096, \"buckets\": 2, \"checksum\": true}",
             &strategy),
         "strategy");
    wsync_blob_t init;
    must(wsync_strategy_create_init_info(strategy, &init), "init info");
    wsync_sender_t *sender = nullptr;
    must(wsync_sender_create(strategy, init.data, init.size, &sender), "sender");
    wsync_receiver_t *r = nullptr;
    must(wsync_receiver_create(strategy, init.data, init.size, 0, &r), "receiver");

    std::vector<std::vector<Tensor>> chunks = {make_chunk(0)};
    if (two) chunks.push_back(make_chunk(1));
    std::vector<std::vector<uint8_t>> clean(chunks.size());
    for (size_t c = 0; c < chunks.size(); ++c)
        must(publish(sender, chunks[c], c + 1 == chunks.size(), &clean[c]), "send_chunk");

    const size_t target = edit_second ? 1 : 0;
    std::vector<uint8_t> edited = clean[target];
    apply_edits(edited, data + 1, size - 1);
    if (do_reseal) reseal(edited);
    const bool changed = edited != clean[target];

    std::vector<Tensor> seen;
    bool failed = false;
    for (size_t c = 0; c < clean.size() && !failed; ++c) {
        bool had_views = false;
        wsync_status_t st = take(r, c == target ? edited : clean[c], &seen, &had_views);
        if (st == WSYNC_OK) continue;
        if (!refusal_names_a_cause(st)) violated("refused without a named cause (INTERNAL/SYSTEM)");
        if (c == target && changed && !do_reseal) {
            if (st != WSYNC_ERR_INTEGRITY && st != WSYNC_ERR_MALFORMED)
                violated("an unsealed change was not refused as INTEGRITY or MALFORMED");
            if (had_views) violated("an unsealed change produced views before its refusal");
        }
        failed = true;
    }

    wsync_receiver_state_t state{};
    state.struct_size = sizeof state;
    must(wsync_receiver_poll(r, &state), "poll");
    const bool completed = state.completed_version != 0;
    if (completed) {
        if (failed) violated("a version completed although one of its chunks failed");
        if (changed && !do_reseal) violated("a changed blob passed the seal and completed");
        std::vector<Tensor> want;
        for (auto &c : chunks) want.insert(want.end(), c.begin(), c.end());
        if (seen.size() != want.size()) violated("completed with a different tensor count");
        for (size_t i = 0; i < want.size(); ++i)
            if (!same(seen[i], want[i])) violated("completed with content unlike the clean request");
    } else if (!failed && !changed) {
        violated("the clean version did not complete");
    }

    wsync_receiver_destroy(r);
    wsync_sender_destroy(sender);
    wsync_strategy_destroy(strategy);
    wsync_blob_free(&init);
    return 0;
}
