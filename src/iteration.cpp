// The receive iteration: views, the copy-into path, verification and the end of a chunk.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "copy/copy.hpp"
#include "core.hpp"
#include "delta/delta.hpp"
#include "error.hpp"
#include "tensor.hpp"

namespace wsync {

Iteration::Iteration(Receiver &owner, ChunkHeader header, TensorTable table,
                     std::unique_ptr<ChunkBacking> backing, bool verify, Subset subset)
    : owner_(&owner), header_(header), table_(std::move(table)), backing_(std::move(backing)),
      subset_(std::move(subset)), verify_(verify && (!table_.checksums.empty() || table_.sums_follow)),
      state_(table_.metas.size(), 0) {
    for (std::size_t i = 0; i < subset_.unverified.size(); ++i)
        if (subset_.unverified[i]) state_[i] |= kVerified;  // a range: no checksum covers it
}

Iteration::~Iteration() {
    if (!finished_) {
        if (failed_ == WSYNC_OK) {
            failed_ = WSYNC_ERR_WRONG_STATE;
            failure_ = "the receiver was destroyed with " + chunk_label(header_) + " open";
        }
        finish(failed_);
    }
}

void Iteration::info(wsync_recv_info_t *out) const {
    out->flags = header_.last ? WSYNC_CHUNK_LAST : 0;
    out->version = header_.version;
    out->chunk_index = header_.chunk_index;
    out->count = table_.metas.size();
    out->bytes = table_.total_bytes();
    if (header_.last) {
        out->version_chunks = header_.manifest.chunks;
        out->version_tensors = header_.manifest.tensors;
        out->version_bytes = header_.manifest.bytes;
    }
}
void Iteration::fill(std::size_t i, wsync_tensor_t *view, bool with_data) const {
    const TensorMeta &m = table_.metas[i];
    std::memset(view, 0, sizeof *view);
    view->name = m.name.c_str();
    view->shape = m.shape;
    view->strides = nullptr;
    view->ndim = m.ndim;
    view->dtype = m.dtype;
    view->device = backing_->device();
    if (with_data) {
        view->data = const_cast<void *>(backing_->data(i));
        view->flags = backing_->read_only() ? WSYNC_TENSOR_READ_ONLY : 0;
    } else if (table_.is_patch(i)) {
        view->flags = WSYNC_TENSOR_PATCH;  // peek: the loader takes it as a patch, not a view
    }
}

void Iteration::peek(std::size_t i, wsync_tensor_t *view) const {
    if (i >= table_.metas.size())
        failf(WSYNC_ERR_INVALID_ARGUMENT, "peek: index %zu is out of range (the chunk has %zu tensors)",
              i, table_.metas.size());
    fill(i, view, false);
}

void Iteration::part(std::size_t i, wsync_part_t *out) const {
    if (i >= table_.metas.size())
        failf(WSYNC_ERR_INVALID_ARGUMENT,
              "wsync_recv_part: index %zu is out of range (the chunk has %zu tensors)", i,
              table_.metas.size());
    out->offset = table_.is_part(i) ? table_.parts[i].offset : 0;
    out->bytes = table_.payload_bytes(i);
}

bool Iteration::next(wsync_tensor_t *view, wsync_part_t *part) {
    if (failed_ != WSYNC_OK) already_failed();
    check_revoked();
    // Tensors a wsync_recv_copy already took are not yielded again: each is loaded once.
    while (next_ < table_.metas.size() && (state_[next_] & kTaken)) ++next_;
    if (next_ >= table_.metas.size()) return false;
    std::size_t i = next_;
    if (table_.is_part(i) && !part)
        fail_chunk(WSYNC_ERR_UNSUPPORTED,
                   strf("%s in %s is a part of a split tensor (bytes %" PRIu64 " + %" PRIu64
                        " of %" PRIu64 "): a whole-tensor view would overrun it; take it with "
                        "wsync_recv_copy or wsync_recv_next_part",
                        tensor_label(i, table_.metas[i].name.c_str()).c_str(),
                        chunk_label(header_).c_str(), table_.parts[i].offset,
                        table_.parts[i].bytes, table_.metas[i].nbytes));
    if (mirrored(i)) {  // "delta_mirror": the view shows the receiver's own, verified copy
        const uint8_t *bytes = mirror(i);
        fill(i, view, false);
        view->data = const_cast<uint8_t *>(bytes);
        view->flags = WSYNC_TENSOR_READ_ONLY;
    } else {
        if (table_.is_patch(i))
            fail_chunk(WSYNC_ERR_UNSUPPORTED,
                       strf("%s in %s is a patch against version %" PRIu64 ": a view would show "
                            "the patch, not the tensor; take it with wsync_recv_copy into memory "
                            "that holds that version, or give this receiver the \"delta_mirror\" "
                            "option (or run the trainer with delta \"off\")",
                            tensor_label(i, table_.metas[i].name.c_str()).c_str(),
                            chunk_label(header_).c_str(), table_.patches[i].base_version));
        const uint8_t *bytes = landed(i);
        if (verify_ && !(state_[i] & kVerified)) check_sum(i, sum_in_place(i, bytes));
        fill(i, view, true);
    }
    if (part) this->part(i, part);
    if (!(state_[i] & kTaken)) state_[i] |= kTaken, ++taken_;
    ++next_;
    return true;
}

const uint8_t *Iteration::landed(std::size_t i) {
    try {
        backing_->await(i);
    } catch (const Error &e) {
        fail_chunk(e.status(), e.what());
    }
    return static_cast<const uint8_t *>(backing_->data(i));
}

uint64_t Iteration::sum_in_place(std::size_t i, const uint8_t *bytes) {
    uint64_t sum = 0;  // a landed entry's, taken as it landed (wsync_receiver_land)
    return backing_->landed_sum(i, &sum) ? sum : sum_of(bytes, table_.payload_bytes(i));
}

uint64_t Iteration::sum_of(const void *p, uint64_t n) {
    return table_.tree_sums ? owner_->pool_->tree_hash(p, n) : copy::hash_bytes(p, n);
}

uint64_t Iteration::copy_summing(void *dst, const void *src, uint64_t total, uint64_t off, uint64_t len) {
    return table_.tree_sums ? owner_->pool_->copy_tree_hashing(dst, src, total, off, len)
                            : copy::copy_hashing(dst, src, total, off, len);
}

// Entry i's checksum: the request's, or one that followed the bytes (TensorTable::sums_follow),
// from the backing, which waits for it; a selection's view maps its entries to the request's.
uint64_t Iteration::expected_sum(std::size_t i) {
    if (!table_.sums_follow) return table_.checksums[i];
    if (table_.checksums.empty()) table_.checksums.assign(table_.metas.size(), 0);
    const uint64_t from = table_.follow_from.empty() ? i : table_.follow_from[i];
    try {
        table_.checksums[i] = backing_->trailing_sum(static_cast<std::size_t>(from));
    } catch (const Error &e) {
        fail_chunk(e.status(), e.what());
    }
    return table_.checksums[i];
}

void Iteration::check_sum(std::size_t i, uint64_t got) {
    if (got != expected_sum(i)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%016llx, computed %016llx",
                      static_cast<unsigned long long>(table_.checksums[i]),
                      static_cast<unsigned long long>(got));
        fail_chunk(WSYNC_ERR_INTEGRITY, "tensor '" + table_.metas[i].name + "' in " +
                                            chunk_label(header_) +
                                            ": checksum mismatch (request says " + buf + ")");
    }
    state_[i] |= kVerified;
}

