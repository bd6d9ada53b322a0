// wsync: the command-line tool. A real consumer of the library: it uses only include/wsync.h.
//
//   wsync demo     trainer + N engine processes syncing a synthetic Llama-shaped model, verified
//   wsync bench    the same figures as JSON, plus metadata and checksum costs; with
//                  --strategy cuda_ipc, GPU to GPU through CUDA IPC against a device copy
//   wsync inspect  a blob as JSON
//   wsync kinds | options KIND | --version | help
//
// Process layout of demo/bench: the parent is the controller and the trainer; it forks the
// engines before any library handle exists (handles do not survive fork). Controller and
// engines talk over pipes in length-prefixed frames that carry only bytes: the init blob, each
// request blob, and end-of-step markers one way; readiness and verification reports the other.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <sys/wait.h>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "wsync.h"

#include "bench_copy.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "wsync: %s\n", what.c_str());
    std::exit(1);
}
// Bad command lines exit 2, like the other usage errors.
[[noreturn]] void usage_error(const std::string &what) {
    std::fprintf(stderr, "wsync: %s\n", what.c_str());
    std::exit(2);
}
void check(wsync_status_t st, const char *what) {
    if (st != WSYNC_OK)
        die(std::string(what) + ": " + wsync_status_string(st) + ": " + wsync_last_error());
}

// --- options --------------------------------------------------------------------------------
struct Args {
    uint64_t size_mb = 1024;
    uint32_t receivers = 2;
    uint32_t steps = 5;
    bool checksum = true;
    bool checksum_compare = true;  // bench: run with checksums off and on
    uint64_t chunk_mb = 64;
    uint64_t bucket_mb = 0;  // 0: derived from the plan
    uint32_t buckets = 3;
    int64_t timeout_ms = 60000;
    bool json = false;
    bool quiet = false;
    // bench --strategy cuda_ipc
    std::string strategy = "shm";
    bool packed = true;
    std::string dtype = "bfloat16";
    bool size_set = false, buckets_set = false;
    // Where engines' parameters start past a page boundary: 64 is how PyTorch's CPU allocator
    // (posix_memalign(64)) places large tensors; 0 is page-aligned, the flattering case.
    uint64_t dst_offset = 64;
    bool load_copy = true;   // engines load with wsync_recv_copy (else next + memcpy)
    bool copy_bench = true;  // bench: the receiver copy loop against memcpy, in process
};

uint64_t parse_uint(const std::string &flag, const char *v, uint64_t lo, uint64_t hi) {
    if (!v) usage_error(flag + " needs a value");
    char *end = nullptr;
    errno = 0;
    unsigned long long x = std::strtoull(v, &end, 10);
    if (errno || !*v || *end || x < lo || x > hi)
 usage_error(flag + ": '" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]");
    return x;
}

Args parse_args(int argc, char **argv, int first, bool bench) {
    Args a;
    if (bench) {
        a.size_mb = 2048;
        a.receivers = 1;
    }
    for (int i = first; i < argc; ++i) {
        std::string f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (f == "--size-mb") a.size_mb = parse_uint(f, v, 1, 1 << 20), a.size_set = true, ++i;
        else if (f == "--size-gb" && bench)
            a.size_mb = parse_uint(f, v, 1, 1024) << 10, a.size_set = true, ++i;
        else if (f == "--strategy" && bench) {
            if (!v || (std::strcmp(v, "shm") && std::strcmp(v, "cuda_ipc")))
                usage_error("--strategy takes shm or cuda_ipc");
            a.strategy = v, ++i;
        } else if (f == "--packed" && bench) {
            if (!v || (std::strcmp(v, "true") && std::strcmp(v, "false")))
                usage_error("--packed takes true or false");
            a.packed = std::strcmp(v, "true") == 0, ++i;
        } else if (f == "--dtype" && bench) {
            if (!v || (std::strcmp(v, "bfloat16") && std::strcmp(v, "float16")))
                usage_error("--dtype takes bfloat16 or float16");
            a.dtype = v, ++i;
        }
        else if (f == "--receivers") a.receivers = parse_uint(f, v, 1, 64), ++i;
        else if (f == "--steps") a.steps = parse_uint(f, v, 2, 1000), ++i;
        else if (f == "--chunk-mb") a.chunk_mb = parse_uint(f, v, 1, 1 << 16), ++i;
        else if (f == "--bucket-mb") a.bucket_mb = parse_uint(f, v, 1, 1 << 16), ++i;
        else if (f == "--buckets") a.buckets = parse_uint(f, v, 1, 64), a.buckets_set = true, ++i;
        else if (f == "--timeout-ms") a.timeout_ms = parse_uint(f, v, 1, 1ull << 40), ++i;
        else if (f == "--no-checksum") a.checksum = false, a.checksum_compare = false;
        else if (f == "--json" && bench) a.json = true;
        else if (f == "--no-checksum-compare" && bench) a.checksum_compare = false;
        else if (f == "--dst-offset") a.dst_offset = parse_uint(f, v, 0, 4095), ++i;
        else if (f == "--load") {
            if (!v || (std::strcmp(v, "copy") && std::strcmp(v, "memcpy")))
                usage_error("--load takes copy or memcpy");
            a.load_copy = std::strcmp(v, "copy") == 0, ++i;
        } else if (f == "--no-copy-bench" && bench) a.copy_bench = false;
        else usage_error("unknown option '" + f + "' (see: wsync help)");
    }
    return a;
}

// --- the synthetic model ----------------------------------------------------------------------
struct TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t bytes;
};

