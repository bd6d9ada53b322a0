// The fake CUDA driver of libwsync_fakegpu.so: every function of WSYNC_CUDA_FUNCTIONS
// (src/gpu/api.hpp), exported under the driver's symbol names, so CI can run the GPU strategies'
// logic without a GPU. It proves logic, not hardware: "device memory" is host shared memory.
//
// What it mimics, and how:
// - Devices report compute capability 9.0 (cuDeviceGetAttribute), or WSYNC_FAKE_CUDA_CC.
// - Devices come from WSYNC_FAKE_CUDA_DEVICES (comma-separated UUIDs; default two devices,
//   GPU-0fa6e000-0000-4000-8000-000000000000 and GPU-1fa6e000-0000-4000-8000-000000000001),
//   filtered and reordered by CUDA_VISIBLE_DEVICES as the real driver does at cuInit: ordinals or
//   "GPU-<uuid prefix>" entries; the first unknown, ambiguous or repeated entry hides itself and
//   everything after it; nothing left is CUDA_ERROR_NO_DEVICE. WSYNC_FAKE_CUDA_NO_DEVICE=1 makes
//   cuInit fail with CUDA_ERROR_NO_DEVICE. Every other call before a successful cuInit is
//   CUDA_ERROR_NOT_INITIALIZED.
// - Primary contexts are refcounted per device and made current per thread. Calls that need a
//   context (memory, IPC, stream/event/module creation, launches, cuCtxSynchronize) return
//   CUDA_ERROR_INVALID_CONTEXT without a current, retained one. When the last reference to a
//   primary context goes, the context is destroyed as the driver destroys it: its streams are
//   drained and destroyed, its events and modules go, and its memory and IPC mappings are
//   released (counted as "reclaimed", not as frees, so tests can spot leaks).
// - Device memory: each cuMemAlloc is a POSIX shm object "/wsync-fakecuda-<pid>-<n>" (0600),
//   reserved with posix_fallocate (so a full /dev/shm is CUDA_ERROR_OUT_OF_MEMORY, not a SIGBUS
//   later) and mapped read-write; the CUdeviceptr is the host address, so tests can read and
//   write device memory directly. cuMemFree synchronizes the process's streams first (like
//   cudaFree; a copy in flight never touches unmapped memory), unmaps and unlinks. Allocations
//   still alive at exit() are unlinked then (the driver frees device memory when a process
//   ends); a process that ends in _exit() or a signal leaves them in /dev/shm until the next
//   process's first allocation sweeps every dead pid's leftovers (sweep_dead_namesakes).
// - CUDA IPC: the 64-byte handle holds a magic, the owner's pid, the allocation's serial number
//   (pid and serial give the shm name), its size and the owner device's UUID; it is the same
//   bytes every time for one allocation. Opening maps the shm object in another process; the
//   same process is refused (CUDA_ERROR_INVALID_CONTEXT, as the driver refuses it); repeated
//   opens of one handle return the same address and are refcounted (each open needs a close; the
//   last close synchronizes the process's streams and unmaps); a freed allocation is
//   CUDA_ERROR_INVALID_HANDLE; a handle from a GPU this process cannot see (CUDA_VISIBLE_DEVICES)
//   is CUDA_ERROR_INVALID_DEVICE. The mapping counts as an allocation of the opener's current
//   device for cuMemGetAddressRange and cuPointerGetAttribute, with a buffer id of its own.
// - Freeing memory another process has mapped: "Calling cuMemFree on an exported memory region
//   before calling cuIpcCloseMemHandle in the importing context will result in undefined
//   behavior" (cuda.h, cuIpcOpenMemHandle). Every IPC mapping leaves a marker in /dev/shm
//   ("/wsyncfk-imp-<owner pid>-<serial>-<opener pid>", removed by the last close, the context's
//   end or the opener's exit); a cuMemFree (or context destruction) of an allocation whose marker
//   names a live opener is counted (wsync_fake_freed_while_imported) and printed to stderr.
// - Virtual-memory spans: wsync_fake_mem_alloc_span() maps one contiguous range as several
//   pieces (PyTorch's expandable segments map 20 MiB physical handles): each piece is an
//   allocation of its own to cuMemGetAddressRange and cuPointerGetAttribute (its own buffer id,
//   its own range, as the driver answers for one handle), not exportable, and a kernel or copy
//   may read and write across pieces of one span (not across plain allocations that happen to
//   be adjacent). cuMemFree of a piece's base frees that piece (as cuMemUnmap + cuMemRelease).
// - Non-exportable memory: wsync_fake_mem_alloc_unexportable() makes device memory as a
//   stream-ordered pool (cudaMallocAsync) or PyTorch's expandable segments do:
//   cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) says 0 and
//   cuIpcGetMemHandle fails with CUDA_ERROR_INVALID_VALUE. Other memory says 1.
// - wsync_fake_stream_hold() parks a stream, the NULL stream included (a collective or a kernel
//   that does not finish), until wsync_fake_stream_release_held(), so tests can see who waits
//   for which stream.
// - Streams: one worker thread per stream runs enqueued operations in order; the NULL stream is
//   one more such queue per process. Device addresses are checked when an operation runs: a range
//   outside every allocation (NULL included) fails the operation like a device fault, and the
//   stream is failed for good: it runs nothing more, and cuStreamQuery, and cuEventQuery of an
//   event recorded at or after the failure, say CUDA_ERROR_ILLEGAL_ADDRESS at once. The real
//   driver makes such an error sticky for the whole context; here it is the stream (and
//   cuCtxSynchronize, which waits for every stream of the process and reports any failed one).
//   cuStreamDestroy drains the stream before it returns (the driver returns at once and frees
//   the stream later).
//   Two test controls (fake_gpu.h) make the GPU late, as a busy one is: with
//   wsync_fake_set_stream_delay_ms an operation starts only after that delay, or once something
//   waits for it (cuEventQuery/cuStreamQuery/cuStreamWaitEvent/synchronisation), so work that
//   nobody waits for is visibly not done yet; wsync_fake_stream_hold (above) stops a stream, and
//   wsync_fake_stream_hold_next makes the next streams created start held (a library's own
//   stream, whose handle a test never sees).
// - cuMemcpyHtoDAsync copies the host source before it returns, as the driver does for pageable
//   host memory (libwsync has no pinned memory); the device write happens in stream order.
// - Modules: only PTX text that declares at least one of the library's kernels (".entry
//   wsync_pack", the delta kernels of src/gpu/kernels/delta_abi.hpp) loads, and
//   cuModuleGetFunction finds only the ones it declares; cuLaunchKernel runs a host emulation of
//   the kernel in stream order (run_pack, run_piece_hash, run_delta_diff, run_patch, run_apply), written
//   from the ABI's description rather than from the .cu, and stricter: it checks every address
//   and the launch's tile count first, and a cast whose float32 source is off a 4-byte boundary
//   faults (CUDA_ERROR_MISALIGNED_ADDRESS) as it does on an H200. A launch into a stream
//   of another device's context is CUDA_ERROR_INVALID_HANDLE.
// - fork(): the child starts with no contexts, memory, streams, modules or communicators (its
//   parent's worker threads do not exist there), zeroed counters and the pending failure
//   injections. As with the real driver, a child forked after a successful cuInit cannot use
//   the driver: every call there, cuInit included, is CUDA_ERROR_NOT_INITIALIZED; a child of a
//   process that never initialised may cuInit itself (so engines are forked before the parent
//   touches the driver, as they must be on hardware). Only the fake's self-test lifts the rule
//   (wsync_fake_allow_driver_after_fork) to check its own cross-process mechanisms.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "fake_gpu.h"
#include "fake_internal.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "gpu/kernels/xxh3.h"

using namespace wsync_fake;

// Every driver entry point, declared from the X-macro itself: exported under its symbol name
// (cuMemAlloc_v2 ...) with exactly the contract's signature. A definition below that differs
// from the contract does not compile ("conflicting declaration of C function").
#define WSYNC_FAKE_DECLARE(field, symbol, ret, params)                                           \
    extern "C" __attribute__((visibility("default"))) ret field params __asm__(symbol);
WSYNC_CUDA_FUNCTIONS(WSYNC_FAKE_DECLARE)
#undef WSYNC_FAKE_DECLARE

#define WSYNC_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace wsync_fake {

constexpr int kMaxDevices = 64;
constexpr int kDriverVersion = 13000;  // CUDA 13.0
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxStaticSharedBytes = 48 * 1024;

void poll_sleep() {
    struct timespec ts = {0, 100 * 1000};
    nanosleep(&ts, nullptr);
}

// ---- streams ----------------------------------------------------------------------------------
// Test control of stream timing (fake_gpu.h): every operation enqueued while the delay is set
// waits that long before it starts unless something waits for it.
std::atomic<int> g_stream_delay_ms{0};

struct Stream {
    explicit Stream(int dev) : device(dev) { worker = std::thread([this] { run(); }); }
    // cuStreamDestroy and context destruction stop the worker while they still hold a
    // reference, so this only joins a finished thread (the NULL stream is never destroyed).
    ~Stream() { shutdown(); }

    // Appends an operation; returns its sequence number (1, 2, ...).
    uint64_t push(Op op) {
        std::lock_guard<std::mutex> lk(m);
        ++enq;
        if (int ms = g_stream_delay_ms.load()) op = deferred(std::move(op), enq, ms);
        q.emplace_back(enq, std::move(op));
        cv.notify_all();
        return enq;
    }
    // A GPU busy elsewhere: `op` starts `ms` after now, or as soon as something waits for
    // operation `seq` (a query, a synchronisation, another stream's wait: see kick_locked).
    Op deferred(Op op, uint64_t seq, int ms) {
        const auto due = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        return [this, op = std::move(op), seq, due]() -> CUresult {
            {
                std::unique_lock<std::mutex> lk(m);
                cv.wait_until(lk, due, [&] { return kicked >= seq || stop; });
            }
            return op();
        };
    }
    // Someone waits for operation `seq`: deferred operations up to it start now. Holds m.
    void kick_locked(uint64_t seq) {
        if (seq > kicked) {
            kicked = seq;
            cv.notify_all();
        }
    }
    // Waits until operation `seq` (and everything before it) has completed.
    void wait(uint64_t seq) {
        std::unique_lock<std::mutex> lk(m);
        kick_locked(seq);
        cv.wait(lk, [&] { return done >= seq; });
    }
    // Waits for everything enqueued before the call (not for what others enqueue meanwhile).
    void drain() {
        uint64_t seq;
        {
            std::lock_guard<std::mutex> lk(m);
            seq = enq;
        }
        wait(seq);
    }
    // cuStreamQuery: failed, drained, or not yet.
    CUresult query() {
        std::lock_guard<std::mutex> lk(m);
        kick_locked(enq);
        if (failed_seq) return CUDA_ERROR_ILLEGAL_ADDRESS;
        return done >= enq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    }
    // For events and waits: operation `seq` failed or comes after a failure (at once, as the
    // driver reports a sticky error), has completed, or not yet.
    CUresult query_seq(uint64_t seq) {
        std::lock_guard<std::mutex> lk(m);
        kick_locked(seq);
        if (failed_seq && failed_seq <= seq) return CUDA_ERROR_ILLEGAL_ADDRESS;
        return done >= seq ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    }
    bool has_failed() {
        std::lock_guard<std::mutex> lk(m);
        return failed_seq != 0;
    }
    // Drains, then stops and joins the worker. Idempotent.
    void shutdown() {
        {
            std::lock_guard<std::mutex> lk(m);
            stop = true;
            cv.notify_all();
        }
        if (worker.joinable()) worker.join();
    }

    void run() {
        std::unique_lock<std::mutex> lk(m);
        for (;;) {
            cv.wait(lk, [&] { return stop || !q.empty(); });
            if (q.empty()) return;  // stopping, and drained
            uint64_t seq = q.front().first;
            Op op = std::move(q.front().second);
            q.pop_front();
            const bool skip = failed_seq != 0;  // a failed stream runs nothing more
            lk.unlock();
            CUresult rc = skip ? CUDA_SUCCESS : op();
            op = nullptr;  // release what it holds before it counts as complete
            lk.lock();
            if (rc != CUDA_SUCCESS && !failed_seq) failed_seq = seq;
            if (rc != CUDA_SUCCESS) g_stream_failures.fetch_add(1);
            done = seq;
            cv.notify_all();
        }
    }

