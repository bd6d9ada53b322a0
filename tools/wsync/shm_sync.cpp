// wsync demo / wsync bench (shm): a trainer and N forked engine processes sync the synthetic
// model over shared memory; every engine verifies every tensor after every step. The bench adds
// the baselines of the same run: one-core memcpy, the receiver copy loop (bench_copy.cpp), and
// the metadata cost per tensor.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unordered_map>

#include "bench_copy.hpp"
#include "cli.hpp"
#include "cuda_driver.hpp"

namespace wsync_cli {
namespace {

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
    std::string opts = a.strategy == "ucx" ? kind_options(a, true, 0) : "{}";
    if (a.gpu) opts.insert(opts.size() - 1, ", \"device\": 0");  // --gpu: a GPU engine
    if (wsync_strategy_create(a.strategy.c_str(), opts.c_str(), &strategy) != WSYNC_OK ||
        wsync_receiver_create(strategy, frame.data(), frame.size(), index, &receiver) != WSYNC_OK)
        return fail(wsync_last_error());
    // --gpu: the engine's parameters are GPU 0 memory, loaded with wsync_recv_copy and read back
    // for the check after each step.
    std::vector<cu::CUdeviceptr> on_gpu;
    if (a.gpu) {
        try {
            cu::load();
            cu::start_device0();
            on_gpu = cu::alloc_each(model);
        } catch (const std::exception &e) {
            return fail(e.what());
        }
    }
    // --load apply / land: one destination table over the parameters (a tensor split into parts
    // is one destination: each part lands at its place in it); land: the receiver lands chunks
    // straight in it (ucx).
    wsync_dest_table_t *table = nullptr;
    if (a.load_table && !a.gpu) {
        std::vector<wsync_dest_t> dests(model.size());
        const wsync_dtype_t bf16 = {WSYNC_DTYPE_BFLOAT, 16, 1};
        for (size_t i = 0; i < model.size(); ++i) {
            dests[i] = wsync_dest_t{};
            dests[i].name = model[i].name.c_str();
            dests[i].data = params.at[i];
            dests[i].shape = model[i].shape.data();
            dests[i].ndim = static_cast<int32_t>(model[i].shape.size());
            dests[i].dtype = bf16;
            dests[i].struct_size = sizeof(wsync_dest_t);
        }
        if (wsync_dest_table_create(receiver, dests.data(), dests.size(), &table) != WSYNC_OK ||
            (a.load_land && wsync_receiver_land(receiver, table) != WSYNC_OK))
            return fail(wsync_last_error());
    }
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
            // With a table, one call loads the chunk (a failure is the iteration's, which
            // wsync_recv_end reports).
            if (table) (void)wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, nullptr);
            for (size_t i = 0; !table && i < info.count; ++i) {
                wsync_tensor_t v;
                wsync_part_t part{};
                bool has = true;
                if (a.load_copy ? wsync_recv_peek(it, i, &v) : wsync_recv_next_part(it, &v, &part, &has))
                    break;  // wsync_recv_end reports it
                auto p = by_name.find(v.name);
                if (p == by_name.end()) {
                    wsync_recv_end(it);
                    return fail(std::string("unexpected tensor '") + v.name + "'");
                }
                // The load an engine does anyway: the tensor into its own parameter. A part of a
                // split tensor lands at its place: wsync_recv_copy of the whole range writes only
                // the part's bytes; a view is the part's bytes, at part.offset of the tensor.
                if (a.gpu) {
                    if (wsync_recv_copy(it, i, 0, reinterpret_cast<void *>(on_gpu[p->second]),
                                        model[p->second].bytes))
                        break;
                } else if (a.load_copy) {
                    if (wsync_recv_copy(it, i, 0, params.at[p->second], model[p->second].bytes))
                        break;
                } else {
                    std::memcpy(static_cast<uint8_t *>(params.at[p->second]) + part.offset, v.data,
                                part.bytes);
                }
            }
            if (wsync_recv_end(it) != WSYNC_OK) return fail(wsync_last_error());
            load_s += since(t0);
        } else if (type == kStepEnd) {
            uint64_t step;
            std::memcpy(&step, frame.data(), 8);
            for (size_t i = 0; i < model.size(); ++i)
                if (a.gpu && cu::api.MemcpyDtoH(params.at[i], on_gpu[i], model[i].bytes) != 0)
                    return fail("engine " + std::to_string(index) + ": reading '" + model[i].name + "' back from the GPU failed");
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
    wsync_dest_table_destroy(table);
    wsync_receiver_destroy(receiver);
    wsync_strategy_destroy(strategy);
    cu::free_each(on_gpu);
    return 0;
}

}  // namespace

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