// A Llama-shaped model of about `bytes` in bf16: embeddings, per layer q/k/v/o and gate/up/down
// projections and two norms, a final norm and lm_head. Dimensions shrink for small sizes.
std::vector<TensorSpec> make_model(uint64_t bytes) {
    int64_t vocab = bytes >= (uint64_t(512) << 20) ? 32000 : 4096;
    int64_t h = 4096;
    auto layer_bytes = [](int64_t hh) {
        int64_t inter = (hh * 11 / 4 + 63) / 64 * 64;
        return uint64_t(4 * hh * hh + 3 * hh * inter + 2 * hh) * 2;
    };
    while (h > 64 && uint64_t(2 * vocab * h * 2) + layer_bytes(h) > bytes) h /= 2;
    int64_t inter = (h * 11 / 4 + 63) / 64 * 64;
    uint64_t fixed = uint64_t(2 * vocab * h + h) * 2;
    // Rounded, so the model lands within half a layer of the size asked for.
    int64_t layers =
        bytes > fixed ? std::max<int64_t>(1, int64_t((bytes - fixed + layer_bytes(h) / 2) / layer_bytes(h))) : 1;
    std::vector<TensorSpec> m;
    auto add = [&](std::string name, std::vector<int64_t> shape) {
        uint64_t n = 2;
        for (int64_t d : shape) n *= uint64_t(d);
        m.push_back({std::move(name), std::move(shape), n});
    };
    add("model.embed_tokens.weight", {vocab, h});
    for (int64_t l = 0; l < layers; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {h});
        for (const char *proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
            add(p + "self_attn." + proj + ".weight", {h, h});
        add(p + "post_attention_layernorm.weight", {h});
        add(p + "mlp.gate_proj.weight", {inter, h});
        add(p + "mlp.up_proj.weight", {inter, h});
        add(p + "mlp.down_proj.weight", {h, inter});
    }
    add("model.norm.weight", {h});
    add("lm_head.weight", {vocab, h});
    return m;
}

inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Tensor t's bytes at `step`: every 8-byte word changes every step. Engines regenerate the same
// to verify what arrived, independently of the library.
void fill(uint8_t *p, uint64_t n, uint64_t step, uint64_t t) {
    uint64_t seed = mix(step * 0x100000001b3ull ^ t);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = seed ^ (i * 0x9e3779b97f4a7c15ull);
        std::memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = static_cast<uint8_t>(seed >> (8 * (i & 7)));
}
bool verify(const uint8_t *p, uint64_t n, uint64_t step, uint64_t t) {
    uint64_t seed = mix(step * 0x100000001b3ull ^ t);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = seed ^ (i * 0x9e3779b97f4a7c15ull), got;
        std::memcpy(&got, p + i, 8);
        if (got != v) return false;
    }
    for (; i < n; ++i)
        if (p[i] != static_cast<uint8_t>(seed >> (8 * (i & 7)))) return false;
    return true;
}

// Pre-faulted buffers, one per tensor: first-touch costs belong to nobody's sync time.
std::vector<std::vector<uint8_t>> allocate(const std::vector<TensorSpec> &m) {
    std::vector<std::vector<uint8_t>> b(m.size());
    for (size_t i = 0; i < m.size(); ++i) b[i].assign(m[i].bytes, 0);
    return b;
}

// Pre-faulted destinations as an engine's allocator places them: each tensor at `offset` bytes
// past a page boundary (PyTorch's large CPU tensors: 64).
struct Params {
    uint8_t *base = nullptr;
    std::vector<uint8_t *> at;
    Params(const std::vector<TensorSpec> &m, uint64_t offset) {
        uint64_t total = 0;
        for (const auto &t : m) total += (t.bytes + offset + 4095) / 4096 * 4096;
        base = static_cast<uint8_t *>(std::aligned_alloc(4096, total));
        if (!base) die("out of memory for engine parameters");
        std::memset(base, 0, total);
        uint64_t off = 0;
        for (const auto &t : m) {
            at.push_back(base + off + offset);
            off += (t.bytes + offset + 4095) / 4096 * 4096;
        }
    }
    ~Params() { std::free(base); }
    Params(const Params &) = delete;
    Params &operator=(const Params &) = delete;
};

// --- frames over pipes ------------------------------------------------------------------------
enum Frame : uint32_t { kInit = 1, kRequest, kStepEnd, kQuit, kReady, kStepOk, kStepFail };

