// wsync bench --delta-fraction: delta sync against dense over shm, in one run (docs/delta.md),
// laid out like `wsync bench`: the parent is the
// controller and the trainer, one forked engine per configuration copies every tensor into its
// own 64-byte aligned memory with wsync_recv_copy (the copy-into path, which applies patches).
//
//   wsync bench --delta-fraction F[,F...] (e.g. 0.001,0.01,0.05,0.2,1.0) [--size-mb N=2048]
//               [--steps N=4] [--delta auto|on|size[,...]] [--strategy shm|ucx|cuda_ipc]
//               [--delta-base-memory device|pinned_host] [--delta-threads N] [--mirror] [--paired] [--json]
//
// The model is bf16 with Llama-like shapes, in torch-like buffers. Before every step after the
// first, a fraction F of each tensor's elements changes (one ulp, spread at random). Per
// configuration it reports the median over steps 2..N of: bytes moved (dense bytes, or a
// patch's), trainer time in send_chunk (compare + encode + pack, and any wait for a bucket),
// engine time in wsync_recv_copy (dense copy, or verified apply), and sync time (first
// send_chunk to flush), with each ratio to the dense baseline of the same run, and the mean
// sync time over the same steps, and which way each version went (P: some tensor went as a
// patch, D: dense). Step 1 (no base yet) is dense everywhere and is not counted. Dense runs
// again after the delta runs ("dense2", JSON "dense_again", its ratio to the first): the spread
// of the baseline itself, against which a ratio near 1 is to be read. --delta takes
// one mode or several (each fraction runs each): auto (decided by cost, the default), size
// (auto with "delta_decide": "size": every version compared) or on. --paired (host kinds):
// each configuration runs beside a dense one of its own, the two alternating versions on the
// same model, and its ratios are to that dense one (JSON "dense_paired"): on a host whose
// speed drifts by more than the difference sought, only a baseline measured at the same
// minutes can show it.
//
// --strategy ucx: the same with the engine pulling over UCX (tcp over loopback by default:
// --transports, --net-devices), where the link, not memory, is the bottleneck, as between
// machines; the trainer keeps one version ("keep_versions": 1). --engine-netns NAME: the engine
// joins network namespace NAME (/run/netns/NAME, as `ip netns add` makes) right after the fork,
// so that with the trainer run in another (`ip netns exec`), the bytes cross a veth pair that
// `tc` may shape (scripts/delta-crossover.sh); both ends' device is then --net-devices.
//
// --strategy cuda_ipc: the same between two processes on GPU 0 (WSYNC_CUDA_LIBRARY, else
// libcuda.so.1): the trainer's tensors are device buffers, uploaded from the host model before
// each step (not timed), compared on the GPU; one engine process (forked before this one
// touches CUDA) loads every configuration into its own device buffers with wsync_recv_copy,
// which applies patches there; its apply time runs from receive to the end of its GPU work.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sched.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cli.hpp"
#include "cuda_driver.hpp"

namespace wsync_cli {
namespace {

using json = nlohmann::json;

// --strategy ucx: both sides' UCX options (set once, before any fork).
bool g_ucx = false;
std::string g_ucx_side;
std::string g_engine_netns;  // --engine-netns: the engine's network namespace  // "\"transports\": ..., \"net_devices\": ..., \"timeout_ms\": ..."
double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

#define MUST(call) check((call), #call)

// --- pipes: u64 length, then bytes -------------------------------------------------------------
void write_all(int fd, const void *p, size_t n) {
    const char *c = static_cast<const char *>(p);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) std::exit(3);
        c += w, n -= size_t(w);
    }
}
void read_all(int fd, void *p, size_t n) {
    char *c = static_cast<char *>(p);
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) std::exit(3);
        c += r, n -= size_t(r);
    }
}
void send_frame(int fd, const void *p, uint64_t n) {
    write_all(fd, &n, 8);
    if (n) write_all(fd, p, n);
}
std::vector<uint8_t> recv_frame(int fd) {
    uint64_t n;
    read_all(fd, &n, 8);
    std::vector<uint8_t> b(n);
    if (n) read_all(fd, b.data(), n);
    return b;
}

struct Tensor {
    std::string name;
    int64_t shape[2];
    uint64_t bytes;
    uint16_t *data;
};