    static std::atomic<long long> g_stream_failures;

    std::mutex m;
    std::condition_variable cv;  // queue changes and completions
    std::deque<std::pair<uint64_t, Op>> q;
    uint64_t enq = 0;         // last sequence number handed out
    uint64_t done = 0;        // last sequence number completed
    uint64_t failed_seq = 0;  // first operation that failed; 0 while healthy
    uint64_t kicked = 0;      // deferred operations up to this one start at once
    bool stop = false;
    const int device;         // -1: the NULL stream
    std::thread worker;       // last: starts once the rest is built
};
std::atomic<long long> Stream::g_stream_failures{0};

struct Event {
    std::mutex m;
    std::shared_ptr<Stream> stream;  // of the last cuEventRecord; null: never recorded
    uint64_t seq = 0;
    int device;
};

// The kernels the fake can run: the library's, by their names in the PTX.
enum KernelId {
    kKPack, kKPieceHash, kKDeltaCount, kKDeltaCompact, kKPatchScatter, kKApplyBegin, kKApplyEnd,
    kKernelCount
};
constexpr const char *kKernelNames[kKernelCount] = {kPackKernel,       kPieceHashKernel,
                                                    kDeltaCountKernel, kDeltaCompactKernel,
                                                    kPatchScatterKernel, kApplyBeginKernel,
                                                    kApplyEndKernel};

struct Module {
    int device;
    bool has[kKernelCount] = {};  // the entries its PTX declares
    char tokens[kKernelCount] = {};  // &tokens[k] is the CUfunction of kernel k
};
// A CUfunction: the module that holds it, and which kernel.
struct Function {
    std::shared_ptr<Module> module;
    KernelId kernel;
};

// An allocation, or an IPC mapping, of this process.
struct Alloc {
    uint64_t size = 0;     // as asked for (the mapping is rounded up to pages)
    uint64_t map_len = 0;
    std::string name;      // shm name; the owner's for an IPC mapping
    int device = 0;        // visible ordinal
    uint64_t buffer_id = 0;
    uint64_t serial = 0;   // for IPC handles (owned allocations)
    bool ipc = false;      // opened from a handle
    int refs = 0;          // IPC opens not yet closed
    bool unexportable = false;  // wsync_fake_mem_alloc_unexportable
    bool pinned_host = false;   // cuMemHostAlloc: host memory kernels reach (DEVICEMAP)
    bool device_mapped = false; // pinned_host allocated with CU_MEMHOSTALLOC_DEVICEMAP
    uint64_t span = 0;          // wsync_fake_mem_alloc_span: the span's number (0: none)
    bool vmm_mapped = false;    // cuMemMap of an imported handle (freed by cuMemUnmap only)
};

// A physical allocation's handle (cuMemRetainAllocationHandle of a span's piece, or
// cuMemImportFromShareableHandle of a descriptor): what it maps.
struct MemHandle {
    std::string name;  // retained: the piece's shm name
    int fd = -1;       // imported: this process's own duplicate of the descriptor
    uint64_t size = 0;
};

// ---- per-process state ------------------------------------------------------------------------
struct State {
    std::mutex mu;  // guards everything below; never held while waiting for a stream
    bool init_tried = false;
    CUresult init_rc = CUDA_ERROR_NOT_INITIALIZED;
    std::vector<CUuuid> visible;  // devices in ordinal order, after CUDA_VISIBLE_DEVICES
    int ctx_refs[kMaxDevices] = {};
    std::map<uint64_t, Alloc> allocs;  // by base address
    std::map<std::string, uint64_t> ipc_by_name;
    std::map<CUstream, std::shared_ptr<Stream>> streams;
    std::shared_ptr<Stream> null_stream;
    std::map<CUevent, std::shared_ptr<Event>> events;
    std::map<CUmodule, std::shared_ptr<Module>> modules;
    std::map<CUfunction, Function> functions;
    std::map<unsigned long long, MemHandle> mem_handles;  // by CUmemGenericAllocationHandle
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> reserved;  // base -> (size, span number)
    unsigned long long next_mem_handle = 0;
    uint64_t next_serial = 0;
    uint64_t next_buffer_id = 0;
    uint64_t next_span = 0;
    State *abandoned = nullptr;  // a forked child keeps the parent's state reachable, unused
};

State *&state_ptr() {
    static State *s = new State;  // never destroyed: worker threads may outlive static destructors
    return s;
}
State &st() { return *state_ptr(); }

// The primary contexts: CUcontext is the address of one of these bytes.
char g_ctx_token[kMaxDevices];
thread_local CUcontext t_current = nullptr;

CUcontext ctx_of(int dev) { return reinterpret_cast<CUcontext>(&g_ctx_token[dev]); }
int dev_of(CUcontext c) {
    auto p = reinterpret_cast<const char *>(c);
    if (p < g_ctx_token || p >= g_ctx_token + kMaxDevices) return -1;
    return static_cast<int>(p - g_ctx_token);
}

struct Counters {
    std::atomic<long long> allocs{0}, frees{0}, ipc_get_handle{0}, ipc_open{0}, ipc_close{0},
        kernel_launches{0}, memcpy_calls{0}, modules_loaded{0}, reclaimed{0}, host_allocs{0},
        host_frees{0};
    void reset() {
        for (auto *c : {&allocs, &frees, &ipc_get_handle, &ipc_open, &ipc_close, &kernel_launches,
                        &memcpy_calls, &modules_loaded, &reclaimed, &host_allocs, &host_frees})
            c->store(0);
    }
};
Counters g_count;

// With st().mu held.
CUresult ctx_device_locked(State &s, int *device) {
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    int d = t_current ? dev_of(t_current) : -1;
    if (d < 0 || d >= static_cast<int>(s.visible.size()) || s.ctx_refs[d] == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = d;
    return CUDA_SUCCESS;
}

CUresult current_device(int *device) {
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    return ctx_device_locked(s, device);
}

// The allocation containing address p, with st().mu held.
std::map<uint64_t, Alloc>::iterator containing_locked(State &s, uint64_t p) {
    auto it = s.allocs.upper_bound(p);
    if (it == s.allocs.begin()) return s.allocs.end();
    --it;
    return p - it->first < it->second.size ? it : s.allocs.end();
}

bool find_region(uint64_t p, uint64_t n, Region *out) {
    if (p == 0) return false;
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = containing_locked(s, p);
    if (it == s.allocs.end()) return false;
    if (n > it->second.size - (p - it->first)) {
        // A virtual-memory span (wsync_fake_mem_alloc_span): the next piece of the same span
        // follows at once, as mapped physical handles of one reserved range do; a kernel or
        // copy reads across them. Plain allocations that happen to be adjacent are not a span.
        if (!it->second.span || out) return false;
        uint64_t end = p + n, at = it->first + it->second.size;
        const uint64_t span = it->second.span;
        while (at < end) {
            auto next = s.allocs.find(at);
            if (next == s.allocs.end() || next->second.span != span) return false;
            at += next->second.size;
        }
        return true;
    }
    if (out) {
        out->name = it->second.name;
        out->base = it->first;
        out->size = it->second.size;
    }
    return true;
}

// Whether [p, p + n) lies in pinned host memory (cuMemHostAlloc) of this process.
bool pinned_host_range(uint64_t p, uint64_t n) {
    if (p == 0) return false;
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = containing_locked(s, p);
    return it != s.allocs.end() && it->second.pinned_host && n <= it->second.size - (p - it->first);
}

// Whether [p, p + n) starts inside an allocation and runs past its end (not along a span).
bool runs_past_its_allocation(uint64_t p, uint64_t n) {
    if (p == 0 || n == 0) return false;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = containing_locked(s, p);
        if (it == s.allocs.end() || n <= it->second.size - (p - it->first)) return false;
    }
    return !find_region(p, n, nullptr);
}

// Device access check made when an operation runs: the fake's "page fault".
bool device_range_ok(uint64_t p, uint64_t n) { return n == 0 || find_region(p, n, nullptr); }

CUresult get_stream(CUstream handle, std::shared_ptr<Stream> *out) {
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    const auto h = reinterpret_cast<uintptr_t>(handle);
    if (h <= 2) {  // 0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
        if (!s.null_stream) {
            try {
                s.null_stream = std::make_shared<Stream>(-1);
            } catch (const std::exception &) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        *out = s.null_stream;
        return CUDA_SUCCESS;
    }
    auto it = s.streams.find(handle);
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    *out = it->second;
    return CUDA_SUCCESS;
}

int stream_device(const Stream &s) { return s.device; }
void enqueue(Stream &s, Op op) { s.push(std::move(op)); }

// Waits for everything enqueued so far on every stream of the process. Returns whether any
// stream has failed.
bool sync_all_streams() {
    std::vector<std::shared_ptr<Stream>> all;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        for (auto &kv : s.streams) all.push_back(kv.second);
        if (s.null_stream) all.push_back(s.null_stream);
    }
    bool failed = false;
    for (auto &x : all) {
        x->drain();
        failed = failed || x->has_failed();
    }
    return failed;
}

// ---- imports of this process's memory by others ---------------------------------------------
std::atomic<long long> g_freed_while_imported{0};
constexpr const char *kAllocPrefix = "/wsync-fakecuda-";
constexpr const char *kImportPrefix = "wsyncfk-imp-";

// "/wsyncfk-imp-<owner pid>-<serial>-<opener pid>" for the allocation named `alloc_name`.
std::string import_marker(const std::string &alloc_name, long opener) {
    return "/" + std::string(kImportPrefix) + alloc_name.substr(std::strlen(kAllocPrefix)) + "-" +
           std::to_string(opener);
}

void mark_imported(const std::string &alloc_name) {
    int fd = shm_open(import_marker(alloc_name, getpid()).c_str(), O_CREAT | O_RDWR, 0600);
    if (fd >= 0) close(fd);
}
void unmark_imported(const std::string &alloc_name) {
    shm_unlink(import_marker(alloc_name, getpid()).c_str());
}

// Called as this process frees its allocation `alloc_name`: counts (and says) it when a live
// process still has it open; markers of dead openers are removed.
void check_not_imported(const std::string &alloc_name) {
    const std::string prefix = import_marker(alloc_name, 0).substr(1);
    const std::string want = prefix.substr(0, prefix.size() - 1);  // "...-<serial>-"
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    std::vector<long> live;
    while (struct dirent *e = readdir(d)) {
        if (std::strncmp(e->d_name, want.c_str(), want.size()) != 0) continue;
        long opener = std::atol(e->d_name + want.size());
        if (opener > 0 && (kill(static_cast<pid_t>(opener), 0) == 0 || errno == EPERM))
            live.push_back(opener);
        else
            shm_unlink(("/" + std::string(e->d_name)).c_str());
    }
    closedir(d);
    for (long pid : live) {
        g_freed_while_imported.fetch_add(1);
        std::fprintf(stderr,
                     "fake CUDA: %s freed while process %ld still has it open through "
                     "cuIpcOpenMemHandle (undefined behaviour on a real GPU)\n",
                     alloc_name.c_str(), pid);
    }
}

// ---- held streams (wsync_fake_stream_hold) ----------------------------------------------------
std::mutex g_hold_mu;
std::condition_variable g_hold_cv;
uint64_t g_hold_generation = 0;
std::atomic<int> g_hold_next{0};  // wsync_fake_stream_hold_next: streams still to create held

// Parks stream x until the next wsync_fake_stream_release_held().
void hold_stream(Stream &x) {
    uint64_t gen;
    {
        std::lock_guard<std::mutex> lk(g_hold_mu);
        gen = g_hold_generation;
    }
    x.push([gen]() -> CUresult {
        std::unique_lock<std::mutex> lk(g_hold_mu);
        g_hold_cv.wait(lk, [&] { return g_hold_generation > gen; });
        return CUDA_SUCCESS;
    });
}