std::string json_list(const std::vector<double> &v, const char *fmt) {
    std::string out = "[";
    char buf[32];
    for (size_t i = 0; i < v.size(); ++i) {
        std::snprintf(buf, sizeof buf, fmt, v[i]);
        out += (i ? ", " : "") + std::string(buf);
    }
    return out + "]";
}

double RunResult::steady_s() const {
    return step_s.size() < 2 ? step_s[0] : median({step_s.begin() + 1, step_s.end()});
}

std::string kind_options(const Args &a, bool checksum, uint64_t bucket, uint64_t arena_bytes) {
    std::string common = "{\"receivers\": " + std::to_string(a.receivers) +
                         ", \"checksum\": " + (checksum ? "true" : "false") +
                         ", \"timeout_ms\": " + std::to_string(a.timeout_ms);
    if (a.copy_threads >= 0) common += ", \"copy_threads\": " + std::to_string(a.copy_threads);
    if (a.strategy == "ucx")
        return common + ", \"keep_versions\": 1, \"transports\": \"" + a.transports +
               "\", \"net_devices\": \"" + a.net_devices + "\"" +
               (arena_bytes ? ", \"arena_bytes\": " + std::to_string(arena_bytes) : std::string()) + "}";
    return common + ", \"buckets\": " + std::to_string(a.buckets) +
           ", \"bucket_bytes\": " + std::to_string(bucket) +
           (arena_bytes ? ", \"arena_bytes\": " + std::to_string(arena_bytes) : std::string()) + "}";
}