std::vector<Tensor> make_delta_model(uint64_t size_bytes) {
    static const int64_t layer[][2] = {{4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096},
                                       {11008, 4096}, {11008, 4096}, {4096, 11008}, {1, 4096}};
    static const char *names[] = {"q", "k", "v", "o", "gate", "up", "down", "norm"};
    std::vector<Tensor> m;
    uint64_t total = 0;
    for (int l = 0; total < size_bytes; ++l)
        for (int k = 0; k < 8 && total < size_bytes; ++k) {
            Tensor t{"layers." + std::to_string(l) + "." + names[k], {layer[k][0], layer[k][1]}, 0, nullptr};
            t.bytes = uint64_t(t.shape[0]) * uint64_t(t.shape[1]) * 2;
            t.data = static_cast<uint16_t *>(std::aligned_alloc(64, (t.bytes + 63) / 64 * 64));
            uint64_t x = 0x9e3779b97f4a7c15ull * (m.size() + 1);
            for (uint64_t e = 0; e < t.bytes / 2; ++e) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                t.data[e] = uint16_t(0x3c00 | (x & 0x3ff));  // bf16 values around 0.01
            }
            total += t.bytes;
            m.push_back(t);
        }
    return m;
}

// One ulp on a fraction f of the elements: one per stride of 1/f, at a random place in it.
void mutate(std::vector<Tensor> &m, double f, uint64_t step) {
    uint64_t x = 0x2545f4914f6cdd1dull * step;
    for (Tensor &t : m) {
        const uint64_t n = t.bytes / 2;
        if (f >= 1.0) {
            for (uint64_t e = 0; e < n; ++e) t.data[e] ^= 1;
            continue;
        }
        const double stride = 1.0 / f;
        for (double at = 0; at < double(n); at += stride) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint64_t e = uint64_t(at + double(x % 1000003) / 1000003.0 * stride);
            if (e < n) t.data[e] ^= 1;
        }
    }
}

uint64_t model_hash(const std::vector<Tensor> &m) {
    uint64_t h = 0;
    for (const Tensor &t : m) h = XXH3_64bits_withSeed(t.data, t.bytes, h);
    return h;
}

// --- the engines ------------------------------------------------------------------------------
// What both engines answer at a version's end: their apply time and the hash of what they hold.
void answer_version(int out, double apply_ms, uint64_t hash) {
    double ans[2];
    std::memcpy(&ans[0], &apply_ms, 8);
    std::memcpy(&ans[1], &hash, 8);
    write_all(out, ans, sizeof ans);
}

// The engine's memory for tensor `name`: its index in `mem` (name -> (memory, bytes)), made by
// `make(bytes)` the first time the tensor arrives.
template <class Ptr, class Make>
size_t slot_for(std::vector<std::pair<std::string, std::pair<Ptr, uint64_t>>> &mem,
                const char *name, uint64_t bytes, Make make) {
    size_t i = 0;
    while (i < mem.size() && mem[i].first != name) ++i;
    if (i == mem.size()) mem.push_back({name, {make(bytes), bytes}});
    return i;
}

// Frames down: the init blob, then requests; an empty frame ends a version (answered with
// apply_ms and the model hash as two doubles/u64), a second empty frame ends the engine.
// mirror: the receiver keeps a mirror ("delta_mirror") and the engine loads as a view loader
// does, copying each tensor out of its view with memcpy; else it loads with wsync_recv_copy.
[[noreturn]] void engine(int in, int out, bool mirror) {
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    if (!g_engine_netns.empty()) enter_netns(g_engine_netns);
    std::vector<uint8_t> init = recv_frame(in);
    const std::string ropts = g_ucx ? "{" + g_ucx_side + (mirror ? ", \"delta_mirror\": true}" : "}")
                                    : (mirror ? "{\"delta_mirror\": true}" : "");
    MUST(wsync_strategy_create(g_ucx ? "ucx" : "shm", ropts.empty() ? nullptr : ropts.c_str(), &s));
    MUST(wsync_receiver_create(s, init.data(), init.size(), 0, &r));
    answer_version(out, 0, 0);  // attached (a ucx engine attaches on its own time)
    std::vector<std::pair<std::string, std::pair<uint8_t *, uint64_t>>> mem;
    double apply_ms = 0;
    for (;;) {
        std::vector<uint8_t> f = recv_frame(in);
        if (f.empty()) {
            uint64_t h = 0;
            for (auto &kv : mem) h = XXH3_64bits_withSeed(kv.second.first, kv.second.second, h);
            answer_version(out, apply_ms, h);
            apply_ms = 0;
            if (recv_frame(in).size() == 1) continue;  // another version follows
            break;
        }
        wsync_recv_t *it;
        MUST(wsync_receiver_receive(r, f.data(), f.size(), &it));
        wsync_recv_info_t info{};
        info.struct_size = sizeof info;
        wsync_recv_info(it, &info);
        for (size_t k = 0; k < info.count; ++k) {
            wsync_tensor_t v;
            wsync_recv_peek(it, k, &v);
            const uint64_t bytes = uint64_t(v.shape[0]) * uint64_t(v.shape[1]) * 2;
            const size_t i = slot_for(mem, v.name, bytes, [](uint64_t n) {
                return static_cast<uint8_t *>(std::aligned_alloc(64, (n + 63) / 64 * 64));
            });
            auto t0 = Clock::now();
            if (mirror) {
                bool has = false;
                MUST(wsync_recv_next(it, &v, &has));
                if (!has) std::exit(4);
                std::memcpy(mem[i].second.first, v.data, bytes);
            } else {
                MUST(wsync_recv_copy(it, k, 0, mem[i].second.first, bytes));
            }
            apply_ms += ms_since(t0);
        }
        MUST(wsync_recv_end(it));
    }
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    std::_Exit(0);
}