bool write_all(int fd, const void *p, size_t n) {
    const char *c = static_cast<const char *>(p);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= size_t(w);
    }
    return true;
}
bool read_all(int fd, void *p, size_t n, int timeout_ms) {
    char *c = static_cast<char *>(p);
    while (n) {
        pollfd pfd{fd, POLLIN, 0};
        int r = poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t got = read(fd, c, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        c += got;
        n -= size_t(got);
    }
    return true;
}
bool send_frame(int fd, uint32_t type, const void *p, uint64_t n) {
    uint64_t hdr[2] = {type, n};
    return write_all(fd, hdr, sizeof hdr) && (n == 0 || write_all(fd, p, n));
}
bool recv_frame(int fd, uint32_t *type, std::vector<uint8_t> *payload, int timeout_ms) {
    uint64_t hdr[2];
    if (!read_all(fd, hdr, sizeof hdr, timeout_ms) || hdr[1] > (uint64_t(1) << 30)) return false;
    *type = uint32_t(hdr[0]);
    payload->resize(hdr[1]);
    return hdr[1] == 0 || read_all(fd, payload->data(), hdr[1], timeout_ms);
}

struct StepReport {
    uint64_t step, completed_version;
    double load_s;
};

// --- an engine process ------------------------------------------------------------------------
int engine_main(uint32_t index, int in, int out, const std::vector<TensorSpec> &model,
                int timeout_ms, const Args &a) {
    auto fail = [&](const std::string &msg) {
        send_frame(out, kStepFail, msg.data(), msg.size());
        return 1;
    };
    std::unordered_map<std::string, size_t> by_name;
    for (size_t i = 0; i < model.size(); ++i) by_name[model[i].name] = i;
    Params params(model, a.dst_offset);
    uint32_t type;
    std::vector<uint8_t> frame;
    if (!recv_frame(in, &type, &frame, timeout_ms) || type != kInit) return fail("no init info");
    wsync_strategy_t *strategy;
    wsync_receiver_t *receiver;
    if (wsync_strategy_create("shm", nullptr, &strategy) != WSYNC_OK ||
        wsync_receiver_create(strategy, frame.data(), frame.size(), index, &receiver) != WSYNC_OK)
        return fail(wsync_last_error());
    send_frame(out, kReady, nullptr, 0);
    double load_s = 0;
    for (;;) {
        if (!recv_frame(in, &type, &frame, timeout_ms)) return fail("controller went silent");
        if (type == kQuit) break;
        if (type == kRequest) {
            auto t0 = Clock::now();
            wsync_recv_t *it;
            if (wsync_receiver_receive(receiver, frame.data(), frame.size(), &it) != WSYNC_OK)
                return fail(wsync_last_error());
            wsync_recv_info_t info{};
            info.struct_size = sizeof info;
            wsync_recv_info(it, &info);
            for (size_t i = 0; i < info.count; ++i) {
                wsync_tensor_t v;
                bool has = true;
                if (a.load_copy ? wsync_recv_peek(it, i, &v) : wsync_recv_next(it, &v, &has))
                    break;  // wsync_recv_end reports it
                auto p = by_name.find(v.name);
                if (p == by_name.end()) {
                    wsync_recv_end(it);
                    return fail(std::string("unexpected tensor '") + v.name + "'");
                }
                // The load an engine does anyway: the tensor into its own parameter.
                if (a.load_copy) {
                    if (wsync_recv_copy(it, i, 0, params.at[p->second], model[p->second].bytes))
                        break;
                } else {
                    std::memcpy(params.at[p->second], v.data, model[p->second].bytes);
                }
            }
            if (wsync_recv_end(it) != WSYNC_OK) return fail(wsync_last_error());
            load_s += since(t0);
        } else if (type == kStepEnd) {
            uint64_t step;
            std::memcpy(&step, frame.data(), 8);
            for (size_t i = 0; i < model.size(); ++i)
                if (!verify(params.at[i], model[i].bytes, step, i))
                    return fail("engine " + std::to_string(index) + ": tensor '" + model[i].name +
                                "' differs from the trainer's at step " + std::to_string(step));
            StepReport r{step, 0, load_s};
            wsync_receiver_completed_version(receiver, &r.completed_version);
            send_frame(out, kStepOk, &r, sizeof r);
            load_s = 0;
        }
    }
    wsync_receiver_destroy(receiver);
    wsync_strategy_destroy(strategy);
    return 0;
}

// --- the trainer and controller ---------------------------------------------------------------
struct RunResult {
    uint64_t bytes = 0;
    size_t tensors = 0, chunks = 0;
    std::vector<double> step_s;
    double memcpy_s = 0;         // one core, page-aligned destination
    double memcpy_offset_s = 0;  // one core, destination at the engines' --dst-offset
    double steady_s() const {
        std::vector<double> s(step_s.begin() + 1, step_s.end());
        std::sort(s.begin(), s.end());
        return s.empty() ? step_s[0] : s[s.size() / 2];
    }
};

RunResult run_sync(const Args &a, bool checksum, bool progress) {
    const auto model = make_model(a.size_mb << 20);
    const int poll_ms = int(std::min<int64_t>(a.timeout_ms + 5000, INT32_MAX));
    std::vector<pid_t> pids(a.receivers);
    std::vector<int> to(a.receivers), from(a.receivers);
    for (uint32_t i = 0; i < a.receivers; ++i) {
        int p1[2], p2[2];
        if (pipe(p1) || pipe(p2)) die("pipe failed");
        pids[i] = fork();
        if (pids[i] < 0) die("fork failed");
        if (pids[i] == 0) {
            close(p1[1]);
            close(p2[0]);
            std::_Exit(engine_main(i, p1[0], p2[1], model, poll_ms, a));
        }
        close(p1[0]);
        close(p2[1]);
        to[i] = p1[1];
        from[i] = p2[0];
    }
    signal(SIGPIPE, SIG_IGN);  // a dead engine shows up as a failed write and a named error
    auto expect = [&](uint32_t i, uint32_t want, std::vector<uint8_t> *payload) {
        uint32_t type;
        if (!recv_frame(from[i], &type, payload, poll_ms))
            die("engine " + std::to_string(i) + " stopped answering (exited or hung)");
        if (type == kStepFail)
            die("engine " + std::to_string(i) + " failed: " +
                std::string(payload->begin(), payload->end()));
        if (type != want) die("engine " + std::to_string(i) + " sent an unexpected frame");
    };

    RunResult r;
    r.tensors = model.size();
    std::vector<wsync_tensor_t> desc(model.size());
    auto weights = allocate(model);
    uint64_t largest = 0;
    for (size_t i = 0; i < model.size(); ++i) {
        r.bytes += model[i].bytes;
        largest = std::max(largest, model[i].bytes);
        desc[i] = wsync_tensor_t{};
        desc[i].name = model[i].name.c_str();
        desc[i].data = weights[i].data();
        desc[i].shape = model[i].shape.data();
        desc[i].ndim = int32_t(model[i].shape.size());
        desc[i].dtype = {WSYNC_DTYPE_BFLOAT, 16, 1};
        desc[i].device = {WSYNC_DEVICE_CPU, 0};
    }
    uint64_t chunk_bytes = std::max(a.chunk_mb << 20, (largest + 255) / 256 * 256);
    uint64_t bucket = a.bucket_mb ? a.bucket_mb << 20 : chunk_bytes;
    bucket = (bucket + 4095) / 4096 * 4096;

    wsync_plan_t *plan;
    std::string plan_opts = "{\"chunk_bytes\": " + std::to_string(chunk_bytes) + "}";
    check(wsync_plan_create(desc.data(), desc.size(), plan_opts.c_str(), &plan), "plan");
    check(wsync_plan_chunk_count(plan, &r.chunks), "plan");
    std::vector<std::vector<wsync_tensor_t>> chunks(r.chunks);
    for (size_t c = 0; c < r.chunks; ++c) {
        const size_t *idx;
        size_t n;
        check(wsync_plan_chunk(plan, c, &idx, &n, nullptr), "plan");
        for (size_t k = 0; k < n; ++k) chunks[c].push_back(desc[idx[k]]);
    }
    wsync_plan_destroy(plan);

    std::string opts = "{\"receivers\": " + std::to_string(a.receivers) +
                       ", \"buckets\": " + std::to_string(a.buckets) +
                       ", \"bucket_bytes\": " + std::to_string(bucket) +
                       ", \"checksum\": " + (checksum ? "true" : "false") +
                       ", \"timeout_ms\": " + std::to_string(a.timeout_ms) + "}";
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    check(wsync_strategy_create("shm", opts.c_str(), &strategy), "strategy");
    check(wsync_strategy_create_init_info(strategy, &init), "init info");
    check(wsync_sender_create(strategy, init.data, init.size, &sender), "sender");
    std::vector<uint8_t> payload;
    for (uint32_t i = 0; i < a.receivers; ++i)
        if (!send_frame(to[i], kInit, init.data, init.size)) die("engine pipe closed");
    for (uint32_t i = 0; i < a.receivers; ++i) expect(i, kReady, &payload);

    if (progress)
        std::printf("model: %.1f MB bf16, %zu tensors, %zu chunks (<= %.0f MB), %u engine(s), "
                    "buckets %u x %.0f MB, checksums %s\n",
                    r.bytes / 1e6, r.tensors, r.chunks, chunk_bytes / 1048576.0, a.receivers,
                    a.buckets, bucket / 1048576.0, checksum ? "on" : "off");
    for (uint64_t step = 1; step <= a.steps; ++step) {
        for (size_t i = 0; i < model.size(); ++i) fill(weights[i].data(), model[i].bytes, step, i);
        auto t0 = Clock::now();
        for (size_t c = 0; c < chunks.size(); ++c) {
            wsync_chunk_t ch{chunks[c].data(), chunks[c].size(),
                             c + 1 == chunks.size() ? WSYNC_CHUNK_LAST : 0u, 0};
            wsync_blob_t req;
            check(wsync_sender_send_chunk(sender, &ch, &req), "send_chunk");
            for (uint32_t i = 0; i < a.receivers; ++i)
                if (!send_frame(to[i], kRequest, req.data, req.size))
                    die("engine " + std::to_string(i) + " is gone");
            wsync_blob_free(&req);
        }
        check(wsync_sender_flush(sender, a.timeout_ms), "flush");
        double s = since(t0);
        r.step_s.push_back(s);
        for (uint32_t i = 0; i < a.receivers; ++i) send_frame(to[i], kStepEnd, &step, 8);
        for (uint32_t i = 0; i < a.receivers; ++i) {
            expect(i, kStepOk, &payload);
            StepReport rep;
            std::memcpy(&rep, payload.data(), sizeof rep);
            if (rep.completed_version != step)
                die("engine " + std::to_string(i) + " completed version " +
                    std::to_string(rep.completed_version) + ", expected " + std::to_string(step));
        }
        if (progress)
            std::printf("step %" PRIu64 ": %.3f s  %.2f GB/s  verified by %u engine(s)%s\n", step,
                        s, r.bytes / s / 1e9, a.receivers, step == 1 ? "  (first sync)" : "");
        std::fflush(stdout);
    }
    for (uint32_t i = 0; i < a.receivers; ++i) {
        send_frame(to[i], kQuit, nullptr, 0);
        close(to[i]);
    }
    for (uint32_t i = 0; i < a.receivers; ++i) {
        int status = 0;
        waitpid(pids[i], &status, 0);
        close(from[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            die("engine " + std::to_string(i) + " exited abnormally");
    }
    wsync_sender_destroy(sender);
    wsync_strategy_destroy(strategy);
    wsync_blob_free(&init);

    // The baseline, same bytes, same run: one core copying the model into warm buffers, with
    // glibc memcpy, page-aligned and at the engines' offset.
    for (uint64_t offset : {uint64_t(0), a.dst_offset}) {
        Params dst(model, offset);
        double best = 1e9;
        for (int rep = 0; rep < 3; ++rep) {
            auto t0 = Clock::now();
            for (size_t i = 0; i < model.size(); ++i)
                std::memcpy(dst.at[i], weights[i].data(), model[i].bytes);
            best = std::min(best, since(t0));
        }
        (offset == 0 ? r.memcpy_s : r.memcpy_offset_s) = best;
    }
    if (a.dst_offset == 0) r.memcpy_offset_s = r.memcpy_s;
    return r;
}

// Plan + request encode + decode per tensor, over 10,000 tiny tensors, in one process.
double metadata_us_per_tensor() {
    const size_t n = 10000;
    std::vector<std::string> names(n);
    std::vector<float> data(n * 4, 1.0f);
    int64_t shape[1] = {4};
    std::vector<wsync_tensor_t> t(n);
    for (size_t i = 0; i < n; ++i) {
        names[i] = "model.layers." + std::to_string(i / 10) + ".block.t" + std::to_string(i % 10) +
                   ".weight";
        t[i] = wsync_tensor_t{};
        t[i].name = names[i].c_str();
        t[i].data = &data[i * 4];
        t[i].shape = shape;
        t[i].ndim = 1;
        t[i].dtype = {WSYNC_DTYPE_FLOAT, 32, 1};
        t[i].device = {WSYNC_DEVICE_CPU, 0};
    }
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    wsync_receiver_t *rx;
    check(wsync_strategy_create("shm", "{\"checksum\": false, \"bucket_bytes\": 4194304}", &s), "meta");
    check(wsync_strategy_create_init_info(s, &init), "meta");
    check(wsync_sender_create(s, init.data, init.size, &tx), "meta");
    check(wsync_receiver_create(s, init.data, init.size, 0, &rx), "meta");
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
        auto t0 = Clock::now();
        wsync_plan_t *plan;
        check(wsync_plan_create(t.data(), n, "{\"chunk_bytes\": 4194304}", &plan), "meta plan");
        wsync_plan_destroy(plan);
        wsync_chunk_t c{t.data(), n, WSYNC_CHUNK_LAST, 0};
        wsync_blob_t req;
        check(wsync_sender_send_chunk(tx, &c, &req), "meta send");
        wsync_recv_t *it;
        check(wsync_receiver_receive(rx, req.data, req.size, &it), "meta receive");
        wsync_tensor_t v;
        bool has = true;
        while (has) check(wsync_recv_next(it, &v, &has), "meta next");
        check(wsync_recv_end(it), "meta end");
        best = std::min(best, since(t0));
        wsync_blob_free(&req);
    }
    wsync_receiver_destroy(rx);
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    return best / n * 1e6;
}

int cmd_demo(const Args &a) {
    RunResult r = run_sync(a, a.checksum, true);
    double steady = r.steady_s();
    std::printf("\n%-28s %s\n", "", "shm sync");
    std::printf("%-28s %.1f MB (%zu tensors, %zu chunks)\n", "model bytes", r.bytes / 1e6,
                r.tensors, r.chunks);
    std::printf("%-28s %u\n", "engines", a.receivers);
    std::printf("%-28s %s\n", "checksums", a.checksum ? "on (xxh3)" : "off");
    std::printf("%-28s %.3f s\n", "first sync", r.step_s[0]);
    std::printf("%-28s %.3f s\n", "steady-state sync (median)", steady);
    std::printf("%-28s %.2f GB/s\n", "steady-state throughput", r.bytes / steady / 1e9);
    std::printf("%-28s %.3f s (%.2f GB/s)\n", "one-core memcpy, same bytes", r.memcpy_s,
                r.bytes / r.memcpy_s / 1e9);
    std::printf("%-28s %.2fx\n", "sync / memcpy", steady / r.memcpy_s);
    std::printf("\nevery engine verified every tensor at every step: OK\n");
    return 0;
}

// --- bench --strategy cuda_ipc ------------------------------------------------------------------
// The CUDA driver is opened at run time (WSYNC_CUDA_LIBRARY, else libcuda.so.1); the tool does
// not link it. Only functions that the CI fake driver (tests/fake_gpu) implements are used, so
// the bench can be smoke-tested without a GPU.
namespace cu {
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void *;
using CUstream = void *;
struct Api {
    std::string path;
    CUresult (*Init)(unsigned int);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)();
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
};
Api api;

// Opens the driver and resolves the symbols, without calling into it (so fork stays safe).
// On failure: exit 2 with a message naming the library.
void load() {
    const char *env = std::getenv("WSYNC_CUDA_LIBRARY");
    api.path = env && *env ? env : "libcuda.so.1";
    void *h = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        std::fprintf(stderr, "wsync bench: cannot load the CUDA driver '%s' (%s); set "
                     "WSYNC_CUDA_LIBRARY or run on a machine with a GPU\n",
                     api.path.c_str(), e ? e : "unknown error");
        std::exit(2);
    }
    auto sym = [&](const char *name, auto *fn) {
        void *p = dlsym(h, name);
        if (!p) {
            std::fprintf(stderr, "wsync bench: the CUDA driver '%s' lacks %s\n", api.path.c_str(),
                         name);
            std::exit(2);
        }
        *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
    };
    sym("cuInit", &api.Init);
    sym("cuGetErrorName", &api.GetErrorName);
    sym("cuDeviceGet", &api.DeviceGet);
    sym("cuDevicePrimaryCtxRetain", &api.DevicePrimaryCtxRetain);
    sym("cuCtxSetCurrent", &api.CtxSetCurrent);
    sym("cuCtxSynchronize", &api.CtxSynchronize);
    sym("cuMemAlloc_v2", &api.MemAlloc);
    sym("cuMemFree_v2", &api.MemFree);
    sym("cuMemcpyHtoDAsync_v2", &api.MemcpyHtoDAsync);
    sym("cuMemcpyDtoDAsync_v2", &api.MemcpyDtoDAsync);
}
std::string error(CUresult r, const char *what) {
    const char *name = nullptr;
    if (api.GetErrorName(r, &name) != 0 || !name) name = "unknown CUDA error";
    return std::string(what) + " failed: " + name + " (" + std::to_string(r) + ")";
}
// Throws the message: the caller decides whether that is die() or an engine failure frame.
void ok(CUresult r, const char *what) {
    if (r != 0) throw std::runtime_error(error(r, what));
}
// cuInit + the primary context of device 0, current on this thread.
void start_device0() {
    CUresult r = api.Init(0);
    if (r != 0) {
        std::fprintf(stderr, "wsync bench: %s (driver '%s')\n", error(r, "cuInit").c_str(),
                     api.path.c_str());
        std::exit(2);
    }
    CUdevice dev;
    CUcontext ctx;
    ok(api.DeviceGet(&dev, 0), "cuDeviceGet(0)");
    ok(api.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    ok(api.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}
std::vector<CUdeviceptr> alloc_each(const std::vector<TensorSpec> &m) {
    std::vector<CUdeviceptr> p(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i) ok(api.MemAlloc(&p[i], m[i].bytes), "cuMemAlloc_v2");
    return p;
}
void free_each(std::vector<CUdeviceptr> &p) {
    for (CUdeviceptr d : p)
        if (d) api.MemFree(d);
    p.clear();
}
}  // namespace cu

int gpu_engine_main(int in, int out, const std::vector<TensorSpec> &model, int timeout_ms) {
    auto fail = [&](const std::string &msg) {
        send_frame(out, kStepFail, msg.data(), msg.size());
        return 1;
    };
    try {
        std::unordered_map<std::string, size_t> by_name;
        for (size_t i = 0; i < model.size(); ++i) by_name[model[i].name] = i;
        uint32_t type;
        std::vector<uint8_t> frame;
        if (!recv_frame(in, &type, &frame, timeout_ms) || type != kInit) return fail("no init info");
        cu::start_device0();
        auto params = cu::alloc_each(model);  // the engine's own parameters, pre-allocated
        wsync_strategy_t *strategy;
        wsync_receiver_t *receiver;
        if (wsync_strategy_create("cuda_ipc", "{\"device\": 0}", &strategy) != WSYNC_OK ||
            wsync_receiver_create(strategy, frame.data(), frame.size(), 0, &receiver) != WSYNC_OK)
            return fail(wsync_last_error());
        send_frame(out, kReady, nullptr, 0);
        uint64_t views = 0;
        for (;;) {
            if (!recv_frame(in, &type, &frame, timeout_ms)) return fail("controller went silent");
            if (type == kQuit) break;
            if (type == kRequest) {
                wsync_recv_t *it;
                if (wsync_receiver_receive(receiver, frame.data(), frame.size(), &it) != WSYNC_OK)
                    return fail(wsync_last_error());
                wsync_tensor_t v;
                bool has = false;
                while (wsync_recv_next(it, &v, &has) == WSYNC_OK && has) {
                    auto p = by_name.find(v.name);
                    if (p == by_name.end()) {
                        wsync_recv_end(it);
                        return fail(std::string("unexpected tensor '") + v.name + "'");
                    }
                    // The load an engine does anyway: copy the view into its own parameter.
                    cu::ok(cu::api.MemcpyDtoDAsync(params[p->second],
                                                   reinterpret_cast<cu::CUdeviceptr>(v.data),
                                                   model[p->second].bytes, nullptr),
                           "cuMemcpyDtoDAsync_v2");
                    ++views;
                }
                cu::ok(cu::api.CtxSynchronize(), "cuCtxSynchronize");
                if (wsync_recv_end(it) != WSYNC_OK) return fail(wsync_last_error());
            } else if (type == kStepEnd) {
                uint64_t step;
                std::memcpy(&step, frame.data(), 8);
                if (views != model.size())
                    return fail("step " + std::to_string(step) + ": received " +
                                std::to_string(views) + " views, expected " +
                                std::to_string(model.size()));
                views = 0;
                StepReport r{step, 0, 0};
                wsync_receiver_completed_version(receiver, &r.completed_version);
                send_frame(out, kStepOk, &r, sizeof r);
            }
        }
        wsync_receiver_destroy(receiver);
        wsync_strategy_destroy(strategy);
        cu::free_each(params);
    } catch (const std::exception &e) {
        return fail(e.what());
    }
    return 0;
}

int cmd_bench_cuda_ipc(Args a) {
    if (!a.size_set) a.size_mb = 16 << 10;  // an 8B-parameter model in bf16
    cu::load();                             // dlopen only: no CUDA call before fork
    const auto model = make_model(a.size_mb << 20);
    const int poll_ms = int(std::min<int64_t>(a.timeout_ms + 5000, INT32_MAX));
    uint64_t total = 0, largest = 0;
    for (const auto &t : model) total += t.bytes, largest = std::max(largest, t.bytes);
    // Bucket = chunk: 1 GiB unless --bucket-mb, never below the largest tensor nor above the model.
    uint64_t bucket = a.bucket_mb ? a.bucket_mb << 20 : uint64_t(1) << 30;
    bucket = std::min(bucket, (total + 4095) / 4096 * 4096);
    bucket = std::max(bucket, (largest + 4095) / 4096 * 4096);
    bucket = (bucket + 4095) / 4096 * 4096;
    const uint32_t buckets = a.buckets_set ? a.buckets : 2;

    int p1[2], p2[2];
    if (pipe(p1) || pipe(p2)) die("pipe failed");
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
        close(p1[1]);
        close(p2[0]);
        std::_Exit(gpu_engine_main(p1[0], p2[1], model, poll_ms));
    }
    close(p1[0]);
    close(p2[1]);
    const int to = p1[1], from = p2[0];
    signal(SIGPIPE, SIG_IGN);
    auto expect = [&](uint32_t want, std::vector<uint8_t> *payload) {
        uint32_t type;
        if (!recv_frame(from, &type, payload, poll_ms))
            die("engine stopped answering (exited or hung)");
        if (type == kStepFail)
            die("engine failed: " + std::string(payload->begin(), payload->end()));
        if (type != want) die("engine sent an unexpected frame");
    };

    RunResult r;
    r.tensors = model.size();
    r.bytes = total;
    std::vector<cu::CUdeviceptr> weights;
    try {
        cu::start_device0();
        weights = cu::alloc_each(model);  // one allocation per tensor, as a trainer has
        std::vector<uint8_t> host(largest);
        for (size_t i = 0; i < model.size(); ++i) {
            fill(host.data(), model[i].bytes, 1, i);
            cu::ok(cu::api.MemcpyHtoDAsync(weights[i], host.data(), model[i].bytes, nullptr),
                   "cuMemcpyHtoDAsync_v2");
            cu::ok(cu::api.CtxSynchronize(), "cuCtxSynchronize");
        }
    } catch (const std::exception &e) {
        die(e.what());
    }
    const wsync_dtype_t dt = a.dtype == "float16" ? wsync_dtype_t{WSYNC_DTYPE_FLOAT, 16, 1}
                                                  : wsync_dtype_t{WSYNC_DTYPE_BFLOAT, 16, 1};
    std::vector<wsync_tensor_t> desc(model.size());
    for (size_t i = 0; i < model.size(); ++i) {
        desc[i] = wsync_tensor_t{};
        desc[i].name = model[i].name.c_str();
        desc[i].data = reinterpret_cast<void *>(weights[i]);
        desc[i].shape = model[i].shape.data();
        desc[i].ndim = int32_t(model[i].shape.size());
        desc[i].dtype = dt;
        desc[i].device = {WSYNC_DEVICE_CUDA, 0};
    }
    auto tp = Clock::now();
    wsync_plan_t *plan;
    std::string plan_opts = "{\"chunk_bytes\": " + std::to_string(bucket) + "}";
    check(wsync_plan_create(desc.data(), desc.size(), plan_opts.c_str(), &plan), "plan");
    check(wsync_plan_chunk_count(plan, &r.chunks), "plan");
    std::vector<std::vector<wsync_tensor_t>> chunks(r.chunks);
    for (size_t c = 0; c < r.chunks; ++c) {
        const size_t *idx;
        size_t n;
        check(wsync_plan_chunk(plan, c, &idx, &n, nullptr), "plan");
        for (size_t k = 0; k < n; ++k) chunks[c].push_back(desc[idx[k]]);
    }
    wsync_plan_destroy(plan);
    const double plan_s = since(tp);

    std::string opts = std::string("{\"receivers\": 1, \"packed\": ") +
                       (a.packed ? "true" : "false") + ", \"buckets\": " + std::to_string(buckets) +
                       ", \"bucket_bytes\": " + std::to_string(bucket) +
                       ", \"timeout_ms\": " + std::to_string(a.timeout_ms) + "}";
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    check(wsync_strategy_create("cuda_ipc", opts.c_str(), &strategy), "strategy cuda_ipc");
    check(wsync_strategy_create_init_info(strategy, &init), "init info");
    check(wsync_sender_create(strategy, init.data, init.size, &sender), "sender");
    std::vector<uint8_t> payload;
    if (!send_frame(to, kInit, init.data, init.size)) die("engine pipe closed");
    expect(kReady, &payload);
    if (!a.json)
        std::printf("model: %.2f GB %s on GPU 0 (%zu tensors, one allocation each), %zu chunks "
                    "(<= %.0f MB), cuda_ipc packed=%s, %u bucket(s), driver %s\n",
                    r.bytes / 1e9, a.dtype.c_str(), r.tensors, r.chunks, bucket / 1048576.0,
                    a.packed ? "true" : "false", buckets, cu::api.path.c_str());
    for (uint64_t step = 1; step <= a.steps; ++step) {
        auto t0 = Clock::now();
        for (size_t c = 0; c < chunks.size(); ++c) {
            wsync_chunk_t ch{chunks[c].data(), chunks[c].size(),
                             c + 1 == chunks.size() ? WSYNC_CHUNK_LAST : 0u, 0};
            wsync_blob_t req;
            check(wsync_sender_send_chunk(sender, &ch, &req), "send_chunk");
            if (!send_frame(to, kRequest, req.data, req.size)) die("engine is gone");
            wsync_blob_free(&req);
        }
        check(wsync_sender_flush(sender, a.timeout_ms), "flush");
        double s = since(t0);
        r.step_s.push_back(s);
        send_frame(to, kStepEnd, &step, 8);
        expect(kStepOk, &payload);
        StepReport rep;
        std::memcpy(&rep, payload.data(), sizeof rep);
        if (rep.completed_version != step)
            die("engine completed version " + std::to_string(rep.completed_version) +
                ", expected " + std::to_string(step));
        if (!a.json)
            std::printf("step %" PRIu64 ": %.4f s  %.1f GB/s%s\n", step, s, r.bytes / s / 1e9,
                        step == 1 ? "  (first sync)" : "");
        std::fflush(stdout);
    }
    send_frame(to, kQuit, nullptr, 0);
    close(to);
    int status = 0;
    waitpid(pid, &status, 0);
    close(from);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("engine exited abnormally");
    wsync_sender_destroy(sender);
    wsync_strategy_destroy(strategy);
    wsync_blob_free(&init);
    cu::free_each(weights);

    // The baseline, same bytes, same run: one device-to-device copy of one buffer, median of 3.
    double d2d = 0;
    try {
        cu::CUdeviceptr src = 0, dst = 0;
        cu::ok(cu::api.MemAlloc(&src, r.bytes), "cuMemAlloc_v2 (baseline source)");
        cu::ok(cu::api.MemAlloc(&dst, r.bytes), "cuMemAlloc_v2 (baseline destination)");
        std::vector<double> t;
        for (int rep = 0; rep < 4; ++rep) {  // the first is a warm-up
            auto t0 = Clock::now();
            cu::ok(cu::api.MemcpyDtoDAsync(dst, src, r.bytes, nullptr), "cuMemcpyDtoDAsync_v2");
            cu::ok(cu::api.CtxSynchronize(), "cuCtxSynchronize");
            if (rep) t.push_back(since(t0));
        }
        std::sort(t.begin(), t.end());
        d2d = t[1];
        cu::api.MemFree(src);
        cu::api.MemFree(dst);
    } catch (const std::exception &e) {
        die(e.what());
    }
    const double meta = metadata_us_per_tensor();
    const double steady = r.steady_s(), ratio = steady / d2d;
    std::string steps;
    for (double s : r.step_s) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    if (a.json) {
        std::printf("{\"strategy\": \"cuda_ipc\", \"packed\": %s, \"dtype\": \"%s\", \"bytes\": %" PRIu64
                    ", \"tensors\": %zu, \"chunks\": %zu, \"bucket_bytes\": %" PRIu64
                    ", \"buckets\": %u, \"first_sync_s\": %.6f, \"steady_sync_s\": %.6f, "
                    "\"steady_gbps\": %.3f, \"baseline_d2d_s\": %.6f, \"ratio_to_d2d\": %.3f, "
                    "\"steps_s\": [%s], \"plan_us_per_tensor\": %.3f, "
                    "\"metadata_us_per_tensor\": %.3f}\n",
                    a.packed ? "true" : "false", a.dtype.c_str(), r.bytes, r.tensors, r.chunks,
                    bucket, buckets, r.step_s[0], steady, r.bytes / steady / 1e9, d2d, ratio,
                    steps.c_str(), plan_s / r.tensors * 1e6, meta);
    } else {
        std::printf("\n%-30s cuda_ipc packed=%s\n", "", a.packed ? "true" : "false");
        std::printf("%-30s %.2f GB (%zu tensors, %zu chunks)\n", "model bytes", r.bytes / 1e9,
                    r.tensors, r.chunks);
        std::printf("%-30s %.4f s\n", "first sync", r.step_s[0]);
        std::printf("%-30s %.4f s (%.1f GB/s)\n", "steady-state sync (median)", steady,
                    r.bytes / steady / 1e9);
        std::printf("%-30s %.4f s (%.1f GB/s)\n", "one D2D copy, same bytes", d2d,
                    r.bytes / d2d / 1e9);
        std::printf("%-30s %.2fx%s\n", "sync / D2D copy", ratio,
                    a.packed ? "" : (ratio <= 1.25 ? "  (target <= 1.25x: met)"
                                                   : "  (target <= 1.25x: MISSED)"));
        std::printf("%-30s %.3f us (plan %.3f us)\n", "metadata per tensor", meta,
                    plan_s / r.tensors * 1e6);
    }
    return 0;
}

int cmd_bench(const Args &a) {
    if (a.strategy == "cuda_ipc") return cmd_bench_cuda_ipc(a);
    // Engines' parameters at --dst-offset (64 by default, as PyTorch places them), and again
    // page-aligned, so the flattering case is reported beside the realistic one.
    RunResult r = run_sync(a, a.checksum && !a.checksum_compare, !a.json);
    RunResult rc;
    if (a.checksum_compare) rc = run_sync(a, true, false);
    RunResult rp;
    Args page = a;
    page.dst_offset = 0;
    if (a.dst_offset != 0) rp = run_sync(page, a.checksum && !a.checksum_compare, false);
    std::string copy_json;
    if (a.copy_bench) {
        const auto model = make_model(a.size_mb << 20);
        std::vector<uint64_t> sizes;
        for (const auto &t : model) sizes.push_back(t.bytes);
        copy_json = bench_copy_json(sizes, a.chunk_mb << 20, a.dst_offset, !a.json);
    }
    double meta = metadata_us_per_tensor();
    double steady = r.steady_s();
    std::string steps;
    for (double s : r.step_s) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    std::printf("{\"strategy\": \"shm\", \"bytes\": %" PRIu64 ", \"tensors\": %zu, \"chunks\": %zu, "
                "\"receivers\": %u, \"checksum\": %s, \"load\": \"%s\", \"dst_offset\": %" PRIu64
                ", \"first_sync_s\": %.6f, "
                "\"steady_sync_s\": %.6f, \"steady_gbps\": %.3f, \"memcpy_s\": %.6f, "
                "\"memcpy_at_dst_offset_s\": %.6f, "
                "\"ratio_to_memcpy\": %.3f, \"steps_s\": [%s], \"metadata_us_per_tensor\": %.3f",
                r.bytes, r.tensors, r.chunks, a.receivers,
                a.checksum && !a.checksum_compare ? "true" : "false",
                a.load_copy ? "copy" : "memcpy", a.dst_offset, r.step_s[0], steady,
                r.bytes / steady / 1e9, r.memcpy_s, r.memcpy_offset_s, steady / r.memcpy_s,
                steps.c_str(), meta);
    if (a.checksum_compare)
        std::printf(", \"checksum_on\": {\"steady_sync_s\": %.6f, \"ratio_to_memcpy\": %.3f, "
                    "\"extra_s\": %.6f, \"extra_fraction\": %.3f}",
                    rc.steady_s(), rc.steady_s() / r.memcpy_s, rc.steady_s() - steady,
                    rc.steady_s() / steady - 1);
    if (a.dst_offset != 0)
        std::printf(", \"page_aligned\": {\"steady_sync_s\": %.6f, \"ratio_to_memcpy\": %.3f}",
                    rp.steady_s(), rp.steady_s() / r.memcpy_s);
    if (!copy_json.empty()) std::printf(", \"copy\": %s", copy_json.c_str());
    std::printf("}\n");
    return 0;
}

int cmd_inspect(int argc, char **argv) {
    if (argc != 3) usage_error("usage: wsync inspect FILE   (FILE may be - for standard input)");
    FILE *f = std::strcmp(argv[2], "-") == 0 ? stdin : std::fopen(argv[2], "rb");
    if (!f) usage_error(std::string("cannot open '") + argv[2] + "': " + std::strerror(errno));
    std::vector<uint8_t> buf;
    uint8_t tmp[65536];
    size_t got;
    while ((got = std::fread(tmp, 1, sizeof tmp, f)) > 0) buf.insert(buf.end(), tmp, tmp + got);
    if (f != stdin) std::fclose(f);
    char *json = nullptr;
    wsync_status_t st = wsync_blob_describe(buf.data(), buf.size(), &json);
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "wsync inspect: %s: %s\n", wsync_status_string(st), wsync_last_error());
        return 2;
    }
    std::printf("%s\n", json);
    wsync_string_free(json);
    return 0;
}