// ---- failure injection ------------------------------------------------------------------------
struct Injection {
    std::string name;  // as given, "@async" included
    long remaining;    // calls still let through
    int result;
};
std::mutex g_inj_mu;
std::vector<Injection> g_injections;

bool inject_impl(const std::string &symbol, int *result) {
    std::lock_guard<std::mutex> lk(g_inj_mu);
    for (auto it = g_injections.begin(); it != g_injections.end(); ++it) {
        const std::string &n = it->name;
        bool match = n == symbol;
        // "cuMemAlloc" names cuMemAlloc_v2, "cuMemAlloc@async" names cuMemAlloc_v2@async.
        if (!match) {
            std::string plain = symbol, suffix;
            auto at = plain.find('@');
            if (at != std::string::npos) {
                suffix = plain.substr(at);
                plain.erase(at);
            }
            if (plain.size() > 3 && plain.compare(plain.size() - 3, 3, "_v2") == 0)
                match = n == plain.substr(0, plain.size() - 3) + suffix;
        }
        if (!match) continue;
        if (it->remaining > 0) {
            --it->remaining;
            return false;
        }
        *result = it->result;
        g_injections.erase(it);
        return true;
    }
    return false;
}

bool inject(const char *symbol, int *result) { return inject_impl(symbol, result); }
bool inject_async(const char *symbol, int *result) {
    return inject_impl(std::string(symbol) + "@async", result);
}

// ---- cuInit: devices --------------------------------------------------------------------------
int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// "GPU-<uuid>" or a bare uuid: 32 hex digits, dashes anywhere.
bool parse_uuid_text(std::string t, CUuuid *out) {
    if (t.size() >= 4 && strncasecmp(t.c_str(), "GPU-", 4) == 0) t.erase(0, 4);
    int nd = 0;
    unsigned char bytes[16] = {};
    for (char c : t) {
        if (c == '-') continue;
        int v = hexval(c);
        if (v < 0 || nd >= 32) return false;
        bytes[nd / 2] = static_cast<unsigned char>(bytes[nd / 2] | (nd % 2 ? v : v << 4));
        ++nd;
    }
    if (nd != 32) return false;
    std::memcpy(out->bytes, bytes, 16);
    return true;
}

// "0fa6e000-0000-4000-8000-000000000000": the text nvidia-smi shows after "GPU-".
std::string uuid_string(const CUuuid &u) {
    static const char *hex = "0123456789abcdef";
    std::string s;
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
        auto b = static_cast<unsigned char>(u.bytes[i]);
        s += hex[b >> 4];
        s += hex[b & 15];
    }
    return s;
}