// --strategy cuda_ipc: one engine for every configuration (a CUDA process cannot fork a child
// that uses CUDA). Frames down per configuration: the init blob, then requests and version
// ends as for the host engine, then a 2-byte frame ending the configuration; an empty frame
// where an init is expected ends the engine.
[[noreturn]] void gpu_engine(int in, int out) {
    try {
        cu::start_device0();
        std::vector<std::pair<std::string, std::pair<cu::CUdeviceptr, uint64_t>>> mem;
        for (;;) {
            std::vector<uint8_t> init = recv_frame(in);
            if (init.empty()) break;
            wsync_strategy_t *s;
            wsync_receiver_t *r;
            MUST(wsync_strategy_create("cuda_ipc", "{\"device\": 0}", &s));
            MUST(wsync_receiver_create(s, init.data(), init.size(), 0, &r));
            double apply_ms = 0;
            for (;;) {
                std::vector<uint8_t> f = recv_frame(in);
                if (f.size() == 2) break;  // the configuration ends
                if (f.empty()) {           // a version ends: its time and the model's hash
                    uint64_t h = 0;
                    std::vector<uint8_t> host;
                    for (auto &kv : mem) {
                        host.resize(kv.second.second);
                        cu::ok(cu::api.MemcpyDtoH(host.data(), kv.second.first, host.size()), "cuMemcpyDtoH_v2");
                        h = XXH3_64bits_withSeed(host.data(), host.size(), h);
                    }
                    answer_version(out, apply_ms, h);
                    apply_ms = 0;
                    continue;
                }
                auto t0 = Clock::now();
                wsync_recv_t *it;
                MUST(wsync_receiver_receive(r, f.data(), f.size(), &it));
                wsync_recv_info_t info{};
                info.struct_size = sizeof info;
                wsync_recv_info(it, &info);
                for (size_t k = 0; k < info.count; ++k) {
                    wsync_tensor_t v;
                    wsync_recv_peek(it, k, &v);
                    const uint64_t bytes = uint64_t(v.shape[0]) * uint64_t(v.shape[1]) * 2;
                    const size_t i = slot_for(mem, v.name, bytes, [](uint64_t n) {
                        cu::CUdeviceptr d = 0;
                        cu::ok(cu::api.MemAlloc(&d, n), "cuMemAlloc_v2");
                        return d;
                    });
                    MUST(wsync_recv_copy(it, k, 0, reinterpret_cast<void *>(mem[i].second.first), bytes));
                }
                MUST(wsync_recv_end(it));
                cu::ok(cu::api.CtxSynchronize(), "cuCtxSynchronize");  // the dense copies too
                apply_ms += ms_since(t0);
            }
            wsync_receiver_destroy(r);
            wsync_strategy_destroy(s);
        }
        for (auto &kv : mem) cu::api.MemFree(kv.second.first);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "wsync-bench-delta engine: %s\n", e.what());
        std::_Exit(1);
    }
    std::_Exit(0);
}

// The trainer's side of --strategy cuda_ipc: the engine's pipes and the device buffers.
struct Gpu {
    int down = -1, up = -1;
    pid_t pid = -1;
    std::vector<cu::CUdeviceptr> dev;  // one per tensor of the model
};

struct Figures {
    double bytes = 0, send_ms = 0, apply_ms = 0, sync_ms = 0, sync_mean_ms = 0;
    std::string chose;  // per version from step 2: P (some tensor went as a patch) or D (dense)
    std::vector<double> sync_each;  // per version from step 2, ms (a one-time cost shows here)
};

double mean(const std::vector<double> &v) {
    double t = 0;
    for (double x : v) t += x;
    return v.empty() ? 0 : t / double(v.size());
}