void Iteration::copy(std::size_t i, uint64_t offset, void *dst, uint64_t len) {
    // Bad arguments are refused before anything is read: the iteration stays as it was.
    if (i >= table_.metas.size())
        failf(WSYNC_ERR_INVALID_ARGUMENT, "wsync_recv_copy: index %zu is out of range (%s has %zu tensors)",
              i, chunk_label(header_).c_str(), table_.metas.size());
    const TensorMeta &m = table_.metas[i];
    if (offset > m.nbytes || len > m.nbytes - offset)
        failf(WSYNC_ERR_INVALID_ARGUMENT,
              "wsync_recv_copy: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64 ") are outside %s, "
              "which has %" PRIu64 " bytes",
              offset, offset, len, tensor_label(i, m.name.c_str()).c_str(), m.nbytes);
    if (failed_ != WSYNC_OK) already_failed();
    check_revoked();
    const wsync_device_t dev = backing_->device();
    const uint8_t *src = static_cast<const uint8_t *>(backing_->data(i));
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    auto label = [&] { return tensor_label(i, m.name.c_str()); };  // for messages only
    if (backing_->in_place(i) && !table_.is_patch(i)) {
        // Landed (wsync_receiver_land): a copy onto the very bytes it names moves nothing; the
        // entry is verified with the checksum taken as its bytes landed.
        uint64_t off = offset, n = len;
        void *to = dst;
        if (share_of_entry(i, &off, &to, &n) && to == src + off) {
            landed(i);
            if (verify_ && !(state_[i] & kVerified)) check_sum(i, sum_in_place(i, src));
            if (!(state_[i] & kTaken)) state_[i] |= kTaken, ++taken_;
            return;
        }
    }
    if (len != 0 && d < s + table_.wire_bytes(i) && s < d + len)
        wsync::fail(WSYNC_ERR_INVALID_ARGUMENT,
                    "wsync_recv_copy: the destination overlaps " + label() + "'s received bytes");
    if (backing_->maps_read_only(dst, len))
        wsync::fail(WSYNC_ERR_INVALID_ARGUMENT,
                    "wsync_recv_copy: the destination of " + label() +
                        " lies in the sender's shared memory, which this receiver maps read-only "
                        "(a view of another received tensor?): copy into memory of your own");
    if (mirrored(i)) {  // "delta_mirror": any range, out of the receiver's own verified copy
        if (len == 0) return;
        auto slot = owner_->mirrors_.find(m.name);
        if (slot != owner_->mirrors_.end() && slot->second.nbytes == m.nbytes) {
            const auto mb = reinterpret_cast<uintptr_t>(slot->second.bytes.get());
            if (d < mb + m.nbytes && mb < d + len)
                wsync::fail(WSYNC_ERR_INVALID_ARGUMENT,
                            "wsync_recv_copy: the destination overlaps this receiver's mirror of " +
                                label() + " (delta_mirror)");
        }
        const bool to_device = backing_->device_destination(dst);  // ucx with "device"
        const uint8_t *bytes = mirror(i);
        if (to_device)  // from the verified mirror (pageable: the driver stages it at once)
            backing_->copy_to_device(dst, bytes + offset, len,
                                     [&] { return label() + " in " + chunk_label(header_); });
        else
            owner_->pool_->copy(dst, bytes + offset, len);
        if (!(state_[i] & kTaken)) state_[i] |= kTaken, ++taken_;
        return;
    }
    // Device memory (the GPU kinds): the transport queues a device copy on the loader's stream
    // (cuda_ipc) or has none; no GPU kind carries checksums or patches.
    const bool device = !device_is_host(dev);
    if (table_.is_patch(i)) {
        // Never hand out patch bytes as if they were the tensor: a patch in device memory is
        // applied there, one made on the GPU (tree-hashed) only there.
        if (device != table_.patches[i].tree)
            wsync::fail(WSYNC_ERR_UNSUPPORTED,
                        "wsync_recv_copy: " + label() + " is a patch in " + device_name(dev) +
                            " memory with " + (table_.patches[i].tree ? "tree" : "XXH3") +
                            " checksums, which this receiver cannot apply");
        // A host patch is applied by the CPU onto dst: never onto device memory (ucx with
        // "device"), which the CPU cannot read.
        if (!device && backing_->device_destination(dst))
            wsync::fail(WSYNC_ERR_UNSUPPORTED,
                        "wsync_recv_copy: " + label() + " is a patch (delta sync) and the destination is "
                        "device memory, onto which this receiver cannot apply it: give the receiver "
                        "\"delta_mirror\" (it applies patches to its own host copy and copies the "
                        "result into device memory) or take the patch with wsync_recv_patch");
        return apply_patch(i, offset, dst, len);
    }
    if (!share_of_entry(i, &offset, &dst, &len)) return;
    landed(i);  // src's bytes are in place from here
    if (device) {
        if (!backing_->copy_to_device(dst, src + offset, len,
                                      [&] { return label() + " in " + chunk_label(header_); }))
            wsync::fail(WSYNC_ERR_UNSUPPORTED,
                        "wsync_recv_copy: " + label() + " is in " + device_name(dev) +
                            " memory and strategy '" + owner_->kind_.name +
                            "' has no device copy; copy out of its wsync_recv_next view with the "
                            "device's own copy (e.g. cudaMemcpyAsync)");
    } else if (backing_->device_destination(dst)) {
        // A host chunk into GPU memory (ucx with "device"): verified here, then one
        // asynchronous copy from the chunk's pinned buffer on the loader's stream, which the
        // backing waits for before the chunk is acknowledged.
        if (verify_ && !(state_[i] & kVerified)) check_sum(i, sum_of(src, table_.payload_bytes(i)));
        backing_->copy_to_device(dst, src + offset, len, [&] { return label() + " in " + chunk_label(header_); });
    } else if (verify_ && !(state_[i] & kVerified)) {  // fails the iteration on a mismatch
        check_sum(i, copy_summing(dst, src, table_.payload_bytes(i), offset, len));
    } else {
        owner_->pool_->copy(dst, src + offset, len);
    }
    if (!(state_[i] & kTaken)) state_[i] |= kTaken, ++taken_;
}