std::string trim(const std::string &s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string &s) {
    std::vector<std::string> out;
    size_t start = 0;
    for (;;) {
        size_t comma = s.find(',', start);
        out.push_back(trim(s.substr(start, comma == std::string::npos ? comma : comma - start)));
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

CUresult init_devices(State &s) {
    const char *nodev = std::getenv("WSYNC_FAKE_CUDA_NO_DEVICE");
    if (nodev && std::strcmp(nodev, "1") == 0) return CUDA_ERROR_NO_DEVICE;
    std::vector<CUuuid> all;
    const char *list = std::getenv("WSYNC_FAKE_CUDA_DEVICES");
    if (list && *list) {
        for (const std::string &t : split(list)) {
            CUuuid u;
            if (!parse_uuid_text(t, &u)) {
                std::fprintf(stderr, "fake CUDA: WSYNC_FAKE_CUDA_DEVICES entry '%s' is not a UUID\n",
                             t.c_str());
                return CUDA_ERROR_INVALID_VALUE;
            }
            all.push_back(u);
        }
    } else {
        for (int i = 0; i < 2; ++i) {
            CUuuid u;
            char text[64];
            std::snprintf(text, sizeof text, "%xfa6e000-0000-4000-8000-00000000000%x", i, i);
            parse_uuid_text(text, &u);
            all.push_back(u);
        }
    }
    if (all.size() > static_cast<size_t>(kMaxDevices)) all.resize(kMaxDevices);
    const char *cvd = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        s.visible = all;
    } else {
        std::vector<int> chosen;
        for (const std::string &t : split(cvd)) {
            int pick = -1;
            if (!t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
                if (t.size() <= 4 && std::atoi(t.c_str()) < static_cast<int>(all.size()))
                    pick = std::atoi(t.c_str());
            } else if (t.size() > 4 && strncasecmp(t.c_str(), "GPU-", 4) == 0) {
                std::string prefix = t.substr(4);
                for (auto &c : prefix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
                for (size_t i = 0; i < all.size(); ++i) {
                    if (uuid_string(all[i]).compare(0, prefix.size(), prefix) != 0) continue;
                    if (uuid_string(all[i]).size() < prefix.size()) continue;
                    pick = pick == -1 ? static_cast<int>(i) : -2;  // -2: ambiguous
                }
            }
            if (pick < 0 || std::find(chosen.begin(), chosen.end(), pick) != chosen.end()) break;
            chosen.push_back(pick);
        }
        for (int i : chosen) s.visible.push_back(all[i]);
    }
    return s.visible.empty() ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

// ---- shm helpers ------------------------------------------------------------------------------
uint64_t page_round(uint64_t n) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    return (n + page - 1) / page * page;
}

std::string alloc_name(uint64_t pid, uint64_t serial) {
    return "/wsync-fakecuda-" + std::to_string(pid) + "-" + std::to_string(serial);
}

// The real driver frees a process's device memory when the process ends, however it ends. The
// fake's memory is a file in /dev/shm, which a process ending in _exit() or a signal leaves
// behind. So once per process, before its first allocation, the fake removes the allocations of
// every process that no longer exists:
// - those named for this very pid: an earlier process with the same pid that was killed (pids are
//   reused on a busy machine). Then counting "/dev/shm" entries of a pid counts what that live
//   process holds;
// - those of any other dead pid (kill(pid, 0) fails with ESRCH), so test runs whose children end
//   in _exit() or are killed do not pile up files on the machine; and the import markers
//   ("wsyncfk-imp-...") whose owner or opener is such a dead process.
// An object removed while another process still maps it stays readable there until that
// process unmaps it, as imported device memory of a dead owner does; opening its handle afresh
// fails (CUDA_ERROR_INVALID_HANDLE), as the driver's open of a dead owner's handle does.
void sweep_dead_namesakes() {
    static std::atomic<pid_t> swept{0};
    const pid_t me = getpid();
    if (swept.exchange(me) == me) return;
    const char *prefix = kAllocPrefix + 1;  // "wsync-fakecuda-"
    const size_t plen = std::strlen(prefix), mlen = std::strlen(kImportPrefix);
    const auto gone = [me](long pid) {
        return pid == me || (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
    };
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    std::vector<std::string> dead;
    while (struct dirent *e = readdir(d)) {
        char *end = nullptr;
        if (std::strncmp(e->d_name, prefix, plen) == 0) {
            const long pid = std::strtol(e->d_name + plen, &end, 10);
            if (pid <= 0 || end == e->d_name + plen || *end != '-') continue;
            if (gone(pid)) dead.push_back(e->d_name);
        } else if (std::strncmp(e->d_name, kImportPrefix, mlen) == 0) {
            // "wsyncfk-imp-<owner>-<serial>-<opener>": an import marker of a process that died
            // holding the mapping, or of memory whose owner died.
            const long owner = std::strtol(e->d_name + mlen, &end, 10);
            const char *last = std::strrchr(e->d_name, '-');
            const long opener = last ? std::atol(last + 1) : 0;
            if (owner <= 0 || opener <= 0) continue;
            if ((owner != me && gone(owner)) || (opener != me && gone(opener)))
                dead.push_back(e->d_name);
        }
    }
    closedir(d);
    for (const std::string &name : dead) shm_unlink(("/" + name).c_str());
}

// The IPC handle's layout (the rest of the 64 bytes is zero).
struct HandleData {
    uint32_t magic;
    uint32_t version;
    uint64_t pid;
    uint64_t serial;
    uint64_t size;
    unsigned char uuid[16];
};
static_assert(sizeof(HandleData) <= sizeof(CUipcMemHandle), "an IPC handle is 64 bytes");
constexpr uint32_t kHandleMagic = 0x43465357;  // "WSFC"

// Context destruction (the last cuDevicePrimaryCtxRelease): what the driver frees with it.
// Collected with st().mu held, in the same critical section as the release that dropped the
// count to 0, so a retain right after starts a new context that none of this touches.
struct Doomed {
    int device = -1;
    std::vector<std::shared_ptr<Stream>> streams;
    std::vector<uint64_t> allocs;  // bases
};

Doomed collect_context_locked(State &s, int dev) {
    Doomed d;
    d.device = dev;
    for (auto it = s.streams.begin(); it != s.streams.end();) {
        if (it->second->device == dev) {
            d.streams.push_back(it->second);
            it = s.streams.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = s.events.begin(); it != s.events.end();)
        it = it->second->device == dev ? s.events.erase(it) : std::next(it);
    for (auto it = s.modules.begin(); it != s.modules.end();)
        it = it->second->device == dev ? s.modules.erase(it) : std::next(it);
    for (auto it = s.functions.begin(); it != s.functions.end();)
        it = it->second.module->device == dev ? s.functions.erase(it) : std::next(it);
    for (auto &kv : s.allocs)
        if (kv.second.device == dev && !kv.second.pinned_host) d.allocs.push_back(kv.first);
    return d;
}

// Without st().mu: lets the context's work finish, then releases its memory and mappings.
void destroy_context(Doomed &d) {
    for (auto &x : d.streams) x->drain();
    sync_all_streams();  // other streams may still use this context's memory
    for (auto &x : d.streams) x->shutdown();
    std::vector<std::pair<uint64_t, Alloc>> freed;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        for (uint64_t base : d.allocs) {
            // Still there means still the same allocation: a mapped address is not reused.
            auto it = s.allocs.find(base);
            if (it == s.allocs.end()) continue;
            if (it->second.ipc) s.ipc_by_name.erase(it->second.name);
            freed.emplace_back(base, std::move(it->second));
            s.allocs.erase(it);
        }
    }
    for (auto &f : freed) {
        if (!f.second.ipc) check_not_imported(f.second.name);
        munmap(reinterpret_cast<void *>(f.first), f.second.map_len);
        if (!f.second.ipc) shm_unlink(f.second.name.c_str());
        else unmark_imported(f.second.name);
        g_count.reclaimed.fetch_add(1);
    }
}

// ---- fork and exit ----------------------------------------------------------------------------
// A forked child gets fresh state (its parent's streams have no threads in it, and its parent's
// memory is not its own); after a parent's successful cuInit the driver is unusable there.
std::atomic<bool> g_driver_after_fork{false};  // wsync_fake_allow_driver_after_fork

void atfork_prepare() {
    g_inj_mu.lock();
    st().mu.lock();
}
void atfork_parent() {
    st().mu.unlock();
    g_inj_mu.unlock();
}
void atfork_child() {
    State *old = state_ptr();
    old->mu.unlock();
    g_inj_mu.unlock();
    auto *fresh = new State;
    fresh->init_tried = old->init_tried;
    // A child of a process whose driver was initialised cannot use the driver at all: the real
    // one duplicates none of its state or threads into the child, and every call there,
    // cuInit included, fails ("initialization error"). A child of a process that never
    // initialised starts clean and may cuInit itself.
    const bool usable = g_driver_after_fork.load() || !old->init_tried ||
                        old->init_rc != CUDA_SUCCESS;
    fresh->init_rc = usable ? old->init_rc : CUDA_ERROR_NOT_INITIALIZED;
    fresh->visible = old->visible;
    fresh->abandoned = old;
    state_ptr() = fresh;
    g_count.reset();
    Stream::g_stream_failures.store(0);
}

__attribute__((constructor)) void fake_cuda_load() {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

// exit(): the driver frees a process's device memory when it ends; here that is unlinking the
// shm names of what was never freed. Nothing is unmapped (stream threads may still run).
__attribute__((destructor)) void fake_cuda_unload() {
    State &s = st();
    std::unique_lock<std::mutex> lk(s.mu, std::defer_lock);
    for (int i = 0; i < 1000 && !lk.try_lock(); ++i) poll_sleep();
    if (!lk.owns_lock()) return;
    for (auto &kv : s.allocs) {
        if (!kv.second.ipc) shm_unlink(kv.second.name.c_str());
        else unmark_imported(kv.second.name);  // the driver unmaps what a process had open
    }
}

// ---- the pack kernel --------------------------------------------------------------------------
// float32 -> bfloat16, round to nearest even (cvt.rn.bf16.f32). NaN becomes the canonical NaN
// 0x7FFF, sign dropped, as PTX's cvt produces for f16/bf16 results.
uint16_t f32_to_bf16(uint32_t x) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    x += 0x7fffu + ((x >> 16) & 1u);  // carries into the exponent: overflow rounds to inf
    return static_cast<uint16_t>(x >> 16);
}

// float32 -> IEEE binary16, round to nearest even (cvt.rn.f16.f32): subnormal results are
// produced, too-large values become infinity, NaN the canonical 0x7FFF.
uint16_t f32_to_f16(uint32_t x) {
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;
    if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    const int exp = static_cast<int>(a >> 23) - 127;
    const uint32_t mant = a & 0x7fffffu;
    if (exp > 15) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exp >= -14) {  // normal range before rounding; a carry may reach infinity, correctly
        uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
        const uint32_t rem = mant & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
        return static_cast<uint16_t>(sign | h);
    }
    if (exp < -25) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t m = mant | 0x800000u;                  // value = m * 2^(exp - 23)
    const int shift = -(exp + 1);                         // to units of 2^-24: 14..24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;     // may become the smallest normal
    return static_cast<uint16_t>(sign | h);
}

// One launch of wsync_pack(entries, count, tiles), as pack.cu does it: op 1 casts to bfloat16,
// op 2 to float16, anything else copies bytes. Like the kernel, the emulation walks the launch's
// tiles and finds each tile's entry by its first_tile, so a tile table the library numbered
// wrongly leaves bytes unpacked (and the bit-exact tests fail) here as on a GPU; a tile count
// that differs from the entries' sum fails the launch. Every address is checked first; a bad one
// fails the launch (an illegal address on a GPU).
CUresult run_pack(uint64_t table, unsigned count, unsigned tiles) {
    if (count == 0) return CUDA_SUCCESS;
    const uint64_t table_bytes = uint64_t(count) * sizeof(PackEntry);
    if (!device_range_ok(table, table_bytes)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    std::vector<PackEntry> entries(count);
    std::memcpy(entries.data(), reinterpret_cast<const void *>(table), table_bytes);
    uint64_t sum = 0;
    for (const PackEntry &e : entries) {
        const bool cast = e.op == kPackF32ToBf16 || e.op == kPackF32ToF16;
        if (cast && e.count > (UINT64_MAX / 4)) return CUDA_ERROR_ILLEGAL_ADDRESS;
        const uint64_t in = cast ? e.count * 4 : e.count, out = cast ? e.count * 2 : e.count;
        if (!device_range_ok(e.src, in) || !device_range_ok(e.dst, out))
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        // The casts load float32 and store 16-bit elements: off their natural alignment the
        // GPU faults (CUDA_ERROR_MISALIGNED_ADDRESS, 716, seen on an H200), and the stream is
        // failed for good, as the real context is.
        if (cast && (e.src % 4 != 0 || e.dst % 2 != 0)) return static_cast<CUresult>(716);
        sum += pack_tiles(e);
    }
    if (sum != tiles) return CUDA_ERROR_INVALID_VALUE;  // the kernel would read past its table
    for (unsigned tile = 0; tile < tiles; ++tile) {
        // The last entry whose first_tile <= tile, as find_entry() in pack.cu.
        unsigned lo = 0, hi = count;
        while (hi - lo > 1) {
            const unsigned mid = (lo + hi) / 2;
            (entries[mid].first_tile <= tile ? lo : hi) = mid;
        }
        const PackEntry &e = entries[lo];
        if (tile < e.first_tile) return CUDA_ERROR_ILLEGAL_ADDRESS;
        const bool cast = e.op == kPackF32ToBf16 || e.op == kPackF32ToF16;
        const uint64_t per = cast ? kPackTileElems : kPackTileBytes;
        const uint64_t begin = uint64_t(tile - e.first_tile) * per;
        if (begin >= e.count) return CUDA_ERROR_ILLEGAL_ADDRESS;  // a tile past its entry's end
        const uint64_t n = std::min(per, e.count - begin);
        if (!cast) {
            std::memmove(reinterpret_cast<unsigned char *>(e.dst) + begin,
                         reinterpret_cast<const unsigned char *>(e.src) + begin, n);
            continue;
        }
        auto *src = reinterpret_cast<const unsigned char *>(e.src) + 4 * begin;
        auto *dst = reinterpret_cast<unsigned char *>(e.dst) + 2 * begin;
        for (uint64_t i = 0; i < n; ++i) {
            uint32_t f;
            std::memcpy(&f, src + 4 * i, 4);
            uint16_t h = e.op == kPackF32ToBf16 ? f32_to_bf16(f) : f32_to_f16(f);
            std::memcpy(dst + 2 * i, &h, 2);
        }
    }
    return CUDA_SUCCESS;
}

// ---- the delta kernels (src/gpu/kernels/delta_abi.hpp) ----------------------------------------
// A launch's entry table, copied out of device memory; false when it is not all device memory.
template <class E>
bool read_table(uint64_t table, unsigned count, std::vector<E> *out) {
    const uint64_t bytes = uint64_t(count) * sizeof(E);
    if (!device_range_ok(table, bytes)) return false;
    out->resize(count);
    if (bytes) std::memcpy(out->data(), reinterpret_cast<const void *>(table), bytes);
    return true;
}
// The entry that holds launch tile `tile`, as find_entry() in delta.cu: the last whose first
// tile <= tile.
template <class E>
const E &entry_of(const std::vector<E> &entries, unsigned tile, uint32_t E::*first) {
    size_t lo = 0, hi = entries.size();
    while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        (entries[mid].*first <= tile ? lo : hi) = mid;
    }
    return entries[lo];
}
bool element_size_ok(uint32_t esize) { return esize == 1 || esize == 2 || esize == 4 || esize == 8; }
// A device load or store of `esize` bytes at an address not aligned to it faults on a GPU.
bool aligned(uint64_t p, uint64_t a) { return p % a == 0; }

// An apply's state in (fake) device memory; the launch checked that it is.
ApplyState *state_at(uint64_t p) { return reinterpret_cast<ApplyState *>(p); }

// wsync_piece_hash: XXH3-64 of each 64 KiB piece of each entry (an entry with a state only
// while its verdict is kGo).
CUresult run_piece_hash(uint64_t table, unsigned count, unsigned pieces) {
    std::vector<HashEntry> entries;
    if (!read_table(table, count, &entries)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint64_t sum = 0;
    for (const HashEntry &e : entries) {
        if (e.first_piece != sum) return CUDA_ERROR_INVALID_VALUE;
        const uint64_t n = hash_pieces(e.bytes);
        if (!device_range_ok(e.src, e.bytes) || !device_range_ok(e.out, n * 8) ||
            (n && !aligned(e.out, 8)) ||
            (e.state && (!device_range_ok(e.state, sizeof(ApplyState)) || !aligned(e.state, 8))))
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        sum += n;
    }
    if (sum != pieces) return CUDA_ERROR_INVALID_VALUE;  // the kernel would read past its table
    for (unsigned p = 0; p < pieces; ++p) {
        const HashEntry &e = entry_of(entries, p, &HashEntry::first_piece);
        if (e.state && state_at(e.state)->verdict != kGo) continue;
        const uint64_t begin = uint64_t(p - e.first_piece) * kHashPieceBytes;
        const uint64_t n = std::min(kHashPieceBytes, e.bytes - begin);
        // One warp a piece, in the kernel's schedule of XXH3 (xxh3.h, "the lane-parallel form").
        const uint64_t h = wsync_xxh3::hash64_by_lanes(reinterpret_cast<const unsigned char *>(e.src) + begin, n);
        std::memcpy(reinterpret_cast<unsigned char *>(e.out) + 8 * (p - e.first_piece), &h, 8);
    }
    return CUDA_SUCCESS;
}

// wsync_delta_count (compact false) and wsync_delta_compact (true).
CUresult run_delta_diff(uint64_t table, unsigned count, unsigned tiles, bool compact) {
    std::vector<DiffEntry> entries;
    if (!read_table(table, count, &entries)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint64_t sum = 0;
    for (const DiffEntry &e : entries) {
        if (e.first_tile != sum || !element_size_ok(e.esize)) return CUDA_ERROR_INVALID_VALUE;
        if (e.elements > (UINT64_MAX / 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
        const uint64_t n = diff_tiles(e.elements), bytes = e.elements * e.esize;
        if (!device_range_ok(e.now, bytes) || !device_range_ok(e.base, bytes) ||
            !aligned(e.now, e.esize) || !aligned(e.base, e.esize))
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        // vector16: 16-byte loads from both sides; off a 16-byte boundary the GPU faults
        // (CUDA_ERROR_MISALIGNED_ADDRESS, a sticky error of the context).
        if (e.vector16 > 1) return CUDA_ERROR_INVALID_VALUE;
        if (e.vector16 && bytes >= 16 && (!aligned(e.now, 16) || !aligned(e.base, 16)))
            return static_cast<CUresult>(716);
        if (!compact && !(device_range_ok(e.counts, 4 * n) && aligned(e.counts, 4)))
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (compact) {
            if (e.width != 4 && e.width != 8) return CUDA_ERROR_INVALID_VALUE;
            if (e.changed > e.elements) return CUDA_ERROR_ILLEGAL_ADDRESS;
            const uint64_t patch = 32 + ((e.changed * e.width + 7) & ~uint64_t(7)) + e.changed * e.esize;
            if (!device_range_ok(e.offsets, 8 * n) || !aligned(e.offsets, 8) ||
                !device_range_ok(e.patch, patch) || !aligned(e.patch, 8))
                return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        sum += n;
    }
    if (sum != tiles) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned t = 0; t < tiles; ++t) {
        const DiffEntry &e = entry_of(entries, t, &DiffEntry::first_tile);
        const uint64_t begin = uint64_t(t - e.first_tile) * kDiffTileElems;
        const auto *now = reinterpret_cast<const unsigned char *>(e.now);
        const auto *base = reinterpret_cast<const unsigned char *>(e.base);
        // The kernel's order (delta_abi.hpp): warp w of 8 takes 1024 elements in 2 * esize
        // rounds, lane l of round r the V = 16 / esize elements at 32Vr + Vl; the compaction
        // writes round by round, lane by lane, each lane's changes in order.
        const unsigned V = 16 / e.esize;
        std::vector<uint64_t> order;
        for (unsigned w = 0; w < kDiffBlock / 32; ++w)
            for (unsigned r = 0; r < 2 * e.esize; ++r)
                for (unsigned l = 0; l < 32; ++l)
                    for (unsigned k = 0; k < V; ++k) {
                        const uint64_t i = begin + 1024 * w + 32 * V * r + V * l + k;
                        if (i < e.elements && std::memcmp(now + i * e.esize, base + i * e.esize, e.esize) != 0)
                            order.push_back(i);
                    }
        if (!compact) {
            const uint32_t c = uint32_t(order.size());
            std::memcpy(reinterpret_cast<unsigned char *>(e.counts) + 4 * (t - e.first_tile), &c, 4);
            continue;
        }
        auto *patch = reinterpret_cast<unsigned char *>(e.patch);
        const uint64_t idx_bytes = (e.changed * e.width + 7) & ~uint64_t(7);
        if (t == e.first_tile) {
            const uint32_t magic = 0x31504457u, esize = e.esize, zero32 = 0;
            const uint8_t coding = 0, width = uint8_t(e.width);
            const uint16_t zero16 = 0;
            std::memcpy(patch, &magic, 4);
            std::memcpy(patch + 4, &coding, 1);
            std::memcpy(patch + 5, &width, 1);
            std::memcpy(patch + 6, &zero16, 2);
            std::memcpy(patch + 8, &esize, 4);
            std::memcpy(patch + 12, &zero32, 4);
            std::memcpy(patch + 16, &e.changed, 8);
            std::memcpy(patch + 24, &e.elements, 8);
            std::memset(patch + 32 + e.changed * e.width, 0, idx_bytes - e.changed * e.width);
        }
        uint64_t pos;
        std::memcpy(&pos, reinterpret_cast<const unsigned char *>(e.offsets) + 8 * (t - e.first_tile), 8);
        for (uint64_t i : order) {
            // An offset table that does not add up would write past the patch on a GPU.
            if (pos >= e.changed) return CUDA_ERROR_ILLEGAL_ADDRESS;
            if (e.width == 4) {
                const uint32_t v = uint32_t(i);
                std::memcpy(patch + 32 + 4 * pos, &v, 4);
            } else {
                std::memcpy(patch + 32 + 8 * pos, &i, 8);
            }
            std::memcpy(patch + 32 + idx_bytes + pos * e.esize, now + i * e.esize, e.esize);
            ++pos;
        }
    }
    return CUDA_SUCCESS;
}

// A patch entry's memory, as the scatter (or, check: the check tiles) reads and writes it.
CUresult patch_entry_ok(const PatchEntry &e, bool check) {
    if (!element_size_ok(e.esize) || (e.width != 4 && e.width != 8)) return CUDA_ERROR_INVALID_VALUE;
    if (e.count > (UINT64_MAX / 16) || e.elements > (UINT64_MAX / 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (!device_range_ok(e.idx, e.count * e.width) || !aligned(e.idx, e.width)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (!check && (!device_range_ok(e.values, e.count * e.esize) || !aligned(e.values, e.esize) ||
                   !device_range_ok(e.dst, e.elements * e.esize) || !aligned(e.dst, e.esize) ||
                   (e.save && (!device_range_ok(e.save, e.count * e.esize) || !aligned(e.save, e.esize)))))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    // The check reads the header before the indices and writes the state.
    if (check && (e.idx < 32 || !device_range_ok(e.idx - 32, 32) || !aligned(e.idx - 32, 8)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    if ((check || e.state) && (!device_range_ok(e.state, sizeof(ApplyState)) || !aligned(e.state, 8)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    return CUDA_SUCCESS;
}
uint64_t index_at(const PatchEntry &e, uint64_t i) {
    uint64_t v = 0;
    std::memcpy(&v, reinterpret_cast<const unsigned char *>(e.idx) + i * e.width, e.width);  // little-endian
    return v;
}
// Changes [begin, end) of e onto its destination (saving the replaced values when e.save).
void scatter(const PatchEntry &e, uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
        const uint64_t j = index_at(e, i);
        if (j >= e.elements) continue;
        auto *dst = reinterpret_cast<unsigned char *>(e.dst) + j * e.esize;
        if (e.save) std::memcpy(reinterpret_cast<unsigned char *>(e.save) + i * e.esize, dst, e.esize);
        std::memcpy(dst, reinterpret_cast<const unsigned char *>(e.values) + i * e.esize, e.esize);
    }
}

// wsync_patch_scatter.
CUresult run_patch(uint64_t table, unsigned count, unsigned tiles) {
    std::vector<PatchEntry> entries;
    if (!read_table(table, count, &entries)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint64_t sum = 0;
    for (const PatchEntry &e : entries) {
        if (e.first_tile != sum) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult rc = patch_entry_ok(e, false)) return rc;
        sum += patch_tiles(e.count);
    }
    if (sum != tiles) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned t = 0; t < tiles; ++t) {
        const PatchEntry &e = entry_of(entries, t, &PatchEntry::first_tile);
        if (e.state && state_at(e.state)->verdict != e.when) continue;
        const uint64_t begin = uint64_t(t - e.first_tile) * kPatchTileChanges;
        scatter(e, begin, std::min(e.count, begin + kPatchTileChanges));
    }
    return CUDA_SUCCESS;
}

// The verdict a launch's last block takes (stage 0: base, 1: result): XXH3 of the pieces'
// hashes, by one warp in the kernel's schedule.
void take_verdict(ApplyState &s, unsigned stage) {
    if (s.verdict != kGo) return;
    const uint64_t h = wsync_xxh3::hash64_by_lanes(reinterpret_cast<const unsigned char *>(s.pieces), s.n_pieces * 8);
    if (h != (stage == 0 ? s.base_hash : s.result_hash)) {
        s.got = h;
        s.verdict = stage == 0 ? kBaseDiffers : kResultDiffers;
    }
}

// wsync_apply_begin (begin true) and wsync_apply_end on one ApplySlot (delta_abi.hpp).
CUresult run_apply(uint64_t table, unsigned count, unsigned tiles, bool begin) {
    if (count != 1) return CUDA_ERROR_INVALID_VALUE;
    if (!device_range_ok(table, sizeof(ApplySlot)) || !aligned(table, 8)) return CUDA_ERROR_ILLEGAL_ADDRESS;
    ApplySlot &slot = *reinterpret_cast<ApplySlot *>(table);
    ApplyState &s = slot.state;
    const PatchEntry &a = slot.apply, &r = slot.restore;
    const HashEntry &h = slot.hash;
    const uint64_t state = table + offsetof(ApplySlot, state);
    // What the kernels read: the entries must describe this slot's patch and pieces.
    if (CUresult rc = patch_entry_ok(a, begin)) return rc;
    if (!begin)
        if (CUresult rc = patch_entry_ok(r, false)) return rc;
    if (a.state != state || (!begin && (r.state != state || r.count != a.count || r.save)))
        return CUDA_ERROR_INVALID_VALUE;
    const uint64_t pieces = hash_pieces(h.bytes);
    if (h.src != a.dst || h.out != s.pieces || s.n_pieces != pieces || h.first_piece ||
        !device_range_ok(h.src, h.bytes) || !device_range_ok(s.pieces, pieces * 8) || (pieces && !aligned(s.pieces, 8)))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    // The tiles: begin's checks then its piece groups, end's piece groups (one at least);
    // another count leaves pieces unhashed or reads past the slot's work.
    const uint64_t want = begin ? check_pass_tiles(a.count) + apply_tiles(pieces) : std::max<uint64_t>(apply_tiles(pieces), 1);
    if (tiles != want) return CUDA_ERROR_INVALID_VALUE;
    // The last block is found by counting arrivals from 0: a counter left nonzero would make
    // no block (or a wrong one) the last, and no verdict would be taken.
    if (s.arrived != 0) return CUDA_ERROR_INVALID_VALUE;
    auto hash_all = [&] {
        for (uint64_t p = 0; p < pieces; ++p) {
            const uint64_t at = p * kHashPieceBytes, n = std::min(kHashPieceBytes, h.bytes - at);
            const uint64_t v = wsync_xxh3::hash64_by_lanes(reinterpret_cast<const unsigned char *>(h.src) + at, n);
            std::memcpy(reinterpret_cast<unsigned char *>(s.pieces) + 8 * p, &v, 8);
        }
    };
    if (begin) {
        uint64_t hd[4];
        std::memcpy(hd, reinterpret_cast<const void *>(a.idx - 32), 32);
        if (hd[0] != (0x31504457ull | (uint64_t(a.width) << 40)) || hd[1] != a.esize ||
            hd[2] != a.count || hd[3] != a.elements)
            s.verdict = kMalformed;
        for (uint64_t i = 0; i < a.count; ++i) {
            const uint64_t j = index_at(a, i);
            if (j >= a.elements || (i > 0 && j <= index_at(a, i - 1))) {
                s.bad = std::min(s.bad, i);
                s.verdict = kMalformed;
            }
        }
        hash_all();
        take_verdict(s, 0);
        return CUDA_SUCCESS;
    }
    if (s.verdict != kGo) return CUDA_SUCCESS;
    hash_all();
    take_verdict(s, 1);
    if (s.verdict == kResultDiffers) scatter(r, 0, r.count);
    return CUDA_SUCCESS;
}

struct ErrorText {
    CUresult code;
    const char *name;
    const char *text;
};
// The driver's names and texts (cuGetErrorName / cuGetErrorString) for every code returned here.
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText *error_entry(CUresult rc) {
    for (const auto &e : kErrors)
        if (e.code == rc) return &e;
    return nullptr;
}

}  // namespace wsync_fake

// ---- initialisation and devices ---------------------------------------------------------------
CUresult cuInit(unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuInit");
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    sweep_dead_namesakes();
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.init_tried) {  // like the driver, the first call decides (and reads the environment)
        s.init_tried = true;
        s.init_rc = init_devices(s);
        if (s.init_rc != CUDA_SUCCESS) s.visible.clear();
    }
    return s.init_rc;
}

CUresult cuDriverGetVersion(int *version) {
    WSYNC_FAKE_FAIL_POINT("cuDriverGetVersion");
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    // WSYNC_FAKE_CUDA_DRIVER_VERSION plays an older (or newer) driver, e.g. 11080 for CUDA 11.8.
    const char *v = std::getenv("WSYNC_FAKE_CUDA_DRIVER_VERSION");
    *version = v && *v ? std::atoi(v) : kDriverVersion;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText *e = error_entry(error);
    *str = e ? e->name : nullptr;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText *e = error_entry(error);
    *str = e ? e->text : nullptr;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *count) {
    WSYNC_FAKE_FAIL_POINT("cuDeviceGetCount");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = static_cast<int>(s.visible.size());
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    WSYNC_FAKE_FAIL_POINT("cuDeviceGet");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= static_cast<int>(s.visible.size())) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;  // a CUdevice is the ordinal, as with the real driver
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    WSYNC_FAKE_FAIL_POINT("cuDeviceGetUuid_v2");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= static_cast<int>(s.visible.size())) return CUDA_ERROR_INVALID_DEVICE;
    *uuid = s.visible[dev];
    return CUDA_SUCCESS;
}

// Compute capability: 9.0 (an H100/H200), or WSYNC_FAKE_CUDA_CC ("7.5") for every device, read
// at each call so a test sets it before it starts.
CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev) {
    WSYNC_FAKE_FAIL_POINT("cuDeviceGetAttribute");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= static_cast<int>(s.visible.size())) return CUDA_ERROR_INVALID_DEVICE;
    int major = 9, minor = 0;
    if (const char *cc = std::getenv("WSYNC_FAKE_CUDA_CC")) std::sscanf(cc, "%d.%d", &major, &minor);
    if (attrib == 75) *value = major;       // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    else if (attrib == 76) *value = minor;  // ..._MINOR
    else return CUDA_ERROR_INVALID_VALUE;   // the fake knows no other attribute
    return CUDA_SUCCESS;
}

// ---- contexts ---------------------------------------------------------------------------------
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    WSYNC_FAKE_FAIL_POINT("cuDevicePrimaryCtxRetain");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= static_cast<int>(s.visible.size())) return CUDA_ERROR_INVALID_DEVICE;
    ++s.ctx_refs[dev];
    *ctx = ctx_of(dev);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    WSYNC_FAKE_FAIL_POINT("cuDevicePrimaryCtxRelease_v2");
    State &s = st();
    Doomed doomed;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
        if (dev < 0 || dev >= static_cast<int>(s.visible.size())) return CUDA_ERROR_INVALID_DEVICE;
        if (s.ctx_refs[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
        if (--s.ctx_refs[dev] > 0) return CUDA_SUCCESS;
        doomed = collect_context_locked(s, dev);
    }
    destroy_context(doomed);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    WSYNC_FAKE_FAIL_POINT("cuCtxGetCurrent");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = t_current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    WSYNC_FAKE_FAIL_POINT("cuCtxSetCurrent");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    // Any primary context handle may be made current (even one not retained now: calls that need
    // it then fail with CUDA_ERROR_INVALID_CONTEXT); NULL unbinds.
    if (ctx && (dev_of(ctx) < 0 || dev_of(ctx) >= static_cast<int>(s.visible.size())))
        return CUDA_ERROR_INVALID_CONTEXT;
    t_current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    WSYNC_FAKE_FAIL_POINT("cuCtxSynchronize");
    int dev;
    if (CUresult rc = current_device(&dev)) return rc;
    return sync_all_streams() ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS;
}

// ---- memory -----------------------------------------------------------------------------------
// A new shm object of `len` bytes (page-rounded) for an allocation of this process, mapped
// read-write at `fixed` (MAP_FIXED, inside a range the caller reserved) or anywhere (NULL).
CUresult new_shm_mapping(uint64_t len, void *fixed, std::string *name, uint64_t *serial, void **out) {
    State &s = st();
    {
        std::lock_guard<std::mutex> lk(s.mu);
        *serial = ++s.next_serial;
    }
    const uint64_t pid = static_cast<uint64_t>(getpid());
    sweep_dead_namesakes();
    int fd = -1;
    for (int tries = 0; fd < 0; ++tries) {
        *name = alloc_name(pid, *serial);
        fd = shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0) break;
        if (errno != EEXIST || tries > 1000) return CUDA_ERROR_OUT_OF_MEMORY;
        std::lock_guard<std::mutex> lk(s.mu);  // a leftover of an earlier process with our pid
        *serial = ++s.next_serial;
    }
    int err = posix_fallocate(fd, 0, static_cast<off_t>(len));
    if (err == EOPNOTSUPP || err == EINVAL) err = ftruncate(fd, static_cast<off_t>(len)) ? errno : 0;
    void *p = err ? MAP_FAILED
                  : mmap(fixed, len, PROT_READ | PROT_WRITE, MAP_SHARED | (fixed ? MAP_FIXED : 0), fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name->c_str());
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = p;
    return CUDA_SUCCESS;
}

// Records a new allocation of this process (a cuMemAlloc, or one piece of a span: `span` != 0,
// then not exportable) with a buffer id of its own, and counts it.
void add_alloc(void *p, uint64_t size, uint64_t map_len, const std::string &name, int dev,
               uint64_t serial, uint64_t span) {
    State &s = st();
    {
        std::lock_guard<std::mutex> lk(s.mu);
        Alloc a;
        a.size = size;
        a.map_len = map_len;
        a.name = name;
        a.device = dev;
        a.buffer_id = ++s.next_buffer_id;
        a.serial = serial;
        a.unexportable = span != 0;  // as expandable segments: no legacy IPC handle
        a.span = span;
        s.allocs[reinterpret_cast<uint64_t>(p)] = std::move(a);
    }
    g_count.allocs.fetch_add(1);
}

CUresult cuMemAlloc(CUdeviceptr *dptr, std::size_t bytes) {
    WSYNC_FAKE_FAIL_POINT("cuMemAlloc_v2");
    State &s = st();
    int dev;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
        if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    }
    const uint64_t len = page_round(bytes);
    std::string name;
    uint64_t serial = 0;
    void *p = nullptr;
    if (CUresult rc = new_shm_mapping(len, nullptr, &name, &serial, &p)) return rc;
    add_alloc(p, bytes, len, name, dev, serial, 0);
    *dptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr) {
    WSYNC_FAKE_FAIL_POINT("cuMemFree_v2");
    State &s = st();
    {
        std::lock_guard<std::mutex> lk(s.mu);
        int dev;
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
        auto it = s.allocs.find(dptr);
        if (it == s.allocs.end() || it->second.ipc || it->second.pinned_host || it->second.vmm_mapped)
            return CUDA_ERROR_INVALID_VALUE;
    }
    sync_all_streams();  // like cudaFree: work in flight finishes before the memory goes
    Alloc a;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.allocs.find(dptr);
        if (it == s.allocs.end() || it->second.ipc) return CUDA_ERROR_INVALID_VALUE;  // raced
        a = std::move(it->second);
        s.allocs.erase(it);
    }
    check_not_imported(a.name);
    munmap(reinterpret_cast<void *>(dptr), a.map_len);
    shm_unlink(a.name.c_str());
    g_count.frees.fetch_add(1);
    return CUDA_SUCCESS;
}

// ---- virtual memory management: PyTorch's expandable segments, shared as file descriptors --
// A span's pieces (wsync_fake_mem_alloc_span) are physical allocations whose handles export as
// POSIX file descriptors (the piece's shm file, opened anew); an importer maps the descriptor
// into a range it reserved. cuMemAlloc memory has no such handle (the real driver: "not a
// VMM allocation"), so cuMemRetainAllocationHandle refuses it.
std::atomic<long long> g_vmm_exports{0}, g_vmm_imports{0};

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    WSYNC_FAKE_FAIL_POINT("cuMemRetainAllocationHandle");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    auto it = containing_locked(s, reinterpret_cast<uint64_t>(addr));
    if (!handle || it == s.allocs.end() || !it->second.span || it->second.vmm_mapped)
        return CUDA_ERROR_INVALID_VALUE;
    MemHandle h;
    h.name = it->second.name;
    h.size = it->second.size;
    *handle = ++s.next_mem_handle;
    s.mem_handles[*handle] = std::move(h);
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    WSYNC_FAKE_FAIL_POINT("cuMemRelease");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.mem_handles.find(handle);
    if (it == s.mem_handles.end()) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.fd >= 0) close(it->second.fd);
    s.mem_handles.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                      unsigned long long flags) {
    WSYNC_FAKE_FAIL_POINT("cuMemExportToShareableHandle");
    State &s = st();
    std::string name;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.mem_handles.find(handle);
        if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
            it == s.mem_handles.end() || it->second.name.empty())
            return CUDA_ERROR_INVALID_VALUE;
        name = it->second.name;
    }
    int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
    *static_cast<int *>(shareable) = fd;
    g_vmm_exports.fetch_add(1);
    return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type) {
    WSYNC_FAKE_FAIL_POINT("cuMemImportFromShareableHandle");
    const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
    struct stat sb;
    if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 || fstat(fd, &sb) != 0 ||
        sb.st_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    MemHandle h;
    h.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);  // the caller may close its own, as the driver allows
    if (h.fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    h.size = static_cast<uint64_t>(sb.st_size);
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    *handle = ++s.next_mem_handle;
    s.mem_handles[*handle] = std::move(h);
    g_vmm_imports.fetch_add(1);
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    WSYNC_FAKE_FAIL_POINT("cuMemAddressReserve");
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (!ptr || size == 0 || size % page || addr || flags || (alignment && alignment % page))
        return CUDA_ERROR_INVALID_VALUE;
    void *range = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    *ptr = reinterpret_cast<CUdeviceptr>(range);
    s.reserved[*ptr] = {size, ++s.next_span};
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
    WSYNC_FAKE_FAIL_POINT("cuMemAddressFree");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.reserved.find(ptr);
    if (it == s.reserved.end() || it->second.first != size) return CUDA_ERROR_INVALID_VALUE;
    // Still mapped: the real driver's range would keep memory reachable; refused here.
    auto m = s.allocs.lower_bound(ptr);
    if (m != s.allocs.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    munmap(reinterpret_cast<void *>(ptr), size);
    s.reserved.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    WSYNC_FAKE_FAIL_POINT("cuMemMap");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    int dev;
    if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    auto h = s.mem_handles.find(handle);
    if (h == s.mem_handles.end() || flags || offset || size != page_round(h->second.size))
        return CUDA_ERROR_INVALID_VALUE;
    // Inside one reserved range, over nothing mapped.
    auto r = s.reserved.upper_bound(ptr);
    if (r == s.reserved.begin()) return CUDA_ERROR_INVALID_VALUE;
    --r;
    if (ptr < r->first || ptr + size > r->first + r->second.first) return CUDA_ERROR_INVALID_VALUE;
    auto m = s.allocs.lower_bound(ptr);
    if ((m != s.allocs.end() && m->first < ptr + size) || containing_locked(s, ptr) != s.allocs.end())
        return CUDA_ERROR_INVALID_VALUE;
    int fd = h->second.fd;
    const bool own = fd < 0;
    if (own) fd = shm_open(h->second.name.c_str(), O_RDWR | O_CLOEXEC, 0);
    void *p = fd < 0 ? MAP_FAILED
                     : mmap(reinterpret_cast<void *>(ptr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (own && fd >= 0) close(fd);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    Alloc a;
    a.size = h->second.size;
    a.map_len = size;
    a.device = dev;
    a.buffer_id = ++s.next_buffer_id;
    a.unexportable = true;
    a.span = r->second.second;  // pieces mapped side by side read as one range
    a.vmm_mapped = true;
    s.allocs[ptr] = std::move(a);
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc *desc, std::size_t count) {
    WSYNC_FAKE_FAIL_POINT("cuMemSetAccess");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (!desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < count; ++i)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= static_cast<int>(s.visible.size()))
            return CUDA_ERROR_INVALID_VALUE;
    // Every byte of the range must be mapped.
    for (uint64_t at = ptr; at < ptr + size;) {
        auto it = s.allocs.find(at);
        if (it == s.allocs.end() || !it->second.vmm_mapped) return CUDA_ERROR_INVALID_VALUE;
        at += it->second.map_len;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
    WSYNC_FAKE_FAIL_POINT("cuMemUnmap");
    sync_all_streams();  // the driver's unmap waits for work reading the range (cuda.h)
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    for (uint64_t at = ptr; at < ptr + size;) {
        auto it = s.allocs.find(at);
        if (it == s.allocs.end() || !it->second.vmm_mapped) return CUDA_ERROR_INVALID_VALUE;
        at += it->second.map_len;
    }
    for (uint64_t at = ptr; at < ptr + size;) {
        auto it = s.allocs.find(at);
        at += it->second.map_len;
        s.allocs.erase(it);
    }
    mmap(reinterpret_cast<void *>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return CUDA_SUCCESS;
}

// Pinned host memory (cuMemHostAlloc): in the fake, anonymous memory of this process that
// kernels may reach once mapped (DEVICEMAP; the device pointer is the host address, as under
// unified addressing). Not exportable, not device memory to cuPointerGetAttribute.
CUresult cuMemHostAlloc(void **pp, std::size_t bytes, unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuMemHostAlloc");
    State &s = st();
    int dev;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    }
    if (!pp || bytes == 0 || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t len = page_round(bytes);
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        Alloc a;
        a.size = bytes;
        a.map_len = len;
        a.device = dev;  // the context it was made in; freed only by cuMemFreeHost here
        a.buffer_id = ++s.next_buffer_id;
        a.pinned_host = true;
        a.device_mapped = (flags & 0x2u) != 0;
        s.allocs[reinterpret_cast<uint64_t>(p)] = std::move(a);
    }
    g_count.host_allocs.fetch_add(1);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr *dptr, void *p, unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuMemHostGetDevicePointer_v2");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    int dev;
    if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    if (!dptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto it = containing_locked(s, reinterpret_cast<uint64_t>(p));
    if (it == s.allocs.end() || !it->second.pinned_host || !it->second.device_mapped)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    WSYNC_FAKE_FAIL_POINT("cuMemFreeHost");
    State &s = st();
    const auto key = reinterpret_cast<uint64_t>(p);
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
        auto it = s.allocs.find(key);
        if (it == s.allocs.end() || !it->second.pinned_host) return CUDA_ERROR_INVALID_VALUE;
    }
    sync_all_streams();  // as cuMemFree: work in flight finishes before the memory goes
    Alloc a;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.allocs.find(key);
        if (it == s.allocs.end() || !it->second.pinned_host) return CUDA_ERROR_INVALID_VALUE;  // raced
        a = std::move(it->second);
        s.allocs.erase(it);
    }
    munmap(p, a.map_len);
    g_count.host_frees.fetch_add(1);
    return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr *base, std::size_t *size, CUdeviceptr dptr) {
    WSYNC_FAKE_FAIL_POINT("cuMemGetAddressRange_v2");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    auto it = containing_locked(s, dptr);
    if (it == s.allocs.end()) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = it->first;
    if (size) *size = it->second.size;
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    WSYNC_FAKE_FAIL_POINT("cuPointerGetAttribute");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    auto it = containing_locked(s, ptr);
    if (it == s.allocs.end()) return CUDA_ERROR_INVALID_VALUE;  // not device memory
    const Alloc &a = it->second;
    switch (attribute) {
    case 1:  // CU_POINTER_ATTRIBUTE_CONTEXT
        *static_cast<CUcontext *>(data) = ctx_of(a.device);
        return CUDA_SUCCESS;
    case 2:  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CU_MEMORYTYPE_DEVICE (pinned: _HOST)
        *static_cast<unsigned int *>(data) = a.pinned_host ? 1 : 2;
        return CUDA_SUCCESS;
    case 3:  // CU_POINTER_ATTRIBUTE_DEVICE_POINTER
        *static_cast<CUdeviceptr *>(data) = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *static_cast<unsigned long long *>(data) = a.buffer_id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int *>(data) = a.device;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:  // a boolean; written as one int
        *static_cast<int *>(data) = a.unexportable || a.ipc || a.pinned_host ? 0 : 1;
        return CUDA_SUCCESS;
    case 11:  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        *static_cast<CUdeviceptr *>(data) = it->first;
        return CUDA_SUCCESS;
    case 12:  // CU_POINTER_ATTRIBUTE_RANGE_SIZE
        *static_cast<std::size_t *>(data) = a.size;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, std::size_t bytes, CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("cuMemcpyHtoDAsync_v2");
    int dev;
    if (CUresult rc = current_device(&dev)) return rc;
    if (bytes && !src) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    if (CUresult rc = get_stream(stream, &s)) return rc;
    int fail_rc = 0;
    const bool fail = inject_async("cuMemcpyHtoDAsync_v2", &fail_rc);
    // Pinned host memory (cuMemHostAlloc) is read by the copy engine when the copy runs, so the
    // caller must keep it unchanged until then; pageable memory is staged before returning.
    const auto src_at = reinterpret_cast<uint64_t>(src);
    if (bytes && pinned_host_range(src_at, bytes)) {
        s->push([dst, src_at, bytes, fail]() -> CUresult {
            if (fail) return CUDA_ERROR_ILLEGAL_ADDRESS;
            if (!device_range_ok(dst, bytes) || !device_range_ok(src_at, bytes)) return CUDA_ERROR_ILLEGAL_ADDRESS;
            std::memcpy(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src_at), bytes);
            return CUDA_SUCCESS;
        });
        g_count.memcpy_calls.fetch_add(1);
        return CUDA_SUCCESS;
    }
    auto staged = std::make_shared<std::vector<unsigned char>>();
    try {
        // Pageable host memory: the driver stages it before returning, so the caller's buffer
        // may change as soon as this returns.
        staged->assign(static_cast<const unsigned char *>(src), static_cast<const unsigned char *>(src) + bytes);
    } catch (const std::bad_alloc &) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->push([dst, staged, fail]() -> CUresult {
        if (fail) return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (!device_range_ok(dst, staged->size())) return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (!staged->empty()) std::memcpy(reinterpret_cast<void *>(dst), staged->data(), staged->size());
        return CUDA_SUCCESS;
    });
    g_count.memcpy_calls.fetch_add(1);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("cuMemcpyDtoDAsync_v2");
    int dev;
    if (CUresult rc = current_device(&dev)) return rc;
    // The driver refuses at once a copy that starts in one allocation and runs on into another
    // (CUDA_ERROR_INVALID_VALUE on the H200, 2026-12-04: two tensors of neighbouring cuMemAlloc
    // allocations joined into one copy); the pieces of one virtual-memory span are one range.
    if (runs_past_its_allocation(dst, bytes) || runs_past_its_allocation(src, bytes))
        return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    if (CUresult rc = get_stream(stream, &s)) return rc;
    int fail_rc = 0;
    const bool fail = inject_async("cuMemcpyDtoDAsync_v2", &fail_rc);
    s->push([dst, src, bytes, fail]() -> CUresult {
        if (fail) return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (!device_range_ok(dst, bytes) || !device_range_ok(src, bytes)) return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (bytes) std::memmove(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src), bytes);
        return CUDA_SUCCESS;
    });
    g_count.memcpy_calls.fetch_add(1);
    return CUDA_SUCCESS;
}

// ---- IPC --------------------------------------------------------------------------------------
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p) {
    WSYNC_FAKE_FAIL_POINT("cuIpcGetMemHandle");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    int dev;
    if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    auto it = s.allocs.find(p);  // the base of an allocation of this process, as the driver wants
    if (it == s.allocs.end() || it->second.ipc || it->second.unexportable || it->second.pinned_host)
        return CUDA_ERROR_INVALID_VALUE;
    HandleData h{};
    h.magic = kHandleMagic;
    h.version = 1;
    h.pid = static_cast<uint64_t>(getpid());
    h.serial = it->second.serial;
    h.size = it->second.size;
    std::memcpy(h.uuid, s.visible[it->second.device].bytes, 16);
    std::memset(handle, 0, sizeof *handle);
    std::memcpy(handle->reserved, &h, sizeof h);
    g_count.ipc_get_handle.fetch_add(1);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuIpcOpenMemHandle_v2");
    if (!p || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return CUDA_ERROR_INVALID_VALUE;
    HandleData h;
    std::memcpy(&h, handle.reserved, sizeof h);
    if (h.magic != kHandleMagic || h.version != 1) return CUDA_ERROR_INVALID_VALUE;
    State &s = st();
    const std::string name = alloc_name(h.pid, h.serial);
    int dev;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
        if (h.pid == static_cast<uint64_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
        // The owner's GPU must be one this process can see (peer mapping needs it).
        bool seen = false;
        for (const CUuuid &u : s.visible) seen = seen || std::memcmp(u.bytes, h.uuid, 16) == 0;
        if (!seen) return CUDA_ERROR_INVALID_DEVICE;
        auto known = s.ipc_by_name.find(name);
        if (known != s.ipc_by_name.end()) {
            ++s.allocs[known->second].refs;
            g_count.ipc_open.fetch_add(1);
            *p = known->second;
            return CUDA_SUCCESS;
        }
    }
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return errno == ENOENT ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_OUT_OF_MEMORY;
    struct stat sb;
    const uint64_t len = page_round(h.size);
    if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < len) {
        close(fd);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> lk(s.mu);
    auto known = s.ipc_by_name.find(name);
    if (known != s.ipc_by_name.end()) {  // another thread opened it meanwhile
        munmap(m, len);
        ++s.allocs[known->second].refs;
    } else {
        Alloc a;
        a.size = h.size;
        a.map_len = len;
        a.name = name;
        a.device = dev;  // belongs to the opener's current device
        a.buffer_id = ++s.next_buffer_id;
        a.ipc = true;
        a.refs = 1;
        const auto base = reinterpret_cast<uint64_t>(m);
        s.allocs[base] = std::move(a);
        known = s.ipc_by_name.emplace(name, base).first;
        mark_imported(name);
    }
    g_count.ipc_open.fetch_add(1);
    *p = known->second;
    return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    WSYNC_FAKE_FAIL_POINT("cuIpcCloseMemHandle");
    State &s = st();
    {
        std::lock_guard<std::mutex> lk(s.mu);
        int dev;
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
        auto it = s.allocs.find(p);
        if (it == s.allocs.end() || !it->second.ipc) return CUDA_ERROR_INVALID_VALUE;
        if (it->second.refs > 1) {
            --it->second.refs;
            g_count.ipc_close.fetch_add(1);
            return CUDA_SUCCESS;
        }
    }
    sync_all_streams();  // the last close unmaps; let work in flight finish first
    Alloc a;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.allocs.find(p);
        if (it == s.allocs.end() || !it->second.ipc) return CUDA_ERROR_INVALID_VALUE;  // raced
        g_count.ipc_close.fetch_add(1);
        if (--it->second.refs > 0) return CUDA_SUCCESS;  // reopened meanwhile
        a = std::move(it->second);
        s.allocs.erase(it);
        s.ipc_by_name.erase(a.name);
    }
    unmark_imported(a.name);
    munmap(reinterpret_cast<void *>(p), a.map_len);
    return CUDA_SUCCESS;
}