// Bytes a request moves: each tensor's dense size, or its patch's; *patched is set when one
// tensor is a patch.
double request_bytes(const wsync_blob_t &req, bool *patched) {
    char *text;
    MUST(wsync_blob_describe(req.data, req.size, &text));
    json j = json::parse(text);
    wsync_string_free(text);
    const json &t = j["body"]["tensors"];
    double total = 0;
    std::vector<double> patch(t["names"].size(), -1);
    if (t.contains("patches")) *patched = true;
    if (t.contains("patches"))
        for (size_t k = 0; k < t["patches"]["tensor"].size(); ++k)
            patch[t["patches"]["tensor"][k].get<size_t>()] = t["patches"]["bytes"][k].get<double>();
    size_t si = 0;
    for (size_t i = 0; i < patch.size(); ++i) {
        double dense = 2;  // bf16
        for (int d = 0; d < t["ndims"][i].get<int>(); ++d) dense *= t["shapes"][si++].get<double>();
        total += patch[i] >= 0 ? patch[i] : dense;
    }
    return total;
}

// One configuration: a fresh strategy, sender and engine, driven one version at a time (the
// caller changes the model between versions), so two configurations can alternate versions.
class Config {
public:
    Config(std::vector<Tensor> &m, const std::string &delta, bool mirror, Gpu *gpu,
           const std::string &base_memory, int threads)
        : m_(m), gpu_(gpu) {
        std::string opts = (g_ucx ? "{" + g_ucx_side + ", \"keep_versions\": 1" : std::string("{\"bucket_bytes\": 268435456")) +
                           (delta == "size" ? std::string(", \"delta\": \"auto\", \"delta_decide\": \"size\"")
                                            : ", \"delta\": \"" + delta + "\"");
        if (gpu) opts += ", \"delta_base_memory\": \"" + base_memory + "\"";
        else if (threads >= 0) opts += ", \"delta_threads\": " + std::to_string(threads);
        opts += "}";
        int down[2], up[2];
        if (gpu) {
            down[1] = gpu->down, up[0] = gpu->up;
        } else {
            if (pipe(down) || pipe(up)) std::exit(3);
            std::fflush(stdout);
            pid_ = fork();
            if (pid_ == 0) {
                close(down[1]), close(up[0]);
                engine(down[0], up[1], mirror);
            }
            close(down[0]), close(up[1]);
        }
        down_ = down[1], up_ = up[0];
        opts_ = opts;
    }

    // The strategy and the sender, and the engine attached (after every engine of a run is
    // forked: a child forked later would inherit this sender).
    void start() {
        MUST(wsync_strategy_create(gpu_ ? "cuda_ipc" : g_ucx ? "ucx" : "shm", opts_.c_str(), &s_));
        MUST(wsync_strategy_create_init_info(s_, &init_));
        MUST(wsync_sender_create(s_, init_.data, init_.size, &snd_));
        send_frame(down_, init_.data, init_.size);
        if (!gpu_) {  // the host engine says when it has attached: version 1 is then its first
            double attached[2];
            read_all(up_, attached, sizeof attached);
        }
        // Chunks of at most one bucket, in model order.
        chunks_.resize(1);
        uint64_t in_chunk = 0;
        for (size_t k = 0; k < m_.size(); ++k) {
            Tensor &t = m_[k];
            if (in_chunk + t.bytes + 256 > (uint64_t(256) << 20)) chunks_.emplace_back(), in_chunk = 0;
            wsync_tensor_t d{};
            d.name = t.name.c_str();
            d.data = gpu_ ? reinterpret_cast<void *>(gpu_->dev[k]) : t.data;
            d.shape = t.shape;
            d.ndim = 2;
            d.dtype = {WSYNC_DTYPE_BFLOAT, 16, 1};
            d.device = gpu_ ? wsync_device_t{WSYNC_DEVICE_CUDA, 0} : wsync_device_t{WSYNC_DEVICE_CPU, 0};
            chunks_.back().push_back(d);
            in_chunk += (t.bytes + 255) / 256 * 256;
        }
    }