bool Iteration::share_of_entry(std::size_t i, uint64_t *offset, void **dst, uint64_t *len) const {
    if (table_.is_part(i)) {
        // dst holds byte `offset` of the whole tensor at dst[0]: the part's share of
        // [offset, offset + len) goes at its place there, in the part's own coordinates.
        const PartInfo &p = table_.parts[i];
        const uint64_t lo = std::max(*offset, p.offset), hi = std::min(*offset + *len, p.offset + p.bytes);
        if (lo >= hi) return false;
        *dst = static_cast<uint8_t *>(*dst) + (lo - *offset);
        *offset = lo - p.offset;
        *len = hi - lo;
    }
    return *len != 0;
}

void Iteration::fail_chunk(wsync_status_t status, std::string message) {
    // A chunk whose bytes the sender may have reused (it dropped this receiver) fails for that
    // reason, whatever else went wrong: a checksum mismatch is then its symptom.
    std::string revoked = revoked_reason();
    if (!revoked.empty()) {
        status = WSYNC_ERR_PEER;
        message = revoked + " (then: " + message + ")";
    }
    failed_ = status;
    failure_ = std::move(message);
    wsync::fail(failed_, failure_);
}

void Iteration::already_failed() const {
    // The earlier failure's text alone would describe this call's arguments (a destination
    // that was not the culprit): say it is the iteration's standing verdict.
    // The chunk is named once: most failures' texts name it already.
    const std::string label = chunk_label(header_);
    bool named = false;  // as a whole label: "chunk 1 of version 1" is not in "... version 10"
    for (std::size_t at = failure_.find(label); at != std::string::npos && !named;
         at = failure_.find(label, at + 1)) {
        const std::size_t end = at + label.size();
        named = end == failure_.size() || !std::isdigit(static_cast<unsigned char>(failure_[end]));
    }
    wsync::fail(failed_, "this iteration already failed" + (named ? "" : " (" + label + ")") +
                             ": " + failure_);
}

