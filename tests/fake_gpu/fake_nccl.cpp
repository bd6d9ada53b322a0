// The fake NCCL of libwsync_fakegpu.so: every function of WSYNC_NCCL_FUNCTIONS
// (src/gpu/api.hpp), exported under NCCL's names, working between processes through POSIX shared
// memory. It runs the communicator life cycle and ncclBroadcast of libwsync's nccl_broadcast
// strategy; nothing else of NCCL.
//
// What it mimics, and how:
// - ncclGetVersion: 22809 (2.28.9), or WSYNC_FAKE_NCCL_VERSION.
// - ncclGetUniqueId: 128 bytes, a magic and 16 random bytes (getrandom) naming the control
//   segment "/wsync-fakenccl-<32 hex>" every rank of the communicator maps: it takes the place of
//   NCCL's bootstrap root.
// - ncclCommInitRankConfig: checks the config as NCCL does (size, magic 0xcafebeef), needs a
//   current CUDA context (the communicator's device is that context's device; without one:
//   ncclInvalidUsage, where NCCL would pick device 0 itself). A rank joins by claiming its slot
//   in the control segment (created by whichever rank comes first, up to 64 ranks); a slot held
//   by a live process is ncclInvalidUsage (one held by a dead process is taken over). The
//   communicator is ready when every slot is taken. Non-blocking (config->blocking == 0): returns
//   ncclInProgress at once and joins in a background thread; ncclCommGetAsyncError says
//   ncclInProgress until then, ncclSuccess after. Blocking (the default, and
//   NCCL_CONFIG_UNDEF_INT): waits for every rank with no timeout, as NCCL does; on failure it
//   returns the error and sets *comm to NULL. WSYNC_FAKE_NCCL_INIT_ERROR=1 makes every init end
//   in ncclSystemError (without joining); wsync_fake_nccl_set_init_delay_ms slows it down.
// - One GPU per rank, as NCCL requires ("Duplicate GPU detected : rank R and rank S both on
//   CUDA device ...", ncclInvalidUsage, during the init, once the bootstrap has shown every
//   rank the others): each rank publishes its device's UUID (cuDeviceGetUuid of the current
//   context's device) in its slot; once every rank has, a rank whose UUID another rank also has
//   fails its init with ncclInvalidUsage and prints that line to stderr (leaving only after
//   every rank has seen the table, so its twin fails too): non-blocking, ncclCommInitRankConfig
//   returned ncclInProgress and ncclCommGetAsyncError turns from ncclInProgress to
//   ncclInvalidUsage; blocking, the call returns it with *comm NULL. Two ranks in one process
//   on one device fail alike. A rank on a GPU of its own in such a group never completes its
//   init (it waits, as at NCCL's next bootstrap step, for ranks that left) until it is aborted.
//   wsync_fake_nccl_init_calls() counts this process's ncclCommInitRankConfig calls, so a test
//   can tell that a layout was refused before any init.
// - ncclBroadcast(ncclUint8 only) is enqueued on the CUDA stream. Every call of a communicator
//   gets the next sequence number k (1, 2, ...), the same on every rank as collectives are
//   called in the same order. The root publishes (k, the shm name of the allocation holding
//   `send`, offset, bytes) in the control segment, copies send to recv locally if they differ,
//   and completes when every other rank reports k done. A receiver waits for k's publication,
//   maps the root's allocation by name (mappings are cached per communicator), copies into recv
//   and reports k done. A receiver whose byte count or root differs fails: its stream fails and
//   its asynchronous error becomes ncclInvalidUsage (it still reports k done so the root is not
//   left waiting; the real NCCL would corrupt memory or hang). Waiting operations poll every
//   ~100 us and never give up by themselves (a dead peer hangs them, as it hangs NCCL) until
//   ncclCommAbort.
// - ncclCommAbort returns promptly, even while an operation waits: every pending operation of the
//   communicator fails (its stream fails). As in NCCL the handle is dead afterwards; the fake
//   remembers it, and every call with it (ncclCommGetAsyncError included, which also stores
//   ncclInvalidUsage in *error) returns ncclInvalidUsage rather than touching freed memory.
// - ncclCommDestroy waits for the communicator's pending operations (no timeout, as NCCL), then
//   leaves; the handle is dead afterwards, as after an abort.
// - ncclCommFinalize (nccl.h: "flushes all issued communications, and marks communicator state
//   as ncclInProgress. The state will change to ncclSuccess when the communicator is globally
//   quiescent"): on a non-blocking communicator it returns ncclInProgress and
//   ncclCommGetAsyncError says ncclInProgress until every pending operation has finished, which
//   for a broadcast a peer never posts is never; a blocking one waits for that (no timeout).
//   Later operations are ncclInvalidUsage; ncclCommDestroy then returns at once.
// - wsync_fake_nccl_set_in_progress(polls) makes ncclBroadcast on a non-blocking communicator
//   return ncclInProgress without enqueuing anything: the operation reaches its stream only at
//   the polls-th ncclCommGetAsyncError of that communicator, which reports ncclSuccess (the
//   earlier ones ncclInProgress), as NCCL may finish enqueuing in the background. An event
//   recorded on the stream before then completes before the broadcast runs. Another NCCL call
//   on the communicator meanwhile is ncclInvalidUsage.
// - The last rank to leave (destroy, abort, or exit() of a process with live communicators)
//   unlinks the control segment. abort and destroy of NULL are ncclSuccess, as in NCCL.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "fake_gpu.h"
#include "fake_internal.hpp"