    // Version `step` of the model as it stands now; `more`: another version of this
    // configuration follows.
    void step(int step, bool more) {
        if (gpu_)  // the trainer's new weights on its GPU (not timed)
            for (size_t k = 0; k < m_.size(); ++k)
                cu::ok(cu::api.MemcpyHtoD(gpu_->dev[k], m_[k].data, m_[k].bytes), "cuMemcpyHtoD_v2");
        double b = 0, send_ms = 0;
        bool patched = false;
        auto t0 = Clock::now();
        for (size_t c = 0; c < chunks_.size(); ++c) {
            wsync_chunk_t ch{};
            ch.tensors = chunks_[c].data();
            ch.count = chunks_[c].size();
            ch.flags = c + 1 == chunks_.size() ? WSYNC_CHUNK_LAST : 0;
            wsync_blob_t req;
            auto ts = Clock::now();
            MUST(wsync_sender_send_chunk(snd_, &ch, &req));
            send_ms += ms_since(ts);
            send_frame(down_, req.data, req.size);
            b += request_bytes(req, &patched);
            wsync_blob_free(&req);
        }
        MUST(wsync_sender_flush(snd_, 600000));
        double sync_ms = ms_since(t0);
        send_frame(down_, nullptr, 0);
        double ans[2];
        read_all(up_, ans, sizeof ans);
        uint64_t h;
        std::memcpy(&h, &ans[1], 8);
        if (h != model_hash(m_)) {
            std::fprintf(stderr, "wsync-bench-delta: the engine's model differs after step %d\n", step);
            std::exit(1);
        }
        if (!gpu_) {
            uint8_t next = 1;
            send_frame(down_, &next, more ? 1 : 0);
        }
        if (step > 1) bytes_.push_back(b), send_.push_back(send_ms), apply_.push_back(ans[0]), sync_.push_back(sync_ms);
        if (step > 1) chose_ += patched ? 'P' : 'D';
    }

    // Ends the configuration (its engine, sender and strategy): the medians of versions 2..
    Figures finish() {
        if (gpu_) {
            const uint8_t end[2] = {0, 0};
            send_frame(down_, end, 2);  // the configuration ends; the engine stays for the next
        } else {
            int st;
            waitpid(pid_, &st, 0);
            close(down_), close(up_);
        }
        wsync_sender_destroy(snd_);
        wsync_strategy_destroy(s_);
        wsync_blob_free(&init_);
        return {median(bytes_), median(send_), median(apply_), median(sync_), mean(sync_), chose_, sync_};
    }

private:
    std::vector<Tensor> &m_;
    Gpu *gpu_;
    std::string opts_;
    pid_t pid_ = -1;
    int down_ = -1, up_ = -1;
    wsync_strategy_t *s_ = nullptr;
    wsync_blob_t init_{};
    wsync_sender_t *snd_ = nullptr;
    std::vector<std::vector<wsync_tensor_t>> chunks_;
    std::vector<double> bytes_, send_, apply_, sync_;
    std::string chose_;
};

// Before every step after the first, a fraction f of the model changes (seeded by step and f).
void change(std::vector<Tensor> &m, double f, int step) {
    if (step > 1) mutate(m, f, uint64_t(step) + uint64_t(f * 1e6));
}

// One configuration alone: `steps` versions.
Figures run(std::vector<Tensor> &m, const std::string &delta, double f, int steps, bool mirror,
            Gpu *gpu, const std::string &base_memory, int threads) {
    Config c(m, delta, mirror, gpu, base_memory, threads);
    c.start();
    for (int step = 1; step <= steps; ++step) {
        change(m, f, step);
        c.step(step, step < steps);
    }
    return c.finish();
}

// --paired: a configuration and dense side by side, alternating versions (which goes first
// alternates too), both sending the same model at each step; the ratio is then to a dense
// baseline that saw the same host at the same minutes.
std::pair<Figures, Figures> run_paired(std::vector<Tensor> &m, const std::string &delta, double f, int steps,
                                       bool mirror, const std::string &base_memory, int threads) {
    Config dense(m, "off", mirror, nullptr, base_memory, threads);
    Config c(m, delta, mirror, nullptr, base_memory, threads);
    dense.start();
    c.start();
    for (int step = 1; step <= steps; ++step) {
        change(m, f, step);
        Config &one = step % 2 ? dense : c, &two = step % 2 ? c : dense;
        one.step(step, step < steps);
        two.step(step, step < steps);
    }
    Figures d = dense.finish();
    return {c.finish(), d};
}

// --- the floor: what any delta trainer must read, with nothing else running --------------------
// A host delta trainer finds what changed by reading every byte of the new weights and of its
// copy of the last committed ones (docs/delta.md). These two rows time exactly those reads (an
// OR of the words, or of the XOR of two streams: no hash, no encode, no engine), so the sync
// ratios above can be read against what this host's memory allows: where reading the model
// alone costs more than a quarter of a dense sync, no delta over shared memory can sync in less.
uint64_t or_words(const uint8_t *a, const uint8_t *b, uint64_t n) {
    uint64_t acc[4] = {0, 0, 0, 0};
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            uint64_t x, y = 0;
            std::memcpy(&x, a + i + 8 * k, 8);
            if (b) std::memcpy(&y, b + i + 8 * k, 8);
            acc[k] |= x ^ y;
        }
    for (; i < n; ++i) acc[0] |= uint64_t(a[i] ^ (b ? b[i] : 0));
    return acc[0] | acc[1] | acc[2] | acc[3];
}

