// The ucx sender's state, shared by its two halves: the caller's (sender.cpp: staging chunks,
// flush, abandon, drop) and the progress thread's (serve.cpp: who is attached, leases, fetches,
// acknowledgements, deaths), and what both call under the mutex about versions
// (sender_versions.cpp: committing, retiring, who owes). Internal to the ucx kind;
// make_sender() (sender.hpp) makes one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "copy/copy.hpp"
#include "failures.hpp"
#include "transport/ucx/auth.hpp"
#include "transport/ucx/gpu_stage.hpp"
#include "transport/ucx/sender.hpp"
#include "transport/ucx/trail.hpp"

namespace wsync::ucx {

// Staging memory, reused across chunks: anonymous pages, or for chunks with device tensors
// pinned host memory the GPU writes (gpu_stage.hpp). Never registered for peers: the trainer
// sends what an engine fetches (fetch()).
struct Buffer {
    void *base = nullptr;
    std::size_t cap = 0;
    std::shared_ptr<gpu::DeviceBuffer> pinned;  // set: base is pinned->host()
    // base lies in the sender's arena: the caller's tensors, sent in place (in_arena()); never
    // pooled, written or unmapped here, and only leased to receivers that owe its version.
    bool borrowed = false;
};

struct Chunk {
    uint64_t version = 0;
    uint32_t index = 0;
    uint64_t bytes = 0;    // its size: fetches past it are refused
    bool last = false;     // the version's last chunk: acknowledging it OK completes the version
    Buffer buf;
    uint32_t sending = 0;  // Data sends from its buffer still in flight
    uint32_t leases = 0;   // receivers granted a read and not done with it
    bool retired = false;  // no new leases, fetches refused: its version is no longer kept, or was abandoned
    uint64_t applied = 0;  // the largest apply time (ns) an engine reported with its OK Ack
    // Its checksums follow its bytes (trail.hpp): hashed as the streams send it.
    std::shared_ptr<Trail> trail;
};

struct Member {
    uint64_t token = 0;
    std::string name;  // "receiver 1 (pid 40)"
    int32_t pid = 0;
    std::unique_ptr<Endpoint> ep;
    Key key{};          // the connection's (auth.hpp)
    uint64_t sent = 0;   // the number of the last message sent to it
    uint64_t heard = 0;  // the number of the last authentic message from it
    uint64_t from_version = 0;   // the first version it owes
    uint64_t acked_through = 0;  // highest chunk seq it answered
    std::map<uint64_t, uint32_t> leases;  // seq -> count (at most kLeasesPerChunk)
    uint64_t failed_version = 0;  // the version whose failure it last reported
    std::deque<Msg> fetches;      // its fetches waiting their turn (at most kFetchesQueued)
    uint32_t in_flight = 0;       // its payloads being sent (at most kFetchesInFlight)
    bool dropped = false;
    // Its connection failed (it died, or the network to it did) and nobody has taken its
    // index since: it stays a receiver the trainer publishes for, named DIED in the flush of
    // every version it did not complete, until it is dropped or a hello replaces it.
    bool dead = false;
    std::string dead_why;
    uint64_t dead_reported = 0;  // the newest version its death was named for (or it completed)
};

class UcxSender final : public SenderImpl {
public:
    UcxSender(std::unique_ptr<Worker> w, const InitInfo &info, int64_t timeout_ms, uint64_t block_bytes,
              unsigned copy_threads, uint64_t arena_bytes);
    ~UcxSender() override;

    json send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) override;
    void flush(int64_t timeout_ms) override;
    void abandon(uint64_t version) override;
    uint64_t applied_ns(uint64_t version) override;
    bool begin_version(uint64_t version) override;
    void set_stream(void *stream) override;
    void drop_receiver(uint32_t index) override;
    std::pair<void *, uint64_t> arena() const override { return {arena_, arena_bytes_}; }

private:
    // ---- staging (sender.cpp) ---------------------------------------------------------------
    std::vector<std::size_t> device_tensors(const wsync_tensor_t *tensors, const TensorTable &table);
    void free_retired();
    void stage_host(uint8_t *base, const wsync_tensor_t *tensors, TensorTable &table,
                    const std::vector<std::size_t> &on_gpu, bool checksum);
    const uint8_t *in_arena(const wsync_tensor_t *tensors, const TensorTable &table, uint64_t end) const;
    Buffer take_buffer(uint64_t bytes, bool pinned);
    void put_buffer(Buffer &b);
    void free_buffer(Buffer &b) noexcept;
    [[noreturn]] void report_timeout(const std::vector<uint32_t> &owing, int64_t budget);