// --- the trainer and controller ---------------------------------------------------------------
RunResult run_sync(const Args &a, bool checksum, bool progress, Baselines baselines) {
    if (a.arena && a.strategy != "shm" && a.strategy != "ucx")
        die("--arena is for the shm and ucx strategies (their sender's arena)");
    if (a.arena && a.gpu) die("--arena keeps the model in host memory; --gpu keeps it on GPU 0: choose one");
    if (a.gpu && a.strategy != "ucx") die("--gpu is for the ucx strategy (cuda_ipc benches GPU memory itself)");
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
            if (!a.engine_netns.empty()) enter_netns(a.engine_netns);
            std::_Exit(engine_main(i, p1[0], p2[1], model, poll_ms, a));
        }
        close(p1[0]);
        close(p2[1]);
        to[i] = p1[1];
        from[i] = p2[0];
    }
    // --gpu, after the engines are forked (a process that touched CUDA cannot fork a CUDA child):
    // the trainer's model lives on GPU 0; each step's values are uploaded before the sync.
    std::vector<cu::CUdeviceptr> on_gpu;
    if (a.gpu) {
        cu::load();
        cu::start_device0();
        try {
            on_gpu = cu::alloc_each(model);
        } catch (const std::exception &e) {
            die(e.what());
        }
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
    // With --arena the model lives in the sender's arena; the baselines copy from a second
    // copy, made only when they run (so the ucx bench's trainer_peak_rss_mb is the sync's).
    auto weights = a.arena && baselines == Baselines::None ? std::vector<std::vector<uint8_t>>(model.size())
                                                           : allocate(model);
    std::vector<uint8_t *> held(model.size());  // where the trainer keeps each tensor
    uint64_t largest = 0;
    for (size_t i = 0; i < model.size(); ++i) {
        r.bytes += model[i].bytes;
        largest = std::max(largest, model[i].bytes);
        desc[i] = wsync_tensor_t{};
        desc[i].name = model[i].name.c_str();
        desc[i].data = held[i] = weights[i].data();
        desc[i].shape = model[i].shape.data();
        desc[i].ndim = int32_t(model[i].shape.size());
        desc[i].dtype = {WSYNC_DTYPE_BFLOAT, 16, 1};
        desc[i].device = {WSYNC_DEVICE_CPU, 0};
        if (a.gpu) {
            desc[i].data = reinterpret_cast<void *>(on_gpu[i]);
            desc[i].device = {WSYNC_DEVICE_CUDA, 0};
        }
    }
    // With --split on (default) a tensor larger than a chunk crosses in parts, so chunks and
    // buckets stay at --chunk-mb whatever the largest tensor; with --split off a chunk must hold
    // the largest tensor whole.
    uint64_t chunk_bytes = a.split ? a.chunk_mb << 20 : std::max(a.chunk_mb << 20, (largest + 255) / 256 * 256);
    uint64_t bucket = a.bucket_mb ? a.bucket_mb << 20 : chunk_bytes;
    bucket = (bucket + 4095) / 4096 * 4096;

    // --arena: the model lives in the sender's arena, each tensor at a 256-byte multiple, so
    // every tensor (and every part of a split one: parts start at whole pages) crosses in place.
    std::vector<uint64_t> arena_at(model.size());
    uint64_t arena_bytes = 0;
    if (a.arena)
        for (size_t i = 0; i < model.size(); ++i) {
            arena_at[i] = arena_bytes;
            arena_bytes += (model[i].bytes + 255) / 256 * 256;
        }
    const std::string opts = kind_options(a, checksum, bucket, arena_bytes);
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    check(wsync_strategy_create(a.strategy.c_str(), opts.c_str(), &strategy), "strategy");
    check(wsync_strategy_create_init_info(strategy, &init), "init info");
    check(wsync_sender_create(strategy, init.data, init.size, &sender), "sender");
    if (a.arena) {
        void *base;
        uint64_t have;
        check(wsync_sender_arena(sender, &base, &have), "arena");
        if (!base || have < arena_bytes) die("the sender has no arena of the size asked for");
        for (size_t i = 0; i < model.size(); ++i)
            desc[i].data = held[i] = static_cast<uint8_t *>(base) + arena_at[i];
    }

    // Planned once the tensors' addresses are final (the chunks hold copies of the descriptors).
    std::vector<std::vector<wsync_part_t>> parts;
    const auto chunks = plan_chunks(desc, chunk_bytes, a.split ? &parts : nullptr);
    r.chunks = chunks.size();
    size_t split_tensors = 0;  // tensors that cross in parts: count their first parts
    for (const auto &c : parts)
        for (const wsync_part_t &pt : c) split_tensors += pt.bytes != 0 && pt.offset == 0;
    std::vector<uint8_t> payload;
    for (uint32_t i = 0; i < a.receivers; ++i)
        if (!send_frame(to[i], kInit, init.data, init.size)) die("engine pipe closed");
    for (uint32_t i = 0; i < a.receivers; ++i) expect(i, kReady, &payload);

    if (progress)
        std::printf("model: %.1f MB bf16, %zu tensors, %zu chunks (<= %.0f MB, %zu tensor(s) in parts), "
                    "%u engine(s), buckets %u x %.0f MB, checksums %s%s%s\n",
                    r.bytes / 1e6, r.tensors, r.chunks, chunk_bytes / 1048576.0, split_tensors,
                    a.receivers, a.buckets, bucket / 1048576.0, checksum ? "on" : "off",
                    a.arena ? ", model in the sender's arena (sent in place)" : "",
                    a.gpu ? ", model on GPU 0 on both sides" : "");
    for (uint64_t step = 1; step <= a.steps; ++step) {
        // The trainer's step writes its weights (after the last flush: arena tensors are the
        // engines' to read until then).
        for (size_t i = 0; i < model.size(); ++i) fill(held[i], model[i].bytes, step, i);
        for (size_t i = 0; i < on_gpu.size(); ++i)
            if (cu::api.MemcpyHtoD(on_gpu[i], held[i], model[i].bytes) != 0) die("uploading the model to GPU 0 failed");
        auto t0 = Clock::now();
        for (size_t c = 0; c < chunks.size(); ++c) {
            wsync_chunk_t ch{chunks[c].data(), chunks[c].size(),
                             c + 1 == chunks.size() ? WSYNC_CHUNK_LAST : 0u, 0};
            wsync_blob_t req;
            check(wsync_sender_send_parts(sender, &ch, a.split ? parts[c].data() : nullptr, &req),
                  "send_chunk");
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
    cu::free_each(on_gpu);

    if (baselines == Baselines::None) return r;
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
    // Two threads, each copying a contiguous half of the model's bytes (one tensor may be cut
    // in two), at the same time.
    if (baselines == Baselines::AndTwoThreads) {
        Params dst(model, 0);
        uint64_t total = 0;
        for (const auto &t : model) total += t.bytes;
        auto copy_range = [&](uint64_t from, uint64_t to) {
            uint64_t at = 0;
            for (size_t i = 0; i < model.size() && at < to; at += model[i].bytes, ++i) {
                uint64_t lo = std::max(from, at), hi = std::min(to, at + model[i].bytes);
                if (lo < hi) std::memcpy(dst.at[i] + (lo - at), weights[i].data() + (lo - at), hi - lo);
            }
        };
        double best = 1e9;
        for (int rep = 0; rep < 3; ++rep) {
            auto t0 = Clock::now();
            std::thread other(copy_range, total / 2, total);
            copy_range(0, total / 2);
            other.join();
            best = std::min(best, since(t0));
        }
        r.memcpy_two_threads_s = best;
    }
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
    std::printf("%-28s %s\n", "checksums", a.checksum ? "on (tree hash)" : "off");
    if (a.arena) std::printf("%-28s %s\n", "trainer's tensors", "in the sender's arena (sent in place)");
    std::printf("%-28s %.3f s\n", "first sync", r.step_s[0]);
    std::printf("%-28s %.3f s\n", "steady-state sync (median)", steady);
    std::printf("%-28s %.2f GB/s\n", "steady-state throughput", r.bytes / steady / 1e9);
    std::printf("%-28s %.3f s (%.2f GB/s)\n", "one-core memcpy, same bytes", r.memcpy_s,
                r.bytes / r.memcpy_s / 1e9);
    std::printf("%-28s %.2fx\n", "sync / memcpy", steady / r.memcpy_s);
    std::printf("\nevery engine verified every tensor at every step: OK\n");
    return 0;
}

namespace {
// One mode's figures over the rounds: steady sync per round and its ratio to a reference of the
// same round (memcpy, or another mode).
struct Series {
    std::vector<double> steady, ratio;
    double med_steady() const { return median(steady); }
    double med_ratio() const { return median(ratio); }
    std::string range() const {
        char buf[64];
        std::snprintf(buf, sizeof buf, "[%.3f, %.3f]", *std::min_element(ratio.begin(), ratio.end()),
                      *std::max_element(ratio.begin(), ratio.end()));
        return buf;
    }
};
}  // namespace

int cmd_bench(const Args &a) {
    if (a.strategy == "cuda_ipc") return cmd_bench_cuda_ipc(a);
    if (a.strategy == "ucx") return cmd_bench_ucx(a);
    // Every mode once per round, in turn: packed (checksums as asked, or off then on), the
    // engines' parameters page-aligned, the model in the sender's arena off and on. Engines'
    // parameters sit at --dst-offset (64 by default, as PyTorch places them); page-aligned is
    // the flattering case, reported beside it. Ratios are taken within a round and the median
    // over rounds is reported with its range: on a shared host a whole minute can run at two
    // thirds of its memory speed, and it must fall on every mode alike.
    const bool base_checksum = a.checksum && !a.checksum_compare;
    Args page = a;
    page.dst_offset = 0;
    Args in_arena = a;
    in_arena.arena = true;
    const bool arena = a.arena_compare && !a.arena;
    RunResult first;
    std::vector<double> memcpy_s, memcpy_offset_s, memcpy_two_s, two_over_one;
    Series packed, on, extra, paged, ar_off, ar_on, ar_over_packed;
    for (uint32_t round = 0; round < a.rounds; ++round) {
        RunResult r = run_sync(a, base_checksum, !a.json && round == 0, Baselines::AndTwoThreads);
        if (round == 0) first = r;
        const double m = r.memcpy_s, steady = r.steady_s();
        memcpy_s.push_back(m);
        memcpy_offset_s.push_back(r.memcpy_offset_s);
        memcpy_two_s.push_back(r.memcpy_two_threads_s);
        two_over_one.push_back(m / r.memcpy_two_threads_s);
        packed.steady.push_back(steady);
        packed.ratio.push_back(steady / m);
        if (a.checksum_compare) {
            const double s = run_sync(a, true, false, Baselines::None).steady_s();
            on.steady.push_back(s);
            on.ratio.push_back(s / m);
            extra.steady.push_back(s - steady);
            extra.ratio.push_back(s / steady - 1);
        }
        if (a.dst_offset != 0) {
            const double s = run_sync(page, base_checksum, false, Baselines::None).steady_s();
            paged.steady.push_back(s);
            paged.ratio.push_back(s / m);
        }
        if (arena) {
            const double off = run_sync(in_arena, false, false, Baselines::None).steady_s();
            const double with = run_sync(in_arena, true, false, Baselines::None).steady_s();
            ar_off.steady.push_back(off);
            ar_off.ratio.push_back(off / m);
            ar_over_packed.ratio.push_back(off / steady);
            ar_on.steady.push_back(with);
            ar_on.ratio.push_back(with / m);
        }
        if (!a.json && a.rounds > 1)
            std::printf("round %u of %u: packed %.3f s (%.2fx memcpy)\n", round + 1, a.rounds, steady,
                        steady / m);
    }
    std::string copy_json;
    if (a.copy_bench) {
        const auto model = make_model(a.size_mb << 20);
        std::vector<uint64_t> sizes;
        for (const auto &t : model) sizes.push_back(t.bytes);
        copy_json = bench_copy_json(sizes, a.chunk_mb << 20, a.dst_offset, !a.json);
    }
    double meta = metadata_us_per_tensor();
    // Without --copy-threads the option is not passed and the library picks the count itself
    // (one per CPU the process may use, capped: "wsync options shm"); no call reports what it
    // picked, so the figure is null and "copy_threads_source" says the default applied.
    std::string copy_threads =
        a.copy_threads >= 0
            ? std::to_string(a.copy_threads) + ", \"copy_threads_source\": \"flag\""
            : std::string("null, \"copy_threads_source\": \"default\"");
    const double steady = packed.med_steady();
    std::printf("{\"strategy\": \"shm\", \"bytes\": %" PRIu64 ", \"tensors\": %zu, \"chunks\": %zu, "
                "\"receivers\": %u, \"checksum\": %s, \"load\": \"%s\", \"split\": %s, \"dst_offset\": %" PRIu64
                ", \"copy_threads\": %s, \"rounds\": %u, \"first_sync_s\": %.6f, "
                "\"steady_sync_s\": %.6f, \"steady_gbps\": %.3f, \"memcpy_s\": %.6f, "
                "\"memcpy_at_dst_offset_s\": %.6f, \"memcpy_two_threads_s\": %.6f, "
                "\"two_threads_over_one\": %.3f, "
                "\"ratio_to_memcpy\": %.3f, \"ratio_to_memcpy_range\": %s, "
                "\"steady_sync_s_per_round\": %s, \"steps_s\": %s, \"metadata_us_per_tensor\": %.3f",
                first.bytes, first.tensors, first.chunks, a.receivers, base_checksum ? "true" : "false",
                a.load_copy ? "copy" : "memcpy", a.split ? "true" : "false", a.dst_offset,
                copy_threads.c_str(), a.rounds, first.step_s[0], steady, first.bytes / steady / 1e9,
                median(memcpy_s), median(memcpy_offset_s), median(memcpy_two_s), median(two_over_one),
                packed.med_ratio(), packed.range().c_str(), json_list(packed.steady).c_str(),
                json_list(first.step_s).c_str(), meta);
    if (a.checksum_compare)
        std::printf(", \"checksum_on\": {\"steady_sync_s\": %.6f, \"ratio_to_memcpy\": %.3f, "
                    "\"extra_s\": %.6f, \"extra_fraction\": %.3f, \"extra_fraction_per_round\": %s}",
                    on.med_steady(), on.med_ratio(), extra.med_steady(), extra.med_ratio(),
                    json_list(extra.ratio, "%.3f").c_str());
    if (a.dst_offset != 0)
        std::printf(", \"page_aligned\": {\"steady_sync_s\": %.6f, \"ratio_to_memcpy\": %.3f}",
                    paged.med_steady(), paged.med_ratio());
    if (arena)
        std::printf(", \"arena\": {\"steady_sync_s\": %.6f, \"ratio_to_memcpy\": %.3f, "
                    "\"ratio_to_memcpy_range\": %s, "
                    "\"ratio_to_packed\": %.3f, \"checksum_on_steady_sync_s\": %.6f, "
                    "\"checksum_on_ratio_to_memcpy\": %.3f}",
                    ar_off.med_steady(), ar_off.med_ratio(), ar_off.range().c_str(),
                    ar_over_packed.med_ratio(), ar_on.med_steady(), ar_on.med_ratio());
    if (!copy_json.empty()) std::printf(", \"copy\": %s", copy_json.c_str());
    std::printf("}\n");
    return 0;
}

}  // namespace wsync_cli
