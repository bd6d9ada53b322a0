// wsync, the command-line tool: what its subcommands share (see main.cpp for the overview).
// Every file of the tool uses only the public header and the shared library.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "wsync.h"

namespace wsync_cli {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Exit 1 with the message (a failed run).
[[noreturn]] void die(const std::string &what);
// Exit 2 with the message: bad command lines, like the other usage errors.
[[noreturn]] void usage_error(const std::string &what);
// die() naming the call, the status and the library's message unless st is WSYNC_OK.
void check(wsync_status_t st, const char *what);

// --- options (args.cpp) -------------------------------------------------------------------------
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
    // bench --strategy ucx: UCX_TLS and UCX_NET_DEVICES for both sides and the raw baseline
    std::string transports = "tcp", net_devices = "lo";
    std::string engine_netns;  // engines (and the raw GET client) join this network namespace
    // ucx: the trainer keeps the model on GPU 0 and each engine loads into GPU 0 memory
    // ("device": 0, wsync_recv_copy into device memory); WSYNC_CUDA_LIBRARY, else libcuda.so.1.
    bool gpu = false;
    // Where engines' parameters start past a page boundary: 64 is how PyTorch's CPU allocator
    // (posix_memalign(64)) places large tensors; 0 is page-aligned, the flattering case.
    uint64_t dst_offset = 64;
    bool load_copy = true;   // engines load with wsync_recv_copy (else next_part + memcpy)
    bool load_views = false; // cuda_ipc engines copy out of views (else wsync_recv_apply)
    // shm, ucx: engines load each chunk with one wsync_recv_apply into a destination table over
    // their parameters; with load_land (ucx) they also land it (wsync_receiver_land), so the
    // chunk's bytes go from the socket straight into the parameters. ucx's default: land.
    bool load_table = false, load_land = false, load_set = false;
    bool split = true;       // tensors larger than a chunk cross in parts (else chunks grow)
    bool copy_bench = true;  // bench: the receiver copy loop against memcpy, in process
    bool arena = false;      // the trainer keeps the model in the sender's arena (shm)
    bool arena_compare = true;  // bench: also run with the model in the arena, off and on
    int copy_threads = -1;      // shm, ucx: the "copy_threads" option of both sides; -1: default
    // bench (shm): every mode runs once per round, in turn, and each ratio is taken within a
    // round, so a slow minute of a shared host falls on every mode alike.
    uint32_t rounds = 3;
};

// Flags from argv[first]; `bench` admits the bench-only flags and its defaults.
Args parse_args(int argc, char **argv, int first, bool bench);
// An unsigned flag value in [lo, hi]; usage_error() naming the flag otherwise.
uint64_t parse_uint(const std::string &flag, const char *v, uint64_t lo, uint64_t hi);

// --- the synthetic model (model.cpp) ------------------------------------------------------------
struct TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t bytes;
};

// A Llama-shaped model of about `bytes` in bf16: embeddings, per layer q/k/v/o and gate/up/down
// projections and two norms, a final norm and lm_head. Dimensions shrink for small sizes.
std::vector<TensorSpec> make_model(uint64_t bytes);

// Tensor t's bytes at `step`: every 8-byte word changes every step. Engines regenerate the same
// to verify what arrived, independently of the library.
void fill(uint8_t *p, uint64_t n, uint64_t step, uint64_t t);
bool verify(const uint8_t *p, uint64_t n, uint64_t step, uint64_t t);

// Pre-faulted buffers, one per tensor: first-touch costs belong to nobody's sync time.
std::vector<std::vector<uint8_t>> allocate(const std::vector<TensorSpec> &m);

// Pre-faulted destinations as an engine's allocator places them: each tensor at `offset` bytes
// past a page boundary (PyTorch's large CPU tensors: 64).
struct Params {
    uint8_t *base = nullptr;
    std::vector<uint8_t *> at;
    Params(const std::vector<TensorSpec> &m, uint64_t offset);
    ~Params();
    Params(const Params &) = delete;
    Params &operator=(const Params &) = delete;
};