using namespace wsync_fake;

#define WSYNC_FAKE_DECLARE(field, symbol, ret, params)                                           \
    extern "C" __attribute__((visibility("default"))) ret field params __asm__(symbol);
WSYNC_NCCL_FUNCTIONS(WSYNC_FAKE_DECLARE)
WSYNC_CUDA_FUNCTIONS(WSYNC_FAKE_DECLARE)  // fake_cuda.cpp's: cuDeviceGetUuid names a rank's GPU
#undef WSYNC_FAKE_DECLARE

namespace wsync_fake {

std::atomic<long long> g_broadcasts{0};

namespace {

constexpr int kDefaultVersion = 22809;  // NCCL 2.28.9
constexpr int kMaxRanks = 64;
constexpr char kIdMagic[8] = {'W', 'S', 'F', 'K', 'N', 'C', 'C', 'L'};
constexpr uint64_t kCtlMagic = 0x31304c43434e5357ull;  // "WSNCCL01"
constexpr uint64_t kPubFailed = 1;                     // the root could not read `send`

// The control segment. Only lock-free 64-bit atomics, which work between processes mapping the
// same memory; all-zero bytes (what ftruncate gives) are their zero state. The creator fills in
// nranks and then sets magic; the others wait for magic.
static_assert(std::atomic<uint64_t>::is_always_lock_free, "atomics in shared memory");
struct alignas(64) Slot {
    std::atomic<uint64_t> pid;   // process holding this rank; 0: free
    std::atomic<uint64_t> done;  // last operation this rank completed
    std::atomic<uint64_t> uuid[2];  // the rank's device UUID, published before `ready`
    std::atomic<uint64_t> ready;    // == pid once `uuid` is this holder's
    std::atomic<uint64_t> saw;      // == pid once this holder has seen every rank ready
};
struct Ctl {
    std::atomic<uint64_t> magic;
    std::atomic<uint64_t> nranks;
    std::atomic<uint64_t> attached;  // ranks mapped now; the last one out unlinks
    // The current broadcast's publication, written by its root before pub_seq.
    std::atomic<uint64_t> pub_seq;
    std::atomic<uint64_t> pub_root;
    std::atomic<uint64_t> pub_offset;
    std::atomic<uint64_t> pub_bytes;
    std::atomic<uint64_t> pub_flags;
    std::atomic<uint64_t> pub_name[8];  // NUL-padded shm name, 8 bytes a word
    Slot slots[kMaxRanks];
};

struct Comm {
    int nranks = 0;
    int rank = 0;
    int device = 0;
    CUuuid uuid{};                      // the device's, as cuDeviceGetUuid says
    std::string seg;                    // control segment name
    Ctl *ctl = nullptr;                 // set before the communicator is usable
    bool claimed = false;               // holds its slot
    bool attached = false;              // counted in ctl->attached
    std::atomic<int> async{ncclInProgress};
    std::atomic<bool> abort{false};
    std::atomic<int> pending{0};        // enqueued broadcasts not finished
    bool blocking = true;               // config->blocking
    std::atomic<bool> finalizing{false};  // ncclCommFinalize was called
    // A broadcast that returned ncclInProgress: enqueued on `deferred_stream` at the
    // `deferred_polls`-th ncclCommGetAsyncError (wsync_fake_nccl_set_in_progress).
    std::mutex deferred_mu;
    Op deferred_op;
    std::shared_ptr<Stream> deferred_stream;
    int deferred_polls = 0;
    uint64_t next_seq = 0;              // under NState::mu
    std::thread joiner;                 // non-blocking init
    std::mutex maps_mu;
    std::map<std::string, std::pair<void *, size_t>> maps;  // peers' allocations, read-only