// ---- streams and events -----------------------------------------------------------------------
CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuStreamCreate");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    int dev;
    if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    if (!stream || (flags & ~CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> x;
    try {
        x = std::make_shared<Stream>(dev);
    } catch (const std::exception &) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    auto h = reinterpret_cast<CUstream>(x.get());
    for (int n = g_hold_next.load(); n > 0;)
        if (g_hold_next.compare_exchange_weak(n, n - 1)) {
            hold_stream(*x);
            break;
        }
    s.streams[h] = std::move(x);
    *stream = h;
    return CUDA_SUCCESS;
}

// Unlike the driver, which returns at once and frees the stream when its work is done, this
// waits for the work (the spec the tests rely on: nothing runs after destroy returns).
CUresult cuStreamDestroy(CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("cuStreamDestroy_v2");
    State &s = st();
    std::shared_ptr<Stream> x;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
        auto it = s.streams.find(stream);
        if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
        x = std::move(it->second);
        s.streams.erase(it);
    }
    x->drain();
    x->shutdown();
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("cuStreamQuery");
    std::shared_ptr<Stream> x;
    if (CUresult rc = get_stream(stream, &x)) return rc;
    return x->query();
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuStreamWaitEvent");
    if (flags & ~1u) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> x;
    if (CUresult rc = get_stream(stream, &x)) return rc;
    std::shared_ptr<Event> ev;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.events.find(event);
        if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
        ev = it->second;
    }
    std::shared_ptr<Stream> other;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> lk(ev->m);
        other = ev->stream;
        seq = ev->seq;
    }
    if (!other) return CUDA_SUCCESS;  // never recorded: nothing to wait for
    // Waits for the record as it is now (later records do not move this wait), in stream order.
    x->push([other, seq]() -> CUresult {
        other->wait(seq);
        return other->query_seq(seq);
    });
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *event, unsigned int flags) {
    WSYNC_FAKE_FAIL_POINT("cuEventCreate");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    int dev;
    if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    if (!event || flags > 0xf) return CUDA_ERROR_INVALID_VALUE;
    auto ev = std::make_shared<Event>();
    ev->device = dev;
    auto h = reinterpret_cast<CUevent>(ev.get());
    s.events[h] = std::move(ev);
    *event = h;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent event) {
    WSYNC_FAKE_FAIL_POINT("cuEventDestroy_v2");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    return s.events.erase(event) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("cuEventRecord");
    std::shared_ptr<Stream> x;
    if (CUresult rc = get_stream(stream, &x)) return rc;
    std::shared_ptr<Event> ev;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.events.find(event);
        if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
        ev = it->second;
    }
    std::lock_guard<std::mutex> lk(ev->m);
    ev->seq = x->push([] { return CUDA_SUCCESS; });  // a marker in stream order
    ev->stream = x;
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent event) {
    WSYNC_FAKE_FAIL_POINT("cuEventQuery");
    std::shared_ptr<Event> ev;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.events.find(event);
        if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
        ev = it->second;
    }
    std::lock_guard<std::mutex> lk(ev->m);
    if (!ev->stream) return CUDA_SUCCESS;  // never recorded: complete
    return ev->stream->query_seq(ev->seq);
}