// Milliseconds (median of `reps`) to read every tensor of m (and of `base`, when given) on
// `threads` threads taking 16 MiB pieces in turn.
double read_floor_ms(const std::vector<Tensor> &m, const std::vector<Tensor> *base, unsigned threads,
                     int reps) {
    constexpr uint64_t kPiece = 16 << 20;
    struct Piece {
        const uint8_t *a, *b;
        uint64_t n;
    };
    std::vector<Piece> pieces;
    for (size_t i = 0; i < m.size(); ++i)
        for (uint64_t at = 0; at < m[i].bytes; at += kPiece)
            pieces.push_back({reinterpret_cast<const uint8_t *>(m[i].data) + at,
                              base ? reinterpret_cast<const uint8_t *>((*base)[i].data) + at : nullptr,
                              std::min(kPiece, m[i].bytes - at)});
    std::vector<double> times;
    volatile uint64_t sink = 0;
    for (int r = 0; r < reps; ++r) {
        std::atomic<size_t> next{0};
        std::atomic<uint64_t> seen{0};
        auto work = [&] {
            uint64_t acc = 0;
            for (size_t k; (k = next.fetch_add(1)) < pieces.size();)
                acc |= or_words(pieces[k].a, pieces[k].b, pieces[k].n);
            seen.fetch_or(acc);
        };
        const auto t0 = Clock::now();
        std::vector<std::thread> pool;
        for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
        work();
        for (std::thread &t : pool) t.join();
        times.push_back(ms_since(t0));
        sink = sink | seen.load();
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// The threads a host compare uses by default ("delta_threads" 0: one per CPU the process may
// run on, at most 8).
unsigned default_compare_threads() {
    cpu_set_t set;
    CPU_ZERO(&set);
    const unsigned cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? unsigned(CPU_COUNT(&set)) : 1;
    return std::max(1u, std::min(cpus, 8u));
}

}  // namespace

int cmd_bench_delta(int argc, char **argv, int first) {
    uint64_t size_mb = 2048;
    int steps = 4;
    bool as_json = false, mirror = false, paired = false;
    std::vector<std::string> modes;
    std::string delta = "auto", strategy = "shm", base_memory = "device", transports = "tcp", net_devices = "lo";
    int threads = -1;  // the option's default
    std::vector<double> fractions;
    for (int i = first; i < argc; ++i) {
        const std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--size-mb") size_mb = parse_uint(a, v, 1, 1 << 20), ++i;
        else if (a == "--steps") steps = int(parse_uint(a, v, 2, 1000)), ++i;
        else if (a == "--delta") {
            const std::string list = v ? v : "";
            for (size_t p = 0; p <= list.size();) {
                const size_t q = std::min(list.find(',', p), list.size());
                const std::string item = list.substr(p, q - p);
                if (item != "auto" && item != "on" && item != "size")
                    usage_error("--delta takes auto, on or size, or several of them comma-separated");
                modes.push_back(item);
                p = q + 1;
            }
            delta = list, ++i;
        } else if (a == "--json") as_json = true;
        else if (a == "--mirror") mirror = true;
        else if (a == "--paired") paired = true;
        else if (a == "--delta-threads") threads = int(parse_uint(a, v, 0, 64)), ++i;
        else if (a == "--delta-base-memory") {
            if (!v || (std::strcmp(v, "device") && std::strcmp(v, "pinned_host")))
                usage_error("--delta-base-memory takes device or pinned_host");
            base_memory = v, ++i;
        }
        else if (a == "--strategy") {
            if (!v || (std::strcmp(v, "shm") && std::strcmp(v, "cuda_ipc") && std::strcmp(v, "ucx")))
                usage_error("bench --delta-fraction --strategy takes shm, ucx or cuda_ipc");
            strategy = v, ++i;
        }
        else if (a == "--transports" && v) transports = v, ++i;
        else if (a == "--net-devices" && v) net_devices = v, ++i;
        else if (a == "--engine-netns" && v) g_engine_netns = v, ++i;
        else if (a == "--delta-fraction") {
            if (!v) usage_error("--delta-fraction needs a value");
            const std::string list = v;
            ++i;
            for (size_t p = 0; p <= list.size();) {
                const size_t q = std::min(list.find(',', p), list.size());
                const std::string item = list.substr(p, q - p);
                char *end = nullptr;
                const double f = std::strtod(item.c_str(), &end);
                if (item.empty() || *end || !(f > 0.0 && f <= 1.0))
                    usage_error("--delta-fraction: '" + item + "' is not a fraction in (0, 1]");
                fractions.push_back(f);
                p = q + 1;
            }
        } else {
            usage_error("unknown option '" + a + "' for bench --delta-fraction (see: wsync help)");
        }
    }
    if (strategy == "cuda_ipc" && mirror)
        usage_error("--mirror is an shm receiver option (cuda_ipc applies patches on the GPU)");
    if (strategy == "cuda_ipc" && paired)
        usage_error("--paired is for host kinds (cuda_ipc's one engine serves one configuration at a time)");
    if (strategy == "cuda_ipc" && threads >= 0)
        usage_error("--delta-threads is for shm (cuda_ipc compares on the GPU)");
    if (strategy != "cuda_ipc" && base_memory != "device")
        usage_error("--delta-base-memory pinned_host is for --strategy cuda_ipc (shm's bases are host memory)");
    if (strategy == "ucx") {
        g_ucx = true;
        g_ucx_side = "\"transports\": \"" + transports + "\", \"net_devices\": \"" + net_devices +
                     "\", \"timeout_ms\": 120000";
    }
    Gpu gpu_run, *gpu = nullptr;
    if (strategy == "cuda_ipc") {
        cu::load();  // dlopen only: the engine is forked before any CUDA call
        int down[2], up[2];
        if (pipe(down) || pipe(up)) std::exit(3);
        std::fflush(stdout);
        gpu_run.pid = fork();
        if (gpu_run.pid == 0) {
            close(down[1]), close(up[0]);
            gpu_engine(down[0], up[1]);
        }
        close(down[0]), close(up[1]);
        gpu_run.down = down[1], gpu_run.up = up[0];
        gpu = &gpu_run;
    }
    std::vector<Tensor> m = make_delta_model(size_mb << 20);
    uint64_t total = 0;
    for (const Tensor &t : m) total += t.bytes;
    if (gpu) {
        try {
            cu::start_device0();
            for (const Tensor &t : m) {
                cu::CUdeviceptr d = 0;
                cu::ok(cu::api.MemAlloc(&d, t.bytes), "cuMemAlloc_v2");
                gpu->dev.push_back(d);
            }
        } catch (const std::exception &e) {
            die(e.what());
        }
    }
    Figures dense = run(m, "off", 0.01, steps, false, gpu, base_memory, threads);
    json out = {{"strategy", strategy}, {"model_bytes", total}, {"tensors", m.size()}, {"dtype", "bfloat16"},
                {"steps", steps}, {"delta", delta}, {"mirror", mirror}, {"paired", paired},
                {"delta_base_memory", gpu ? base_memory : "host"},
                {"delta_threads", threads < 0 ? json("default") : json(threads)},
                {"dense", {{"bytes", dense.bytes}, {"send_ms", dense.send_ms},
                           {"apply_ms", dense.apply_ms}, {"sync_ms", dense.sync_ms},
                           {"sync_mean_ms", dense.sync_mean_ms}, {"sync_ms_each", dense.sync_each}}},
                {"delta_runs", json::array()}};
    if (!as_json)
        std::printf("%s%s: model %.0f MiB bf16, %zu tensors; median of steps 2..%d\n"
                    "%-9s %12s %8s %10s %10s %10s %9s %10s  %s\n", strategy.c_str(),
                    gpu && base_memory != "device" ? " (bases in pinned host memory)" : "",
                    double(total) / (1 << 20), m.size(),
                    steps, "changed", "bytes", "x dense", "send ms", "apply ms", "sync ms",
                    "x dense", "mean sync", "versions 2.. (P patches, D dense)");
    // One text row: r's figures as ratios to `base` (the first dense run unless said), and a note
    // (what the versions were, by default).
    auto row = [&](const char *label, const Figures &r, const Figures *base = nullptr, const char *note = nullptr) {
        if (as_json) return;
        const Figures &b = base ? *base : dense;
        std::printf("%-9s %12.0f %8.4f %10.1f %10.1f %10.1f %9.3f %10.1f  %s\n", label, r.bytes, r.bytes / b.bytes,
                    r.send_ms, r.apply_ms, r.sync_ms, r.sync_ms / b.sync_ms, r.sync_mean_ms,
                    note ? note : r.chose.c_str());
    };
    row("dense", dense);
    if (mirror) {  // the same dense versions to engines that keep a mirror and read views
        Figures dm = run(m, "off", 0.01, steps, true, nullptr, base_memory, threads);
        row("dense/mir", dm);
        out["dense_mirror"] = {{"bytes", dm.bytes}, {"send_ms", dm.send_ms},
                               {"apply_ms", dm.apply_ms}, {"sync_ms", dm.sync_ms},
                               {"sync_mean_ms", dm.sync_mean_ms},
                               {"sync_ratio", dm.sync_ms / dense.sync_ms}};
    }
    if (modes.empty()) modes.push_back(delta);
    for (double f : fractions)
      for (const std::string &mode : modes) {
        Figures r, beside;
        if (paired) std::tie(r, beside) = run_paired(m, mode, f, steps, mirror, base_memory, threads);
        else r = run(m, mode, f, steps, mirror, gpu, base_memory, threads);
        // --paired: the ratio is to the dense configuration that alternated with this one.
        const Figures &base = paired ? beside : dense;
        char label[32];
        if (modes.size() == 1) std::snprintf(label, sizeof label, "%g", f);
        else std::snprintf(label, sizeof label, "%g/%s", f, mode.c_str());
        if (paired) row("  dense", beside, nullptr, "(alternating with the next row)");
        row(label, r, &base);
        json cell = {{"fraction", f}, {"mode", mode}, {"bytes", r.bytes},
                     {"bytes_ratio", r.bytes / base.bytes},
                     {"send_ms", r.send_ms}, {"apply_ms", r.apply_ms},
                     {"sync_ms", r.sync_ms}, {"sync_mean_ms", r.sync_mean_ms},
                     {"sync_ratio", r.sync_ms / base.sync_ms},
                     {"chose", r.chose}, {"sync_ms_each", r.sync_each}};
        if (paired)
            cell["dense_paired"] = {{"sync_ms", beside.sync_ms}, {"sync_mean_ms", beside.sync_mean_ms},
                                    {"sync_ms_each", beside.sync_each}};
        out["delta_runs"].push_back(cell);
    }
    {
        // Dense once more, after every delta run: the spread between two dense runs of the
        // same processes' kind minutes apart, against which a delta run's ratio can be read (a
        // run that goes dense, such as "auto" where delta does not pay, differs from the first
        // dense run by that spread, not by a cost of its own).
        Figures again = run(m, "off", 0.01, steps, false, gpu, base_memory, threads);
        row("dense2", again);
        out["dense_again"] = {{"bytes", again.bytes}, {"send_ms", again.send_ms},
                              {"apply_ms", again.apply_ms}, {"sync_ms", again.sync_ms},
                              {"sync_mean_ms", again.sync_mean_ms},
                              {"sync_ratio", again.sync_ms / dense.sync_ms}, {"sync_ms_each", again.sync_each}};
    }
    if (!gpu) {
        // The floor rows (host kinds): the same model, a second copy standing for the sender's
        // bases, read with nothing else running; "x dense" is to the dense sync above.
        std::vector<Tensor> base = m;
        for (Tensor &t : base) {
            const uint16_t *src = t.data;
            t.data = static_cast<uint16_t *>(std::aligned_alloc(64, (t.bytes + 63) / 64 * 64));
            std::memcpy(t.data, src, t.bytes);
        }
        const unsigned cthreads = threads > 0 ? unsigned(threads) : default_compare_threads();
        const int reps = std::max(steps, 3);
        const double read1 = read_floor_ms(m, nullptr, 1, reps);
        const double read2 = read_floor_ms(m, &base, cthreads, reps);
        for (Tensor &t : base) std::free(t.data);
        if (!as_json) {
            std::printf("floor, with nothing else running (time to read, in the sync ms column):\n");
            std::printf("%-9s %12.0f %8s %10s %10s %10.1f %9.3f   read the new bytes once, 1 thread\n",
                        "read new", double(total), "", "", "", read1, read1 / dense.sync_ms);
            std::printf("%-9s %12.0f %8s %10s %10s %10.1f %9.3f   new and base, %u thread%s\n",
                        "read n+b", double(2 * total), "", "", "", read2, read2 / dense.sync_ms,
                        cthreads, cthreads == 1 ? "" : "s");
        }
        out["floor"] = {{"read_new_ms", read1}, {"read_new_ratio", read1 / dense.sync_ms},
                        {"read_new_and_base_ms", read2}, {"read_new_and_base_ratio", read2 / dense.sync_ms},
                        {"threads", cthreads}};
    }
    if (as_json) std::printf("%s\n", out.dump(2).c_str());
    if (gpu) {
        send_frame(gpu->down, nullptr, 0);  // the engine ends
        int st = 0;
        waitpid(gpu->pid, &st, 0);
        close(gpu->down), close(gpu->up);
        for (cu::CUdeviceptr d : gpu->dev) cu::api.MemFree(d);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the GPU engine exited abnormally");
    }
    for (Tensor &t : m) std::free(t.data);
    return 0;
}

}  // namespace wsync_cli