    // ---- the progress thread (serve.cpp) ----------------------------------------------------
    void serve();
    std::unique_lock<std::mutex> caller_lock();
    void tell(uint32_t index, Member &mem, Msg m);
    bool admit(const Msg &m);
    void handle(std::vector<Msg> inbox);
    void hello(const Msg &m);
    void lease(uint32_t index, Member &mem, uint64_t seq);
    void fetch(uint32_t index, Member &mem, const Msg &m);
    void answer_fetch(uint32_t index, Member &mem, const Msg &m);
    void answer_sums(uint32_t index, Member &mem, const Msg &m, Chunk &c, Msg &reply);
    bool sums_ready(const Msg &m) const;
    void dispatch();
    void sent(const std::vector<uint64_t> &ids);
    void ack(uint32_t index, Member &mem, const Msg &m);
    void check_members();
    void leave(uint32_t index, uint32_t what, const std::string &why);
    void forget(uint32_t index);
    void name_dead(uint32_t index, Member &m);
    bool abandoned_here(uint64_t version) const;

    // ---- versions (sender_versions.cpp), under the mutex --------------------------------------
    std::string gone_text(uint64_t seq) const;
    void commit(uint64_t version);
    void retire(Chunk &c, uint64_t seq);
    void retire_borrowed();
    void release();
    uint64_t last_version() const;
    bool owes(const Member &m) const;
    std::vector<uint32_t> owing_members() const;

    std::string stream_address_;  // the data stream's offer, as an OK welcome's text (empty: none)
    std::unique_ptr<Worker> w_;
    InitInfo info_;
    int64_t timeout_ms_;
    uint64_t block_bytes_;  // 0: no block checksums
    copy::Pool copiers_;    // "copy_threads": pack and hash large tensors (the caller's thread only)
    std::unique_ptr<GpuStage> gpu_;  // made by the first chunk with device tensors
    std::vector<std::shared_ptr<gpu::DeviceBuffer>> retired_;  // pinned, to free (free_retired)
    void *order_stream_ = nullptr;   // set_stream(), for the stage
    std::mutex mu_;
    std::atomic<int> callers_{0};
    std::condition_variable cv_;
    std::thread thread_;
    int stop_fd_ = -1;
    std::vector<Member> members_;
    // Versions this sender abandoned (the newest kAbandonedKept): receivers' failures of them
    // are not reported (ack()).
    static constexpr std::size_t kAbandonedKept = 256;
    std::vector<uint64_t> abandoned_;
    std::vector<std::unique_ptr<Endpoint>> refused_;  // at most kRefusedKept, oldest closed first
    static constexpr std::size_t kRefusedKept = 8;
    // This round's admitted messages (admit()): hellos, and each receiver index's.
    uint32_t hellos_this_round_ = 0;
    std::vector<uint32_t> heard_this_round_;
    std::set<Nonce> seen_hellos_;  // the nonces of authentic hellos: a replayed one is dropped
    std::map<uint64_t, Chunk> chunks_;
    // The engines' apply time per version (ack(): per chunk the largest report, summed over the
    // version's chunks), the newest kAppliedKept versions, oldest first.
    static constexpr std::size_t kAppliedKept = 8;
    std::vector<std::pair<uint64_t, uint64_t>> applied_;
    std::vector<Buffer> pool_;
    // "arena_bytes" of anonymous pages, pre-faulted; unmapped by the destructor's end (or when
    // the constructor throws after mapping it).
    struct Mapping {
        void *p = nullptr;
        std::size_t n = 0;
        void reset(void *to = nullptr, std::size_t bytes = 0) noexcept;
        ~Mapping() { reset(); }
    };
    Mapping arena_map_;
    // In-place chunks retired by an OK flush, seq -> version (the newest kFlushedInPlaceKept),
    // so a refusal says why (gone_text()).
    static constexpr std::size_t kFlushedInPlaceKept = 1024;
    std::map<uint64_t, uint64_t> flushed_in_place_;
    void *arena_ = nullptr;
    uint64_t arena_bytes_ = 0;
    std::vector<uint64_t> committed_;
    FailureGather failures_;  // gathered, reported whole by flush (the core's policy)
    uint64_t next_seq_ = 1, last_seq_ = 0, last_committed_ = 0, open_version_ = 0;
    uint64_t began_ = 0;  // the newest version begin_version() was called for
    uint64_t retired_through_ = 0;  // versions up to this one are no longer kept (by age)
    // Payloads being sent, by send id (the worker's tag): whose, and from which chunk.
    struct Flight {
        uint64_t seq = 0;
        uint32_t index = 0;
        uint64_t token = 0;
        std::vector<uint8_t> sums;  // a kFetchSums answer's payload, kept until it is sent
    };
    std::map<uint64_t, Flight> flights_;
    uint64_t flight_ids_ = 0;
    uint32_t turn_ = 0;  // the member dispatch() serves first
    // Fair service (issue 37): one receiver has at most kFetchesInFlight payloads being sent and
    // kFetchesQueued fetches waiting; waiting fetches are served round-robin across receivers.
    static constexpr uint32_t kFetchesInFlight = 4;
    static constexpr std::size_t kFetchesQueued = 64;
    // The most leases one receiver may hold on one chunk at a time.
    static constexpr uint32_t kLeasesPerChunk = 4;
};

}  // namespace wsync::ucx