// ---- modules and launches ---------------------------------------------------------------------
CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    WSYNC_FAKE_FAIL_POINT("cuModuleLoadData");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    int dev;
    if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    // Only PTX text can be "compiled" here: cubin (ELF) and fatbin images are refused.
    const auto *b = static_cast<const unsigned char *>(image);
    if ((b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') ||
        (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba))
        return CUDA_ERROR_INVALID_IMAGE;
    const char *text = static_cast<const char *>(image);
    auto m = std::make_shared<Module>();
    m->device = dev;
    bool found = false;
    for (const char *at = std::strstr(text, ".entry"); at; at = std::strstr(at + 1, ".entry")) {
        const char *n = at + 6;
        while (*n == ' ' || *n == '\t') ++n;
        if (n == at + 6) continue;
        for (int k = 0; k < kKernelCount; ++k) {
            const size_t len = std::strlen(kKernelNames[k]);
            if (std::strncmp(n, kKernelNames[k], len) == 0 &&
                !(std::isalnum(static_cast<unsigned char>(n[len])) || n[len] == '_' || n[len] == '$'))
                m->has[k] = found = true;
        }
    }
    if (!found) return CUDA_ERROR_INVALID_IMAGE;
    auto h = reinterpret_cast<CUmodule>(m.get());
    for (int k = 0; k < kKernelCount; ++k)
        if (m->has[k]) s.functions[reinterpret_cast<CUfunction>(&m->tokens[k])] = Function{m, KernelId(k)};
    s.modules[h] = std::move(m);
    *module = h;
    g_count.modules_loaded.fetch_add(1);
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
    WSYNC_FAKE_FAIL_POINT("cuModuleUnload");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    auto it = s.modules.find(module);
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (int k = 0; k < kKernelCount; ++k)
        s.functions.erase(reinterpret_cast<CUfunction>(&it->second->tokens[k]));
    s.modules.erase(it);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
    WSYNC_FAKE_FAIL_POINT("cuModuleGetFunction");
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.init_rc != CUDA_SUCCESS) return CUDA_ERROR_NOT_INITIALIZED;
    if (!fn || !name) return CUDA_ERROR_INVALID_VALUE;
    auto it = s.modules.find(module);
    if (it == s.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (int k = 0; k < kKernelCount; ++k) {
        if (it->second->has[k] && std::strcmp(name, kKernelNames[k]) == 0) {
            *fn = reinterpret_cast<CUfunction>(&it->second->tokens[k]);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz,
                        unsigned int shared_bytes, CUstream stream, void **params, void **extra) {
    WSYNC_FAKE_FAIL_POINT("cuLaunchKernel");
    int dev;
    KernelId kernel;
    {
        State &s = st();
        std::lock_guard<std::mutex> lk(s.mu);
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
        auto it = s.functions.find(fn);
        if (it == s.functions.end() || it->second.module->device != dev) return CUDA_ERROR_INVALID_HANDLE;
        kernel = it->second.kernel;
    }
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if (uint64_t(bx) * by * bz > kMaxThreadsPerBlock || shared_bytes > kMaxStaticSharedBytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (extra) return CUDA_ERROR_NOT_SUPPORTED;  // only kernelParams are emulated
    if (!params || !params[0] || !params[1] || !params[2]) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> x;
    if (CUresult rc = get_stream(stream, &x)) return rc;
    if (x->device >= 0 && x->device != dev) return CUDA_ERROR_INVALID_HANDLE;  // another context's
    // Arguments are captured at launch, as the driver copies them; the table is read when it runs.
    const uint64_t table = *static_cast<const CUdeviceptr *>(params[0]);
    const unsigned count = *static_cast<const unsigned *>(params[1]);
    const unsigned tiles = *static_cast<const unsigned *>(params[2]);
    int fail_rc = 0;
    const bool fail = inject_async("cuLaunchKernel", &fail_rc);
    // Every library kernel takes (const Entry *table, unsigned count, unsigned tiles).
    x->push([kernel, table, count, tiles, fail]() -> CUresult {
        if (fail) return CUDA_ERROR_ILLEGAL_ADDRESS;
        switch (kernel) {
        case kKPack: return run_pack(table, count, tiles);
        case kKPieceHash: return run_piece_hash(table, count, tiles);
        case kKDeltaCount: return run_delta_diff(table, count, tiles, false);
        case kKDeltaCompact: return run_delta_diff(table, count, tiles, true);
        case kKPatchScatter: return run_patch(table, count, tiles);
        case kKApplyBegin: return run_apply(table, count, tiles, true);
        case kKApplyEnd: return run_apply(table, count, tiles, false);
        default: return CUDA_ERROR_INVALID_HANDLE;
        }
    });
    g_count.kernel_launches.fetch_add(1);
    return CUDA_SUCCESS;
}

// Into pageable host memory (libwsync has no pinned memory) the driver returns only once the
// copy is done, in stream order: so does this. libwsync first waits for the stream itself, with
// its deadline, so the wait here is only for the copy.
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("cuMemcpyDtoHAsync_v2");
    int dev;
    if (CUresult rc = current_device(&dev)) return rc;
    if (bytes && !dst) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<Stream> s;
    if (CUresult rc = get_stream(stream, &s)) return rc;
    int fail_rc = 0;
    const bool fail = inject_async("cuMemcpyDtoHAsync_v2", &fail_rc);
    const uint64_t seq = s->push([dst, src, bytes, fail]() -> CUresult {
        if (fail) return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (!device_range_ok(src, bytes)) return CUDA_ERROR_ILLEGAL_ADDRESS;
        if (bytes) std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
        return CUDA_SUCCESS;
    });
    g_count.memcpy_calls.fetch_add(1);
    s->wait(seq);
    return s->query_seq(seq);
}

// ---- test hooks -------------------------------------------------------------------------------
// Synchronous copies, which libwsync never calls but tests/gpu/test_gpu_hw.c uses to write and
// read device memory the way it must on a real GPU. Like the driver's, they wait for the
// process's queued work first.
WSYNC_FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, std::size_t bytes) {
    int dev;
    if (CUresult rc = current_device(&dev)) return rc;
    if (sync_all_streams()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (!device_range_ok(dst, bytes) || (bytes && !src)) return CUDA_ERROR_INVALID_VALUE;
    if (bytes) std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
    return CUDA_SUCCESS;
}

WSYNC_FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, std::size_t bytes) {
    int dev;
    if (CUresult rc = current_device(&dev)) return rc;
    if (sync_all_streams()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (!device_range_ok(src, bytes) || (bytes && !dst)) return CUDA_ERROR_INVALID_VALUE;
    if (bytes) std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
    return CUDA_SUCCESS;
}

WSYNC_FAKE_EXPORT void wsync_fake_stats(struct wsync_fake_stats *out) {
    if (!out) return;
    std::memset(out, 0, sizeof *out);
    out->allocs = g_count.allocs.load();
    out->frees = g_count.frees.load();
    out->ipc_get_handle = g_count.ipc_get_handle.load();
    out->ipc_open = g_count.ipc_open.load();
    out->ipc_close = g_count.ipc_close.load();
    out->kernel_launches = g_count.kernel_launches.load();
    out->memcpy_calls = g_count.memcpy_calls.load();
    out->modules_loaded = g_count.modules_loaded.load();
    out->broadcasts = g_broadcasts.load();
    out->stream_failures = Stream::g_stream_failures.load();
    out->reclaimed = g_count.reclaimed.load();
    out->comms_live = nccl_live_comms();
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    for (auto &kv : s.allocs)
        if (!kv.second.vmm_mapped)
            (kv.second.pinned_host ? out->pinned_live : kv.second.ipc ? out->ipc_live : out->live_allocs) += 1;
    out->host_allocs = g_count.host_allocs.load();
    out->host_frees = g_count.host_frees.load();
    out->streams_live = static_cast<long long>(s.streams.size());
    out->modules_live = static_cast<long long>(s.modules.size());
    out->events_live = static_cast<long long>(s.events.size());
    out->vmm_exports = g_vmm_exports.load();
    out->vmm_imports = g_vmm_imports.load();
    out->vmm_handles_live = static_cast<long long>(s.mem_handles.size());
    for (auto &kv : s.allocs) out->vmm_maps_live += kv.second.vmm_mapped ? 1 : 0;
    out->vmm_reserved_live = static_cast<long long>(s.reserved.size());
}

WSYNC_FAKE_EXPORT void wsync_fake_reset_stats(void) {
    g_count.reset();
    g_broadcasts.store(0);
    Stream::g_stream_failures.store(0);
}

WSYNC_FAKE_EXPORT void wsync_fake_set_fail(const char *function_name, int after_n_calls, int result) {
    std::lock_guard<std::mutex> lk(g_inj_mu);
    if (!function_name) {
        g_injections.clear();
        return;
    }
    for (auto it = g_injections.begin(); it != g_injections.end(); ++it) {
        if (it->name == function_name) {
            g_injections.erase(it);
            break;
        }
    }
    if (after_n_calls >= 0) g_injections.push_back({function_name, after_n_calls, result});
}

WSYNC_FAKE_EXPORT void wsync_fake_allow_driver_after_fork(int on) {
    wsync_fake::g_driver_after_fork.store(on != 0);
}

WSYNC_FAKE_EXPORT void wsync_fake_set_stream_delay_ms(int ms) {
    g_stream_delay_ms.store(ms > 0 ? ms : 0);
}

WSYNC_FAKE_EXPORT int wsync_fake_shm_count(const char *prefix) {
    const std::string want = prefix ? prefix : "wsync-fake";
    DIR *d = opendir("/dev/shm");
    if (!d) return -1;
    int n = 0;
    while (struct dirent *e = readdir(d))
        if (std::strncmp(e->d_name, want.c_str(), want.size()) == 0) ++n;
    closedir(d);
    return n;
}

WSYNC_FAKE_EXPORT long long wsync_fake_freed_while_imported(void) {
    return g_freed_while_imported.load();
}

WSYNC_FAKE_EXPORT int wsync_fake_mem_alloc_unexportable(unsigned long long *dptr, std::size_t bytes) {
    CUresult rc = cuMemAlloc(dptr, bytes);
    if (rc != CUDA_SUCCESS) return rc;
    State &s = st();
    std::lock_guard<std::mutex> lk(s.mu);
    s.allocs[*dptr].unexportable = true;
    return CUDA_SUCCESS;
}

WSYNC_FAKE_EXPORT int wsync_fake_mem_alloc_span(unsigned long long *dptr, std::size_t bytes,
                                                std::size_t piece_bytes) {
    State &s = st();
    int dev;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    }
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (!dptr || bytes == 0 || piece_bytes == 0 || piece_bytes % page) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t len = page_round(bytes);
    // The reserved range (cuMemAddressReserve), then one mapped handle a piece (cuMemMap).
    void *range = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t span;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        span = ++s.next_span;
    }
    for (uint64_t at = 0; at < len; at += piece_bytes) {
        const uint64_t piece = std::min<uint64_t>(piece_bytes, len - at);
        std::string name;
        uint64_t serial = 0;
        void *p = nullptr;
        if (CUresult rc = new_shm_mapping(piece, static_cast<char *>(range) + at, &name, &serial, &p)) {
            for (uint64_t back = 0; back < at; back += piece_bytes) cuMemFree(reinterpret_cast<CUdeviceptr>(range) + back);
            munmap(static_cast<char *>(range) + at, len - at);
            return rc;
        }
        add_alloc(p, piece, piece, name, dev, serial, span);
    }
    *dptr = reinterpret_cast<unsigned long long>(range);
    return CUDA_SUCCESS;
}

