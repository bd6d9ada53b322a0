// A chunk as a ucx receiver hands it to the core (ChunkBacking): where each entry's bytes are
// (the receive buffer, or the engine's destination where it landed), waiting for a chunk still
// being pulled, its checksums as they landed or as they followed the bytes, and its answer to
// the trainer. Internal to the ucx kind; its receiver (receiver_state.hpp) does the work.
#pragma once

#include <cstdint>
#include <vector>

#include "strategy.hpp"

namespace wsync::ucx {

class UcxReceiver;

class UcxBacking final : public ChunkBacking {
public:
    UcxBacking(UcxReceiver &owner, const uint8_t *base, std::vector<uint64_t> offsets, uint64_t seq)
        : owner_(owner), base_(base), offsets_(std::move(offsets)), seq_(seq) {}
    // A pulled chunk whose iteration never opened (the core failed to make it) is given up:
    // the pull stopped and the trainer answered.
    ~UcxBacking() override;
    const void *data(std::size_t i) const override { return in_place(i) ? landed_[i] : base_ + offsets_[i]; }
    // Per entry, where it lands in the engine's memory (null: our buffer; Lander::where).
    void land(std::vector<const uint8_t *> at) { landed_ = std::move(at); }
    bool in_place(std::size_t i) const override { return !landed_.empty() && landed_[i]; }
    bool landed_sum(std::size_t i, uint64_t *sum) override;
    uint64_t trailing_sum(std::size_t i) override;
    // A chunk pulled in pieces (UcxReceiver::start_pull): entry i's bytes are [offsets_[i],
    // ends[i]) of the chunk, each waited for before it is read.
    void stream(std::vector<uint64_t> ends) { ends_ = std::move(ends); }
    void await(std::size_t i) override;
    wsync_device_t device() const override { return {WSYNC_DEVICE_CPU, 0}; }
    bool read_only() const override { return false; }
    bool device_destination(const void *dst) const override;
    bool copy_to_device(void *dst, const void *src, uint64_t len,
                        const std::function<std::string()> &what) override;
    wsync_status_t settle(wsync_status_t outcome, std::string *message) noexcept override;
    void report_apply(uint64_t ns) noexcept override { applied_ = ns; }
    void acknowledge(wsync_status_t outcome) noexcept override;
    void set_header(const ChunkHeader &h) { header_ = h; }

private:
    UcxReceiver &owner_;
    const uint8_t *base_;
    std::vector<uint64_t> offsets_;
    std::vector<uint64_t> ends_;  // stream()'s; empty: every byte was in place at open
    std::vector<const uint8_t *> landed_;  // land()'s; empty: nothing landed
    uint64_t seq_;
    ChunkHeader header_;
    uint64_t applied_ = 0;  // report_apply's, said with the OK Ack
    bool acknowledged_ = false;
};

}  // namespace wsync::ucx