std::string Iteration::revoked_reason() const {
    const std::string why = backing_->revoked();
    if (why.empty()) return why;
    return why + " while it read " + chunk_label(header_) +
           ": the sender may have reused the chunk's memory, so the chunk is not loaded and "
           "version " + std::to_string(header_.version) +
           " is not completed here; destroy this receiver and create a new one with the same "
           "index to re-attach";
}

void Iteration::check_revoked() {
    std::string why = revoked_reason();
    if (why.empty()) return;
    failed_ = WSYNC_ERR_PEER;
    failure_ = std::move(why);
    wsync::fail(failed_, failure_);
}

wsync_status_t Iteration::finish(wsync_status_t outcome) noexcept {
    if (finished_) return failed_;
    finished_ = true;
    // Patches queued on the GPU are waited for first, also after a failure (their kernels read
    // the chunk's memory); a patch that did not apply fails a chunk that was going well.
    settle_device_patches();
    if (outcome == WSYNC_OK) outcome = failed_;
    // The transport's own completion decides the final outcome before anyone is told: the
    // engine's caller and the sender's failure record then carry the same status and message.
    std::string why;
    wsync_status_t final = backing_->settle(outcome, &why);
    if (final != outcome && failed_ == WSYNC_OK) {
        failed_ = final;
        try {
            failure_ = why.empty() ? "the transport failed " + chunk_label(header_) : why;
        } catch (...) {
        }
    }
    // Once the transport's own reads are complete too (cuda_ipc: the loader's copies), a chunk
    // that went well fails if the sender dropped this receiver meanwhile.
    if (final == WSYNC_OK) {
        try {
            std::string revoked = revoked_reason();
            if (!revoked.empty()) final = failed_ = WSYNC_ERR_PEER, failure_ = std::move(revoked);
        } catch (...) {
        }
    }
    try {
        owner_->before_ack(header_, final, failure_);
    } catch (...) {
    }
    // The apply time travels with an OK acknowledgement only (a failed chunk's version is not
    // one "auto" learns from), and before it, so the sender that sees the one finds the other.
    if (final == WSYNC_OK && apply_ns_ > 0) backing_->report_apply(apply_ns_);
    backing_->acknowledge(final);
    owner_->finished(header_, tallied(), final);
    return final;
}

