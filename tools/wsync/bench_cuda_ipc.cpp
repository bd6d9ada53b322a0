// wsync bench --strategy cuda_ipc: GPU 0 to GPU 0 between two processes through CUDA IPC,
// against one device copy of the same bytes in the same run.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <dlfcn.h>
#include <signal.h>
#include <stdexcept>
#include <sys/wait.h>
#include <type_traits>
#include <unistd.h>
#include <unordered_map>

#include "cli.hpp"
#include "cuda_driver.hpp"

namespace wsync_cli {
namespace {


// The engine loads each chunk with one wsync_recv_apply into a destination table over its own
// parameters (one kernel launch a chunk, the library ordering it before the acknowledgement), or
// with `views` as a loader without tables does: a cuMemcpyDtoDAsync out of each view, then a
// synchronisation before the chunk ends.
int gpu_engine_main(int in, int out, const std::vector<TensorSpec> &model, int timeout_ms, bool views_load) {
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
        wsync_dest_table_t *table = nullptr;
        for (;;) {
            if (!recv_frame(in, &type, &frame, timeout_ms)) return fail("controller went silent");
            if (type == kQuit) break;
            if (type == kRequest) {
                wsync_recv_t *it;
                if (wsync_receiver_receive(receiver, frame.data(), frame.size(), &it) != WSYNC_OK)
                    return fail(wsync_last_error());
                if (!views_load) {
                    if (!table) {  // made once, at the first chunk (its dtype is the model's)
                        wsync_tensor_t first;
                        if (wsync_recv_peek(it, 0, &first) != WSYNC_OK) return fail(wsync_last_error());
                        std::vector<wsync_dest_t> dests(model.size());
                        for (size_t i = 0; i < model.size(); ++i) {
                            dests[i] = wsync_dest_t{};
                            dests[i].name = model[i].name.c_str();
                            dests[i].data = reinterpret_cast<void *>(params[i]);
                            dests[i].shape = model[i].shape.data();
                            dests[i].ndim = int32_t(model[i].shape.size());
                            dests[i].dtype = first.dtype;
                        }
                        if (wsync_dest_table_create(receiver, dests.data(), dests.size(), &table) != WSYNC_OK)
                            return fail(wsync_last_error());
                    }
                    wsync_apply_result_t res{};
                    res.struct_size = sizeof res;
                    if (wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, &res) != WSYNC_OK ||
                        wsync_recv_end(it) != WSYNC_OK)
                        return fail(wsync_last_error());
                    views += res.tensors;
                    continue;
                }
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
        wsync_dest_table_destroy(table);
        wsync_strategy_destroy(strategy);
        cu::free_each(params);
    } catch (const std::exception &e) {
        return fail(e.what());
    }
    return 0;
}


}  // namespace

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
        std::_Exit(gpu_engine_main(p1[0], p2[1], model, poll_ms, a.load_views));
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
    const auto chunks = plan_chunks(desc, bucket);
    r.chunks = chunks.size();
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
    if (a.json) {
        std::printf("{\"strategy\": \"cuda_ipc\", \"packed\": %s, \"dtype\": \"%s\", \"bytes\": %" PRIu64
                    ", \"tensors\": %zu, \"chunks\": %zu, \"bucket_bytes\": %" PRIu64
                    ", \"buckets\": %u, \"first_sync_s\": %.6f, \"steady_sync_s\": %.6f, "
                    "\"steady_gbps\": %.3f, \"baseline_d2d_s\": %.6f, \"ratio_to_d2d\": %.3f, "
                    "\"steps_s\": %s, \"plan_us_per_tensor\": %.3f, "
                    "\"metadata_us_per_tensor\": %.3f}\n",
                    a.packed ? "true" : "false", a.dtype.c_str(), r.bytes, r.tensors, r.chunks,
                    bucket, buckets, r.step_s[0], steady, r.bytes / steady / 1e9, d2d, ratio,
                    json_list(r.step_s).c_str(), plan_s / r.tensors * 1e6, meta);
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

}  // namespace wsync_cli