// The library's plan of `desc` into chunks of about chunk_bytes: each chunk's descriptors. With
// `parts` the plan splits tensors larger than chunk_bytes ("split": true) and (*parts)[c] holds
// chunk c's ranges for wsync_sender_send_parts(); without it no tensor is split.
std::vector<std::vector<wsync_tensor_t>> plan_chunks(const std::vector<wsync_tensor_t> &desc,
                                                     uint64_t chunk_bytes,
                                                     std::vector<std::vector<wsync_part_t>> *parts = nullptr);

// --- frames over pipes (model.cpp) --------------------------------------------------------------
// Controller and engines exchange length-prefixed frames that carry only bytes.
enum Frame : uint32_t { kInit = 1, kRequest, kStepEnd, kQuit, kReady, kStepOk, kStepFail };
bool send_frame(int fd, uint32_t type, const void *p, uint64_t n);
// False on timeout, EOF, or a frame over 1 GiB.
bool recv_frame(int fd, uint32_t *type, std::vector<uint8_t> *payload, int timeout_ms);

struct StepReport {
    uint64_t step, completed_version;
    double load_s;
};

// --- a sync run's figures (shm_sync.cpp) ---------------------------------------------------------
struct RunResult {
    uint64_t bytes = 0;
    size_t tensors = 0, chunks = 0;
    std::vector<double> step_s;
    double memcpy_s = 0;         // one core, page-aligned destination
    double memcpy_offset_s = 0;  // one core, destination at the engines' --dst-offset
    // Two threads each copying half the bytes with glibc memcpy at once (page-aligned
    // destination): how much of the host's memory bandwidth a second core adds. Not a floor
    // for the sync: the library's copy loop moves more bytes per second than glibc's memcpy.
    double memcpy_two_threads_s = 0;
    double steady_s() const;  // median of the steps after the first
};

// The in-process memcpy baselines run_sync measures after the run (each copies the model
// again, three times, into freshly allocated buffers): none, one core (memcpy_s and
// memcpy_offset_s), or those and two threads at once (memcpy_two_threads_s).
enum class Baselines { None, OneCore, AndTwoThreads };
// One run of the synthetic model through a.strategy ("shm" or "ucx") with a.receivers forked
// engines that verify every step; `progress` prints each step.
RunResult run_sync(const Args &a, bool checksum, bool progress,
                   Baselines baselines = Baselines::OneCore);
// The median of v (the upper one of an even count), 0 when v is empty.
double median(std::vector<double> v);
// v as a JSON array, each value printed with fmt.
std::string json_list(const std::vector<double> &v, const char *fmt = "%.6f");
// The kind's options for this run: the strategy's own knobs from Args (arena_bytes: shm's
// "arena_bytes", 0 for none).
std::string kind_options(const Args &a, bool checksum, uint64_t bucket_bytes, uint64_t arena_bytes = 0);

// Plan + request encode + decode per tensor, over 10,000 tiny tensors, in one process.
double metadata_us_per_tensor();

// --- subcommands --------------------------------------------------------------------------------
int cmd_demo(const Args &a);            // shm_sync.cpp
int cmd_bench(const Args &a);           // shm_sync.cpp; --strategy cuda_ipc goes to the next
int cmd_bench_cuda_ipc(Args a);         // bench_cuda_ipc.cpp
int cmd_bench_delta(int argc, char **argv, int first);  // bench_delta.cpp (--delta-fraction)
int cmd_bench_ucx(const Args &a);       // bench_ucx.cpp
// torch.distributed gloo broadcasting `bytes` from this process (rank 0, listening at
// trainer_address) to one in --engine-netns, over --net-devices (bench_gloo.cpp).
struct GlooRow {
    double steady_s = 0;  // median of the timed broadcasts; 0 with `why` set when there is none
    std::string python;   // the interpreter that ran it
    std::string why;
};
GlooRow gloo_broadcast(const Args &a, uint64_t bytes, const std::string &trainer_address);
int cmd_clean(int argc, char **argv);   // clean.cpp
// Moves this process into network namespace `name` (/run/netns/NAME); die() if it cannot.
void enter_netns(const std::string &name);  // bench_ucx.cpp

}  // namespace wsync_cli
