// Checksums that follow the bytes (docs/data-path.md; src/transport/ucx/trail.hpp is the
// trainer's half): the engine's half. A chunk whose request says "sums_follow" brings its
// entries' tree hashes in the answers to fetches of kFetchSums, each MACed with the connection
// key (auth.hpp, sums_mac); they are kept per chunk (sums_, known_, under pull_mu_) and the
// core's iteration waits for each as it verifies the entry (UcxBacking::trailing_sum).
#include "transport/ucx/receiver_state.hpp"

namespace wsync::ucx {

void UcxReceiver::expect_sums(uint64_t seq, std::size_t entries) {
    sum_bytes_.assign(entries * 8, 0);
    std::lock_guard<std::mutex> lk(pull_mu_);
    sums_.assign(entries, 0);
    known_.assign(entries, 0);
    sums_seq_ = seq;
}

bool UcxReceiver::take_sums(uint64_t seq, uint64_t number, const Nonce &mac, const Span &range) {
    const uint8_t *p = sum_bytes_.data() + range.local;
    const Nonce want = sums_mac(key_, seq, number, p, range.bytes);
    volatile uint8_t differ = 0;  // in constant time, as same_mac
    for (std::size_t i = 0; i < want.size(); ++i) differ = static_cast<uint8_t>(differ | (want[i] ^ mac[i]));
    if (differ) return false;
    std::lock_guard<std::mutex> lk(pull_mu_);
    for (uint64_t k = 0; k < range.bytes / 8; ++k) {
        uint64_t v = 0;
        for (int b = 0; b < 8; ++b) v |= uint64_t(p[k * 8 + b]) << (8 * b);
        sums_[range.remote + k] = v;
        known_[range.remote + k] = 1;
    }
    pull_cv_.notify_all();
    return true;
}

uint64_t UcxReceiver::trailing_sum(uint64_t seq, std::size_t entry) {
    std::unique_lock<std::mutex> lk(pull_mu_);
    auto here = [&] { return sums_seq_ == seq && entry < known_.size() && known_[entry]; };
    if (!here() && pull_.active && pull_.seq == seq && sums_seq_ == seq && entry < known_.size()) {
        if (!pull_cv_.wait_until(lk, pull_.end + std::chrono::seconds(2), [&] { return here() || !pull_.running; })) {
            cancel_ = true;
            w_->signal();
        }
        if (!here()) {
            lk.unlock();
            auto [status, why] = finish_pull();
            fail(status != WSYNC_OK ? status : WSYNC_ERR_SYSTEM,
                 why.empty() ? who() + ": the checksum of entry " + std::to_string(entry) + " of chunk seq " +
                                   std::to_string(seq) + " never arrived"
                             : why);
        }
    }
    if (!here())
        fail(WSYNC_ERR_INTERNAL, who() + ": no checksum followed entry " + std::to_string(entry) + " of chunk seq " +
                                     std::to_string(seq));
    return sums_[entry];
}

}  // namespace wsync::ucx
