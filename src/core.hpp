// The core objects behind the ABI handles. They hold the logic every strategy shares; abi.cpp
// only translates C calls into these.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strategy.hpp"

namespace wsync {

class Strategy {
public:
    Strategy(const KindInfo &kind, const char *options_json);
    const KindInfo &kind() const { return kind_; }
    std::vector<uint8_t> create_init_info();
    std::unique_ptr<class Sender> create_sender(const uint8_t *init, std::size_t len);
    std::unique_ptr<class Receiver> create_receiver(const uint8_t *init, std::size_t len,
                                                    uint32_t index);

private:
    const KindInfo &kind_;
    Options options_;
    std::unique_ptr<StrategyImpl> impl_;
    bool init_made_ = false;
};

class Sender {
public:
    Sender(const KindInfo &kind, std::unique_ptr<SenderImpl> impl)
        : kind_(kind), impl_(std::move(impl)) {}
    std::vector<uint8_t> send_chunk(const wsync_chunk_t &chunk);
    void flush(int64_t timeout_ms);
    uint64_t version() const { return version_; }

private:
    const KindInfo &kind_;
    std::unique_ptr<SenderImpl> impl_;
    uint64_t version_ = 1;
    uint32_t next_index_ = 0;
};

class Iteration;

class Receiver {
public:
    Receiver(const KindInfo &kind, std::unique_ptr<ReceiverImpl> impl)
        : kind_(kind), impl_(std::move(impl)) {}
    ~Receiver();
    // The iteration is owned by the receiver until end() (or the receiver's destruction).
    Iteration *receive(const uint8_t *request, std::size_t len);
    // Ends and frees the open iteration; throws its failure after freeing it.
    void end(Iteration *it);
    uint64_t completed_version() const { return completed_; }

private:
    friend class Iteration;
    void finished(wsync_status_t outcome);

    const KindInfo &kind_;
    std::unique_ptr<ReceiverImpl> impl_;
    std::unique_ptr<Iteration> open_;
    bool have_prev_ = false;
    ChunkHeader prev_;
    bool version_failed_ = false;
    uint64_t completed_ = 0;
};

class Iteration {
public:
    Iteration(Receiver &owner, ChunkHeader header, TensorTable table,
              std::unique_ptr<ChunkBacking> backing, bool verify);
    ~Iteration();
    Receiver *owner() const { return owner_; }
    wsync_recv_info_t info() const;
    void peek(std::size_t i, wsync_tensor_t *view) const;
    bool next(wsync_tensor_t *view);
    // Acknowledges; throws the iteration's failure, if any. Called once, by Receiver::end.
    void end();

private:
    void fill(std::size_t i, wsync_tensor_t *view, bool with_data) const;
    void finish(wsync_status_t outcome) noexcept;

    Receiver *owner_;
    ChunkHeader header_;
    TensorTable table_;
    std::unique_ptr<ChunkBacking> backing_;
    bool verify_;
    std::size_t next_ = 0;
    wsync_status_t failed_ = WSYNC_OK;
    std::string failure_;
    bool finished_ = false;
};

// wsync_request_merge.
std::vector<uint8_t> merge_requests(const std::vector<std::pair<const uint8_t *, std::size_t>> &parts);

// wsync_blob_describe: the envelope and body as JSON text.
std::string describe_blob(const uint8_t *data, std::size_t size);

}  // namespace wsync