void Iteration::fail(wsync_status_t status, std::string message) {
    if (failed_ == WSYNC_OK) {
        failed_ = status;
        failure_ = std::move(message);
    }
    finish(failed_);
}

void Iteration::end() {
    settle_device_patches();  // a patch that did not apply is the chunk's failure
    if (failed_ == WSYNC_OK) {  // after every read the loader made of the chunk's memory
        std::string why = revoked_reason();
        if (!why.empty()) failed_ = WSYNC_ERR_PEER, failure_ = std::move(why);
    }
    if (failed_ != WSYNC_OK) {
        finish(failed_);
        wsync::fail(failed_, failure_);
    }
    if (taken_ < table_.metas.size()) {
        failed_ = WSYNC_ERR_WRONG_STATE;
        failure_ = strf("iteration over %s ended after %zu of %zu tensors were taken (yielded "
                        "or copied); the chunk is acknowledged as failed",
                        chunk_label(header_).c_str(), taken_, table_.metas.size());
        finish(failed_);
        wsync::fail(failed_, failure_);
    }
    if (header_.last) {
        // The committing chunk: this receiver's tally of the version must equal the manifest.
        Manifest with_me = owner_->state_.tally();
        tally(with_me, tallied());
        std::string why;
        if (!(with_me == header_.manifest))
            why = strf("version %" PRIu64 " is incomplete or differs: its manifest lists %s, "
                       "this receiver received %s",
                       header_.version, manifest_text(header_.manifest).c_str(),
                       manifest_text(with_me).c_str());
        if (!why.empty()) {
            failed_ = WSYNC_ERR_MISMATCH;
            failure_ = why;
            finish(failed_);
            wsync::fail(failed_, failure_);
        }
    }
    if (finish(WSYNC_OK) != WSYNC_OK) wsync::fail(failed_, failure_);
}

}  // namespace wsync