void usage(FILE *out) {
    std::fprintf(out,
        "wsync %s: move model weights from trainers to inference engines\n\n"
        "usage:\n"
        "  wsync demo  [--size-mb N=1024] [--receivers N=2] [--steps N=5] [--no-checksum]\n"
        "              [--chunk-mb N=64] [--bucket-mb N] [--buckets N=3] [--timeout-ms N=60000]\n"
        "              [--dst-offset N=64] [--load copy|memcpy]\n"
        "      A trainer and N engine processes sync a synthetic Llama-shaped bf16 model for N\n"
        "      steps over shared memory; every engine verifies every tensor after every step.\n"
        "  wsync bench [same flags; --size-mb 2048 --receivers 1 by default] [--json]\n"
        "              [--no-checksum-compare]\n"
        "              [--dst-offset N=64] [--load copy|memcpy] [--no-copy-bench]\n"
        "      The same run printed as JSON, with checksums off and on, engines' parameters N bytes\n"
        "      past a page (64: as PyTorch allocates) and page-aligned; the receiver copy loop\n"
        "      (wsync_recv_copy) against glibc memcpy at both alignments, in one process; and the\n"
        "      metadata cost (plan + encode + decode) per tensor over 10,000 tensors.\n"
        "  wsync bench --strategy cuda_ipc [--packed true|false] [--dtype bfloat16|float16]\n"
        "              [--size-gb N=16 | --size-mb N] [--steps N=5] [--bucket-mb N=1024] [--json]\n"
        "      GPU 0 to GPU 0 between two processes through CUDA IPC, against one device copy of\n"
        "      the same bytes. Opens the driver at run time (WSYNC_CUDA_LIBRARY, else libcuda.so.1).\n"
        "  wsync inspect FILE|-     print an init-info or request blob as JSON (exit 2 if malformed)\n"
        "  wsync kinds              the strategies this build knows\n"
        "  wsync options KIND       a strategy's options\n"
        "  wsync --version | help\n",
        wsync_version_string());
}

}  // namespace

