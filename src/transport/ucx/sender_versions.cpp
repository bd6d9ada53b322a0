// The ucx sender's versions: committing them, retiring chunks no longer kept (by age, by
// abandon, or in place from the arena once flushed) and freeing their buffers, why a retired
// chunk is refused, and which receivers still owe what was published (flush). Called under the
// sender's mutex from both halves (sender.cpp, serve.cpp).
#include "transport/ucx/sender_state.hpp"

#include <algorithm>

namespace wsync::ucx {

// Why chunk seq is refused once retired (or gone from chunks_).
std::string UcxSender::gone_text(uint64_t seq) const {
    const auto f = flushed_in_place_.find(seq);
    if (f != flushed_in_place_.end())
        return "chunk seq " + std::to_string(seq) + " of version " + std::to_string(f->second) +
               " was sent in place from the trainer's arena and its flush has returned: the trainer "
               "may have written that memory since (the latest committed version is " +
               std::to_string(last_committed_) + ")";
    return "chunk seq " + std::to_string(seq) + " is no longer kept (abandoned, or older than the last " +
           std::to_string(info_.keep_versions) + " committed versions; the latest is " +
           std::to_string(last_committed_) + ")";
}

// ---- versions ---------------------------------------------------------------------------
void UcxSender::commit(uint64_t version) {
    last_committed_ = version;
    committed_.push_back(version);
    while (committed_.size() > info_.keep_versions) {
        const uint64_t old = committed_.front();
        committed_.erase(committed_.begin());
        retired_through_ = std::max(retired_through_, old);
        for (auto &kv : chunks_)
            if (kv.second.version <= old) retire(kv.second, kv.first);
    }
    release();
}

// No new leases on the chunk, and the leases on it end: its fetches are refused from now on
// (ABANDONED), so a peer that leases chunks and never acknowledges them holds no memory past
// keep_versions (issue 37: 566 MB against 106 MB after 16 versions). Data sends already in
// flight keep the buffer until they end.
void UcxSender::retire(Chunk &c, uint64_t seq) {
    c.retired = true;
    for (Member &m : members_) m.leases.erase(seq);
    c.leases = 0;
}

// Every chunk sent in place from the arena: retired, so nothing leases or fetches it again
// (a send already under way still reads its range until it ends).
void UcxSender::retire_borrowed() {
    bool any = false;
    for (auto &kv : chunks_)
        if (kv.second.buf.borrowed && !kv.second.retired) {
            retire(kv.second, kv.first);
            flushed_in_place_[kv.first] = kv.second.version;
            if (flushed_in_place_.size() > kFlushedInPlaceKept) flushed_in_place_.erase(flushed_in_place_.begin());
            any = true;
        }
    if (any) release();
}

// Retired chunks go back to the pool once no send reads them.
void UcxSender::release() {
    for (auto it = chunks_.begin(); it != chunks_.end();) {
        if (it->second.retired && it->second.leases == 0 && it->second.sending == 0) {
            put_buffer(it->second.buf);
            it = chunks_.erase(it);
        } else {
            ++it;
        }
    }
}

// ---- flush ------------------------------------------------------------------------------
uint64_t UcxSender::last_version() const {
    auto it = chunks_.find(last_seq_);
    return it == chunks_.end() ? 0 : it->second.version;
}
bool UcxSender::owes(const Member &m) const {
    return m.ep && !m.dropped && last_seq_ && m.acked_through < last_seq_ &&
           last_version() >= m.from_version;
}
std::vector<uint32_t> UcxSender::owing_members() const {
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < members_.size(); ++i)
        if (owes(members_[i])) out.push_back(i);
    return out;
}

}  // namespace wsync::ucx