    ~Comm() {
        for (auto &kv : maps) munmap(kv.second.first, kv.second.second);
        if (ctl) munmap(ctl, sizeof(Ctl));
    }
};

struct NState {
    std::mutex mu;
    std::map<ncclComm_t, std::shared_ptr<Comm>> live;
    std::set<ncclComm_t> dead;  // aborted or destroyed handles
    NState *abandoned = nullptr;
};
NState *&nstate_ptr() {
    static NState *s = new NState;  // never destroyed (threads may outlive static destructors)
    return s;
}
NState &ns() { return *nstate_ptr(); }

std::atomic<int> g_init_delay_ms{0};
std::atomic<long long> g_init_calls{0};  // ncclCommInitRankConfig calls of this process
std::atomic<int> g_in_progress_polls{0};

bool has_deferred(Comm &c) {
    std::lock_guard<std::mutex> lk(c.deferred_mu);
    return static_cast<bool>(c.deferred_op);
}

// One ncclCommGetAsyncError poll of a call in progress: true while it still is; the poll that
// ends it enqueues the deferred broadcast.
bool poll_deferred(Comm &c) {
    std::lock_guard<std::mutex> lk(c.deferred_mu);
    if (!c.deferred_op) return false;
    if (--c.deferred_polls > 0) return true;
    enqueue(*c.deferred_stream, std::move(c.deferred_op));
    c.deferred_op = nullptr;
    c.deferred_stream.reset();
    g_broadcasts.fetch_add(1);
    return false;
}

// Drops a deferred broadcast (abort, destroy): it never runs, and it no longer counts pending.
void drop_deferred(Comm &c) {
    std::lock_guard<std::mutex> lk(c.deferred_mu);
    c.deferred_op = nullptr;
    c.deferred_stream.reset();
}

bool alive(uint64_t pid) {
    return pid && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and libwsync name a GPU.
std::string gpu_name(const CUuuid &u) {
    static const char *hex = "0123456789abcdef";
    std::string out = "GPU-";
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
        const auto b = static_cast<unsigned char>(u.bytes[i]);
        out += hex[b >> 4];
        out += hex[b & 15];
    }
    return out;
}

// Polls `ready` until it holds (true) or the communicator is aborted (false).
template <class F>
bool wait_for(const Comm &c, F ready) {
    for (;;) {
        if (ready()) return true;
        if (c.abort.load()) return false;
        poll_sleep();
    }
}

// Attaches to (or creates) the control segment, claims the slot and waits for every rank.
ncclResult_t join(Comm &c) {
    for (int waited = 0; waited < g_init_delay_ms.load(); ++waited) {
        if (c.abort.load()) return ncclInvalidUsage;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const char *err = std::getenv("WSYNC_FAKE_NCCL_INIT_ERROR");
    if (err && std::strcmp(err, "1") == 0) return ncclSystemError;
    const char *name = c.seg.c_str();
    void *m = MAP_FAILED;
    for (;;) {
        if (c.abort.load()) return ncclInvalidUsage;
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0) {  // first here: create it
            if (ftruncate(fd, sizeof(Ctl)) == 0)
                m = mmap(nullptr, sizeof(Ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (m == MAP_FAILED) {
                shm_unlink(name);
                return ncclSystemError;
            }
            auto *ctl = static_cast<Ctl *>(m);
            ctl->nranks.store(static_cast<uint64_t>(c.nranks));
            ctl->magic.store(kCtlMagic, std::memory_order_release);
            break;
        }
        if (errno != EEXIST) return ncclSystemError;
        fd = shm_open(name, O_RDWR, 0);
        if (fd < 0) {
            if (errno == ENOENT) continue;  // its last user just removed it: start again
            return ncclSystemError;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0) {
            close(fd);
            return ncclSystemError;
        }
        if (static_cast<size_t>(sb.st_size) < sizeof(Ctl)) {  // its creator is sizing it
            close(fd);
            poll_sleep();
            continue;
        }
        m = mmap(nullptr, sizeof(Ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) return ncclSystemError;
        break;
    }
    c.ctl = static_cast<Ctl *>(m);
    Ctl &ctl = *c.ctl;
    ctl.attached.fetch_add(1);
    c.attached = true;
    if (!wait_for(c, [&] { return ctl.magic.load(std::memory_order_acquire) == kCtlMagic; }))
        return ncclInvalidUsage;
    if (ctl.nranks.load() != static_cast<uint64_t>(c.nranks)) return ncclInvalidUsage;
    const uint64_t me = static_cast<uint64_t>(getpid());
    Slot &slot = ctl.slots[c.rank];
    uint64_t holder = 0;
    if (!slot.pid.compare_exchange_strong(holder, me)) {
        if (alive(holder) || !slot.pid.compare_exchange_strong(holder, me)) {
            std::fprintf(stderr, "fake NCCL: rank %d of %s is already taken by pid %llu\n", c.rank,
                         name, static_cast<unsigned long long>(holder));
            return ncclInvalidUsage;
        }
    }
    slot.done.store(0);
    uint64_t words[2];
    std::memcpy(words, c.uuid.bytes, sizeof words);
    slot.uuid[0].store(words[0], std::memory_order_relaxed);
    slot.uuid[1].store(words[1], std::memory_order_relaxed);
    slot.ready.store(me, std::memory_order_release);
    c.claimed = true;
    if (!wait_for(c, [&] {
            for (int r = 0; r < c.nranks; ++r) {
                const uint64_t pid = ctl.slots[r].pid.load();
                if (!pid || ctl.slots[r].ready.load(std::memory_order_acquire) != pid) return false;
            }
            return true;
        }))
        return ncclInvalidUsage;
    // Every rank is here: NCCL's duplicate-GPU check (init.cc, "Duplicate GPU detected"),
    // which every rank makes on the peer table the bootstrap gave all of them.
    slot.saw.store(me, std::memory_order_release);
    bool others_clash = false;
    int twin = -1;
    for (int r = 0; r < c.nranks; ++r) {
        for (int q = r + 1; q < c.nranks; ++q) {
            if (ctl.slots[r].uuid[0].load() != ctl.slots[q].uuid[0].load() ||
                ctl.slots[r].uuid[1].load() != ctl.slots[q].uuid[1].load())
                continue;
            if (r != c.rank && q != c.rank) others_clash = true;
            else if (twin < 0) twin = r == c.rank ? q : r;
        }
    }
    if (twin >= 0) {
        // Leave only once every rank has seen the table, so the twin sees the clash too
        // rather than a rank that left.
        wait_for(c, [&] {
            for (int r = 0; r < c.nranks; ++r) {
                const uint64_t pid = ctl.slots[r].pid.load();
                if (pid && ctl.slots[r].saw.load(std::memory_order_acquire) != pid) return false;
            }
            return true;
        });
        std::fprintf(stderr,
                     "fake NCCL: Duplicate GPU detected : rank %d and rank %d both on CUDA "
                     "device %s (communicator %s)\n",
                     c.rank, twin, gpu_name(c.uuid).c_str(), name);
        return ncclInvalidUsage;
    }
    // Two other ranks share a GPU: they fail and leave; this rank waits for them, as NCCL's
    // next bootstrap step does, until it is aborted.
    if (others_clash && !wait_for(c, [] { return false; })) return ncclInvalidUsage;
    return ncclSuccess;
}

// Gives up the slot and the segment; the last one out removes the segment's name. The mapping
// stays until the Comm goes (operations still running may read it).
void leave(Comm &c) {
    if (!c.ctl) return;
    if (c.claimed) {
        uint64_t me = static_cast<uint64_t>(getpid());
        c.ctl->slots[c.rank].pid.compare_exchange_strong(me, 0);
        c.claimed = false;
    }
    if (c.attached) {
        if (c.ctl->attached.fetch_sub(1) == 1) shm_unlink(c.seg.c_str());
        c.attached = false;
    }
}

// An error found by an operation: the communicator's asynchronous error, unless one is there.
void set_error(Comm &c, ncclResult_t e) {
    int expected = ncclSuccess;
    c.async.compare_exchange_strong(expected, e);
}

// A peer's allocation, mapped read-only once per communicator.
void *map_peer(Comm &c, const std::string &name, uint64_t need) {
    std::lock_guard<std::mutex> lk(c.maps_mu);
    auto it = c.maps.find(name);
    if (it == c.maps.end()) {
        int fd = shm_open(name.c_str(), O_RDONLY, 0);
        if (fd < 0) return nullptr;
        struct stat sb;
        void *m = MAP_FAILED;
        if (fstat(fd, &sb) == 0 && sb.st_size > 0)
            m = mmap(nullptr, static_cast<size_t>(sb.st_size), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) return nullptr;
        it = c.maps.emplace(name, std::make_pair(m, static_cast<size_t>(sb.st_size))).first;
    }
    return need <= it->second.second ? it->second.first : nullptr;
}

bool all_done(const Comm &c, uint64_t k, bool include_self) {
    for (int r = 0; r < c.nranks; ++r)
        if ((include_self || r != c.rank) && c.ctl->slots[r].done.load(std::memory_order_acquire) < k)
            return false;
    return true;
}

// Operation k of a broadcast, run by the stream.
CUresult run_broadcast(Comm &c, uint64_t k, uint64_t send, uint64_t recv, uint64_t count,
                       int root) {
    Ctl &ctl = *c.ctl;
    Slot &mine = ctl.slots[c.rank];
    if (c.rank == root) {
        // The publication slot is free once every rank has finished operation k - 1.
        if (!wait_for(c, [&] { return all_done(c, k - 1, true); })) return CUDA_ERROR_ILLEGAL_ADDRESS;
        Region src;
        const bool readable = count == 0 || find_region(send, count, &src);
        char name[64] = {};
        std::strncpy(name, src.name.c_str(), sizeof name - 1);
        for (int i = 0; i < 8; ++i) {
            uint64_t w;
            std::memcpy(&w, name + 8 * i, 8);
            ctl.pub_name[i].store(w, std::memory_order_relaxed);
        }
        ctl.pub_root.store(static_cast<uint64_t>(root), std::memory_order_relaxed);
        ctl.pub_offset.store(send - src.base, std::memory_order_relaxed);
        ctl.pub_bytes.store(count, std::memory_order_relaxed);
        ctl.pub_flags.store(readable ? 0 : kPubFailed, std::memory_order_relaxed);
        ctl.pub_seq.store(k, std::memory_order_release);
        // A bad address fails this rank's operation; it still counts k done so the next
        // operation (on another stream) does not wait for it. Receivers fail too, not hang.
        if (!readable || (recv != send && count && !find_region(recv, count, nullptr))) {
            mine.done.store(k, std::memory_order_release);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        if (recv != send && count)
            std::memmove(reinterpret_cast<void *>(recv), reinterpret_cast<const void *>(send), count);
        if (!wait_for(c, [&] { return all_done(c, k, false); })) return CUDA_ERROR_ILLEGAL_ADDRESS;
        mine.done.store(k, std::memory_order_release);
        return CUDA_SUCCESS;
    }
    if (!wait_for(c, [&] { return ctl.pub_seq.load(std::memory_order_acquire) >= k; }))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (ctl.pub_seq.load(std::memory_order_acquire) != k) {  // cannot happen: k waits for us
        set_error(c, ncclInternalError);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    char name[65] = {};
    for (int i = 0; i < 8; ++i) {
        uint64_t w = ctl.pub_name[i].load(std::memory_order_relaxed);
        std::memcpy(name + 8 * i, &w, 8);
    }
    const uint64_t offset = ctl.pub_offset.load(std::memory_order_relaxed);
    const uint64_t bytes = ctl.pub_bytes.load(std::memory_order_relaxed);
    ncclResult_t err = ncclSuccess;
    CUresult rc = CUDA_SUCCESS;
    if (ctl.pub_flags.load(std::memory_order_relaxed) & kPubFailed) {
        err = ncclRemoteError;
    } else if (ctl.pub_root.load(std::memory_order_relaxed) != static_cast<uint64_t>(root) ||
               bytes != count) {
        std::fprintf(stderr,
                     "fake NCCL: broadcast %llu: rank %d expects %llu bytes from root %d, root %llu "
                     "sends %llu\n",
                     static_cast<unsigned long long>(k), c.rank,
                     static_cast<unsigned long long>(count), root,
                     static_cast<unsigned long long>(ctl.pub_root.load()),
                     static_cast<unsigned long long>(bytes));
        err = ncclInvalidUsage;
    } else if (count) {
        const void *from = map_peer(c, name, offset + count);
        if (!from) err = ncclSystemError;
        else if (!find_region(recv, count, nullptr)) rc = CUDA_ERROR_ILLEGAL_ADDRESS;
        else std::memcpy(reinterpret_cast<void *>(recv), static_cast<const char *>(from) + offset, count);
    }
    mine.done.store(k, std::memory_order_release);  // even on failure: the root must not hang
    if (err != ncclSuccess) {
        set_error(c, err);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    return rc;
}

// Finds a live communicator; ncclInvalidUsage for an aborted or destroyed one.
ncclResult_t lookup(ncclComm_t comm, std::shared_ptr<Comm> *out) {
    if (!comm) return ncclInvalidArgument;
    NState &s = ns();
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.live.find(comm);
    if (it != s.live.end()) {
        *out = it->second;
        return ncclSuccess;
    }
    return s.dead.count(comm) ? ncclInvalidUsage : ncclInvalidArgument;
}

// Removes a communicator from the live set (its handle is dead from now on).
void bury(ncclComm_t comm) {
    NState &s = ns();
    std::lock_guard<std::mutex> lk(s.mu);
    s.live.erase(comm);
    s.dead.insert(comm);
}

void atfork_prepare() { ns().mu.lock(); }
void atfork_parent() { ns().mu.unlock(); }
void atfork_child() {
    NState *old = nstate_ptr();
    old->mu.unlock();
    auto *fresh = new NState;
    fresh->abandoned = old;  // the parent's communicators are not this process's
    nstate_ptr() = fresh;
    g_broadcasts.store(0);
    g_init_calls.store(0);
}

__attribute__((constructor)) void fake_nccl_load() {
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

// exit() with communicators alive: leave them, so the last rank out removes the segment.
__attribute__((destructor)) void fake_nccl_unload() {
    NState &s = ns();
    std::unique_lock<std::mutex> lk(s.mu, std::defer_lock);
    for (int i = 0; i < 1000 && !lk.try_lock(); ++i) poll_sleep();
    if (!lk.owns_lock()) return;
    for (auto &kv : s.live) {
        Comm &c = *kv.second;
        c.abort.store(true);
        if (c.joiner.joinable()) c.joiner.join();
        leave(c);
    }
}

}  // namespace

long long nccl_live_comms() {
    NState &s = ns();
    std::lock_guard<std::mutex> lk(s.mu);
    return static_cast<long long>(s.live.size());
}

}  // namespace wsync_fake

// ---- entry points -----------------------------------------------------------------------------
ncclResult_t ncclGetVersion(int *version) {
    WSYNC_FAKE_FAIL_POINT("ncclGetVersion");
    if (!version) return ncclInvalidArgument;
    const char *v = std::getenv("WSYNC_FAKE_NCCL_VERSION");
    *version = v && *v ? std::atoi(v) : kDefaultVersion;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {  // NCCL's texts
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    WSYNC_FAKE_FAIL_POINT("ncclGetUniqueId");
    if (!id) return ncclInvalidArgument;
    std::memset(id, 0, sizeof *id);
    std::memcpy(id->internal, kIdMagic, sizeof kIdMagic);
    if (getrandom(id->internal + sizeof kIdMagic, 16, 0) != 16) return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    g_init_calls.fetch_add(1);
    WSYNC_FAKE_FAIL_POINT("ncclCommInitRankConfig");
    if (!comm) return ncclInvalidArgument;
    *comm = nullptr;
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    bool blocking = true;
    if (config) {
        if (config->size < offsetof(ncclConfig_t, netName) + sizeof(config->netName) ||
            config->magic != kNcclConfigMagic)
            return ncclInvalidArgument;
        blocking = config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT means the default: blocking
    }
    if (std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) != 0) return ncclInvalidArgument;
    int dev;
    if (current_device(&dev) != CUDA_SUCCESS) {
        std::fprintf(stderr, "fake NCCL: ncclCommInitRankConfig without a current CUDA context\n");
        return ncclInvalidUsage;
    }
    CUuuid uuid;
    if (cuDeviceGetUuid(&uuid, dev) != CUDA_SUCCESS) return ncclUnhandledCudaError;
    auto c = std::make_shared<Comm>();
    c->nranks = nranks;
    c->rank = rank;
    c->device = dev;
    c->uuid = uuid;
    c->blocking = blocking;
    static const char *hex = "0123456789abcdef";
    c->seg = "/wsync-fakenccl-";
    for (int i = 0; i < 16; ++i) {
        auto b = static_cast<unsigned char>(id.internal[sizeof kIdMagic + i]);
        c->seg += hex[b >> 4];
        c->seg += hex[b & 15];
    }
    const auto handle = reinterpret_cast<ncclComm_t>(c.get());
    if (blocking) {
        ncclResult_t rc = join(*c);
        if (rc != ncclSuccess) {
            leave(*c);
            return rc;
        }
        c->async.store(ncclSuccess);
    }
    {
        NState &s = ns();
        std::lock_guard<std::mutex> lk(s.mu);
        s.dead.erase(handle);  // an address freed earlier may come back
        s.live[handle] = c;
        if (!blocking) {
            Comm *raw = c.get();  // lives until abort/destroy, which join this thread first
            try {
                c->joiner = std::thread([raw] { raw->async.store(join(*raw)); });
            } catch (const std::exception &) {
                s.live.erase(handle);
                return ncclSystemError;
            }
        }
    }
    *comm = handle;
    return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
    WSYNC_FAKE_FAIL_POINT("ncclCommGetAsyncError");
    if (!error) return ncclInvalidArgument;
    std::shared_ptr<Comm> c;
    ncclResult_t rc = lookup(comm, &c);
    if (rc != ncclSuccess) {
        *error = rc;
        return rc;
    }
    ncclResult_t state = c->async.load();
    if (state == ncclSuccess && poll_deferred(*c)) state = ncclInProgress;
    if (state == ncclSuccess && c->finalizing.load() && c->pending.load() > 0) state = ncclInProgress;
    *error = state;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    WSYNC_FAKE_FAIL_POINT("ncclCommAbort");
    if (!comm) return ncclSuccess;
    std::shared_ptr<Comm> c;
    if (ncclResult_t rc = lookup(comm, &c)) return rc;
    bury(comm);
    drop_deferred(*c);
    c->abort.store(true);  // waiting operations and a joining thread see it within ~100 us
    if (c->joiner.joinable()) c->joiner.join();
    leave(*c);
    return ncclSuccess;  // operations still holding `c` end soon; the last one frees it
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    WSYNC_FAKE_FAIL_POINT("ncclCommDestroy");
    if (!comm) return ncclSuccess;
    std::shared_ptr<Comm> c;
    if (ncclResult_t rc = lookup(comm, &c)) return rc;
    bury(comm);
    drop_deferred(*c);
    if (c->async.load() == ncclInProgress) c->abort.store(true);  // destroyed while joining
    if (c->joiner.joinable()) c->joiner.join();
    // NCCL finishes the communicator's outstanding work first; so does this (no timeout).
    while (c->pending.load() > 0) poll_sleep();
    leave(*c);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, std::size_t count, int datatype, int root,
                           ncclComm_t comm, CUstream stream) {
    WSYNC_FAKE_FAIL_POINT("ncclBroadcast");
    std::shared_ptr<Comm> c;
    if (ncclResult_t rc = lookup(comm, &c)) return rc;
    if (c->async.load() != ncclSuccess) return ncclInvalidUsage;  // not ready, or failed
    if (c->finalizing.load() || has_deferred(*c)) return ncclInvalidUsage;
    if (datatype != ncclUint8) return ncclInvalidArgument;        // the only type the fake moves
    if (root < 0 || root >= c->nranks) return ncclInvalidArgument;
    std::shared_ptr<Stream> s;
    if (get_stream(stream, &s) != CUDA_SUCCESS) return ncclUnhandledCudaError;
    if (stream_device(*s) >= 0 && stream_device(*s) != c->device) return ncclUnhandledCudaError;
    int fail_rc = 0;
    const bool fail = inject_async("ncclBroadcast", &fail_rc);
    uint64_t k;
    {
        NState &ss = ns();
        std::lock_guard<std::mutex> lk(ss.mu);
        k = ++c->next_seq;
    }
    c->pending.fetch_add(1);
    // Counts the operation finished when the stream lets go of it, run or skipped.
    std::shared_ptr<Comm> guard(c.get(), [c](Comm *p) { p->pending.fetch_sub(1); });
    const auto src = reinterpret_cast<uint64_t>(send), dst = reinterpret_cast<uint64_t>(recv);
    Op op = [guard, k, src, dst, count, root, fail, fail_rc]() -> CUresult {
        if (fail) {
            set_error(*guard, fail_rc ? fail_rc : ncclSystemError);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        if (guard->abort.load()) return CUDA_ERROR_ILLEGAL_ADDRESS;
        return run_broadcast(*guard, k, src, dst, count, root);
    };
    const int polls = g_in_progress_polls.load();
    if (polls > 0 && !c->blocking) {
        std::lock_guard<std::mutex> lk(c->deferred_mu);
        c->deferred_op = std::move(op);
        c->deferred_stream = s;
        c->deferred_polls = polls;
        return ncclInProgress;
    }
    enqueue(*s, std::move(op));
    g_broadcasts.fetch_add(1);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    WSYNC_FAKE_FAIL_POINT("ncclCommFinalize");
    std::shared_ptr<Comm> c;
    if (ncclResult_t rc = lookup(comm, &c)) return rc;
    if (c->async.load() == ncclInProgress || has_deferred(*c)) return ncclInvalidUsage;
    if (c->finalizing.exchange(true)) return ncclInvalidUsage;  // finalized twice
    if (!c->blocking) return ncclInProgress;  // ncclCommGetAsyncError tells when it is quiescent
    while (c->pending.load() > 0 && !c->abort.load()) poll_sleep();
    return ncclSuccess;
}

extern "C" __attribute__((visibility("default"))) void wsync_fake_nccl_set_in_progress(int polls) {
    g_in_progress_polls.store(polls > 0 ? polls : 0);
}

extern "C" __attribute__((visibility("default"))) void wsync_fake_nccl_set_init_delay_ms(int ms) {
    g_init_delay_ms.store(ms > 0 ? ms : 0);
}

extern "C" __attribute__((visibility("default"))) long long wsync_fake_nccl_init_calls(void) {
    return g_init_calls.load();
}