WSYNC_FAKE_EXPORT int wsync_fake_mem_alloc_adjacent(unsigned long long *dptr, std::size_t bytes,
                                                    std::size_t piece_bytes) {
    State &s = st();
    int dev;
    {
        std::lock_guard<std::mutex> lk(s.mu);
        if (CUresult rc = ctx_device_locked(s, &dev)) return rc;
    }
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (!dptr || bytes == 0 || piece_bytes == 0 || piece_bytes % page) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t len = page_round(bytes);
    void *range = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    for (uint64_t at = 0; at < len; at += piece_bytes) {
        const uint64_t piece = std::min<uint64_t>(piece_bytes, len - at);
        std::string name;
        uint64_t serial = 0;
        void *p = nullptr;
        if (CUresult rc = new_shm_mapping(piece, static_cast<char *>(range) + at, &name, &serial, &p)) {
            for (uint64_t back = 0; back < at; back += piece_bytes) cuMemFree(reinterpret_cast<CUdeviceptr>(range) + back);
            munmap(static_cast<char *>(range) + at, len - at);
            return rc;
        }
        add_alloc(p, piece, piece, name, dev, serial, 0);  // its own allocation, as cuMemAlloc's
    }
    *dptr = reinterpret_cast<unsigned long long>(range);
    return CUDA_SUCCESS;
}

WSYNC_FAKE_EXPORT int wsync_fake_stream_hold(void *stream) {
    std::shared_ptr<Stream> x;
    if (CUresult rc = get_stream(static_cast<CUstream>(stream), &x)) return rc;
    hold_stream(*x);
    return CUDA_SUCCESS;
}

WSYNC_FAKE_EXPORT void wsync_fake_stream_hold_next(int n) { g_hold_next.store(n > 0 ? n : 0); }

WSYNC_FAKE_EXPORT void wsync_fake_stream_release_held(void) {
    std::lock_guard<std::mutex> lk(g_hold_mu);
    ++g_hold_generation;
    g_hold_cv.notify_all();
}