int main(int argc, char **argv) {
    if (wsync_version_number() / 10000 != WSYNC_VERSION_MAJOR)
        die("libwsync major version differs from the one wsync was built with");
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    std::string cmd = argv[1];
    char *json = nullptr;
    if (cmd == "demo") return cmd_demo(parse_args(argc, argv, 2, false));
    if (cmd == "bench") return cmd_bench(parse_args(argc, argv, 2, true));
    if (cmd == "inspect") return cmd_inspect(argc, argv);
    if (cmd == "kinds") {
        check(wsync_strategy_kinds(&json), "kinds");
    } else if (cmd == "options" && argc == 3) {
        wsync_status_t st = wsync_strategy_describe_options(argv[2], &json);
        if (st != WSYNC_OK) {
            std::fprintf(stderr, "wsync: %s\n", wsync_last_error());
            return 2;
        }
    } else if (cmd == "--version" || cmd == "version") {
        std::printf("wsync %s\n", wsync_version_string());
        return 0;
    } else if (cmd == "help" || cmd == "--help" || cmd == "-h") {
        usage(stdout);
        return 0;
    } else {
        std::fprintf(stderr, "wsync: unknown command '%s'\n\n", cmd.c_str());
        usage(stderr);
        return 2;
    }
    std::printf("%s\n", json);
    wsync_string_free(json);
    return 0;
}
