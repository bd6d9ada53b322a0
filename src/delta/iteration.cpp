// The receive iteration's delta half: patches applied onto a base (the engine's destination,
// its mirror, or device memory), their verification and failures, and wsync_recv_patch. The
// views, copies and end of a chunk are iteration.cpp.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "copy/copy.hpp"
#include "core.hpp"
#include "delta/delta.hpp"
#include "error.hpp"
#include "tensor.hpp"

namespace wsync {

void Iteration::apply_patch(std::size_t i, uint64_t offset, void *dst, uint64_t len) {
    const TensorMeta &m = table_.metas[i];
    const PatchInfo &p = table_.patches[i];
    const std::string label = tensor_label(i, m.name.c_str());
    // Argument errors leave the iteration as it was.
    if (offset != 0 || len != m.nbytes)
        failf(WSYNC_ERR_INVALID_ARGUMENT,
              "wsync_recv_copy: %s is a patch: copy it whole (offset 0, %" PRIu64
              " bytes) into memory that holds version %" PRIu64,
              label.c_str(), m.nbytes, p.base_version);
    if (state_[i] & kTaken)
        wsync::fail(WSYNC_ERR_INVALID_ARGUMENT,
                    "wsync_recv_copy: " + label + " is a patch and was taken already (applied, "
                    "or handed out by wsync_recv_patch)");
    apply_onto(i, dst, "the destination");
    state_[i] |= kTaken;
    ++taken_;
}

void Iteration::apply_onto(std::size_t i, void *dst, const char *where) {
    const TensorMeta &m = table_.metas[i];
    const PatchInfo &p = table_.patches[i];
    const std::string what = tensor_label(i, m.name.c_str()) + " in " + chunk_label(header_);
    const uint64_t have = owner_->state_.completed();
    if (have != p.base_version)
        fail_chunk(WSYNC_ERR_MISMATCH,
                   strf("%s is a patch against version %" PRIu64 ", but this receiver's "
                        "completed version is %" PRIu64 " (it missed or failed a version, or "
                        "attached since); the trainer sends a dense version once it hears of this "
                        "failure, or as the first version an attached receiver owes",
                        what.c_str(), p.base_version, have));
    if (p.tree) return apply_on_device(i, dst, what);
    // Timed for the sender's "auto" (a failure fails the chunk, whose time is not reported).
    const auto started = std::chrono::steady_clock::now();
    const auto *bytes = landed(i);
    const uint64_t esize = dtype_size(m.dtype);
    if (verify_ && !(state_[i] & kVerified)) check_sum(i, sum_of(bytes, p.wire_bytes));
    delta::Patch &patch = owner_->patch_;
    try {
        delta::parse_into(patch, bytes, p.wire_bytes, m.nbytes / esize, esize, what);
    } catch (const Error &e) {
        fail_chunk(e.status(), e.what());
    }
    uint64_t got = 0;
    const delta::Applied outcome = delta::apply_verified(dst, m.nbytes, patch, p.base_xxh3,
                                                         p.result_xxh3, &got, owner_->replaced_);
    if (outcome != delta::Applied::kApplied) fail_apply(i, outcome, got, what, where);
    state_[i] |= kVerified;
    const auto spent = std::chrono::steady_clock::now() - started;
    apply_ns_ += static_cast<uint64_t>(
        std::max<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count(), 1));
}

std::pair<wsync_status_t, std::string> Iteration::apply_failure(std::size_t i, delta::Applied outcome,
                                                                 uint64_t got, const std::string &what,
                                                                 const char *where) const {
    const PatchInfo &p = table_.patches[i];
    const char *hash = p.tree ? "tree hash" : "XXH3";
    char sums[80];
    if (outcome == delta::Applied::kBaseDiffers) {
        std::snprintf(sums, sizeof sums, "%s %016llx, the patch's base is %016llx", hash,
                      static_cast<unsigned long long>(got),
                      static_cast<unsigned long long>(p.base_xxh3));
        return {WSYNC_ERR_MISMATCH,
                strf("%s: %s does not hold version %" PRIu64 " of it (%s); left unchanged",
                     what.c_str(), where, p.base_version, sums)};
    }
    std::snprintf(sums, sizeof sums, "%s %016llx, the request says %016llx", hash,
                  static_cast<unsigned long long>(got),
                  static_cast<unsigned long long>(p.result_xxh3));
    return {WSYNC_ERR_INTEGRITY,
            strf("%s: the patched tensor's checksum differs (%s); left at version %" PRIu64,
                 what.c_str(), sums, p.base_version)};
}

void Iteration::fail_apply(std::size_t i, delta::Applied outcome, uint64_t got,
                           const std::string &what, const char *where) {
    auto [status, message] = apply_failure(i, outcome, got, what, where);
    fail_chunk(status, std::move(message));
}

void Iteration::apply_on_device(std::size_t i, void *dst, const std::string &what) {
    const TensorMeta &m = table_.metas[i];
    const PatchInfo &p = table_.patches[i];
    ChunkBacking::DevicePatch dp;
    dp.patch = landed(i);
    dp.patch_bytes = p.wire_bytes;
    dp.esize = dtype_size(m.dtype);
    dp.elements = m.nbytes / dp.esize;
    dp.base_hash = p.base_xxh3;
    dp.result_hash = p.result_xxh3;
    // Queued on the loader's stream; its outcome is read once for the chunk, when the
    // iteration ends (settle_device_patches).
    try {
        device_queued_ = true;  // from here on the transport may hold queued work to wait for
        if (!backing_->queue_patch(dst, dp, what))
            wsync::fail(WSYNC_ERR_UNSUPPORTED, "wsync_recv_copy: " + what + " is a patch on a GPU and "
                                               "strategy '" + owner_->kind_.name + "' cannot apply it");
        device_patches_.push_back(i);
    } catch (const Error &e) {
        // A destination that is not the GPU's memory leaves the iteration as it was (nothing
        // was queued); anything else (a malformed patch, a failed launch) fails the chunk.
        if (e.status() == WSYNC_ERR_INVALID_ARGUMENT || e.status() == WSYNC_ERR_UNSUPPORTED) throw;
        fail_chunk(e.status(), e.what());
    }
}

void Iteration::settle_device_patches() noexcept {
    if (!device_queued_) return;
    device_queued_ = false;
    std::vector<std::size_t> queued;
    queued.swap(device_patches_);
    auto fail_first = [&](wsync_status_t status, std::string message) {
        if (failed_ != WSYNC_OK) return;
        // As fail_chunk: bytes the sender may have reused under a dropped receiver are why.
        std::string revoked;
        try {
            revoked = revoked_reason();
        } catch (...) {
        }
        if (!revoked.empty()) {
            status = WSYNC_ERR_PEER;
            message = revoked + " (then: " + message + ")";
        }
        failed_ = status;
        failure_ = std::move(message);
    };
    try {
        const std::vector<delta::PatchOutcome> outs =
            backing_->patch_outcomes("applying the " + std::to_string(queued.size()) +
                                     " patches of " + chunk_label(header_) + " on the GPU");
        using Kind = delta::PatchOutcome::Kind;
        // A patch whose queuing failed part-way has an outcome but no place in `queued`; the
        // chunk failed then already, and the outcomes are only waited for.
        if (outs.size() != queued.size()) queued.clear();
        for (std::size_t k = 0; k < queued.size(); ++k) {
            const std::size_t i = queued[k];
            const delta::PatchOutcome &o = outs[k];
            if (o.outcome == Kind::kApplied) {
                state_[i] |= kVerified;
                continue;
            }
            if (o.outcome == Kind::kMalformed) {
                fail_first(WSYNC_ERR_MALFORMED, o.message);
                continue;
            }
            const std::string what =
                tensor_label(i, table_.metas[i].name.c_str()) + " in " + chunk_label(header_);
            auto [status, message] = apply_failure(
                i, o.outcome == Kind::kBaseDiffers ? delta::Applied::kBaseDiffers : delta::Applied::kResultDiffers,
                o.got, what, "the destination");
            fail_first(status, std::move(message));
        }
        if (queued.empty() && !outs.empty())
            fail_first(WSYNC_ERR_SYSTEM, chunk_label(header_) + ": the transport reported " +
                                             std::to_string(outs.size()) + " patch outcomes for " +
                                             "patches it did not queue");
    } catch (const Error &e) {
        fail_first(e.status(), e.what());
    } catch (...) {
        fail_first(WSYNC_ERR_SYSTEM, "waiting for the patches of " + chunk_label(header_) + " on the GPU failed");
    }
}

bool Iteration::mirrored(std::size_t i) const {
    // Parts of split tensors never carry patches (the sender refuses delta with them), and a
    // selection's ranges are not whole tensors: both load as they would without a mirror.
    return owner_->mirror_on_ && device_is_host(backing_->device()) && !table_.is_part(i) &&
           !subset_.active;
}

const uint8_t *Iteration::mirror(std::size_t i) {
    const TensorMeta &m = table_.metas[i];
    Receiver::Mirror &slot = owner_->mirrors_[m.name];
    if (state_[i] & kMirrored) return slot.bytes.get();
    if (table_.is_patch(i)) {
        if (!slot.bytes || slot.nbytes != m.nbytes)
            fail_chunk(WSYNC_ERR_MISMATCH,
                       strf("%s in %s is a patch against version %" PRIu64 ", but this receiver's "
                            "mirror holds no %" PRIu64 "-byte copy of it (it never loaded the "
                            "tensor dense at this size); the trainer sends a dense version once "
                            "it hears of this failure",
                            tensor_label(i, m.name.c_str()).c_str(), chunk_label(header_).c_str(),
                            table_.patches[i].base_version, m.nbytes));
        apply_onto(i, slot.bytes.get(), "this receiver's mirror");
    } else {
        if (!slot.bytes || slot.nbytes != m.nbytes) {
            slot.bytes.reset();
            slot.nbytes = 0;
            void *p = std::aligned_alloc(64, (std::max<uint64_t>(m.nbytes, 1) + 63) / 64 * 64);
            if (!p)
                fail_chunk(WSYNC_ERR_NO_MEMORY,
                           strf("delta_mirror: no memory for this receiver's copy of %s (%" PRIu64
                                " bytes)", tensor_label(i, m.name.c_str()).c_str(), m.nbytes));
            slot.bytes.reset(static_cast<uint8_t *>(p));
            slot.nbytes = m.nbytes;
        }
        const auto *src = landed(i);
        if (verify_ && !(state_[i] & kVerified))
            check_sum(i, copy_summing(slot.bytes.get(), src, m.nbytes, 0, m.nbytes));
        else
            owner_->pool_->copy(slot.bytes.get(), src, m.nbytes);
    }
    state_[i] |= kMirrored;
    return slot.bytes.get();
}

void Iteration::patch(std::size_t i, wsync_patch_t *out) {
    // Argument errors, a dense entry included, leave the iteration as it was.
    if (i >= table_.metas.size())
        failf(WSYNC_ERR_INVALID_ARGUMENT,
              "wsync_recv_patch: index %zu is out of range (%s has %zu tensors)", i,
              chunk_label(header_).c_str(), table_.metas.size());
    if (failed_ != WSYNC_OK) already_failed();
    check_revoked();
    const TensorMeta &m = table_.metas[i];
    const std::string label = tensor_label(i, m.name.c_str());
    if (!table_.is_patch(i))
        wsync::fail(WSYNC_ERR_INVALID_ARGUMENT,
                    "wsync_recv_patch: " + label + " in " + chunk_label(header_) +
                        " is not a patch (it crossed dense" +
                        (table_.is_part(i) ? std::string(", as a part of a split tensor") : "") +
                        "): take it with wsync_recv_next or wsync_recv_copy (wsync_recv_peek "
                        "flags patches WSYNC_TENSOR_PATCH)");
    auto done = handed_.find(i);
    if (done != handed_.end()) {  // checked already: the same answer, nothing taken again
        *out = done->second.out;
        return;
    }
    const PatchInfo &p = table_.patches[i];
    const std::string what = label + " in " + chunk_label(header_);
    const uint64_t have = owner_->state_.completed();
    if (have != p.base_version)  // the same rule and words as wsync_recv_copy
        fail_chunk(WSYNC_ERR_MISMATCH,
                   strf("%s is a patch against version %" PRIu64 ", but this receiver's "
                        "completed version is %" PRIu64 " (it missed or failed a version, or "
                        "attached since); the trainer sends a dense version once it hears of this "
                        "failure, or as the first version an attached receiver owes",
                        what.c_str(), p.base_version, have));
    const wsync_device_t dev = backing_->device();
    if (!device_is_host(dev) || p.tree)
        wsync::fail(WSYNC_ERR_UNSUPPORTED, "wsync_recv_patch: " + label + " is in " +
                                               device_name(dev) + " memory" +
                                               (p.tree ? ", made on a GPU (apply it with wsync_recv_copy into device memory)" : ""));
    if (mirrored(i)) mirror(i);  // applied onto the mirror and the result verified first
    const auto *bytes = landed(i);
    if (verify_ && !(state_[i] & kVerified)) check_sum(i, sum_of(bytes, p.wire_bytes));
    const uint64_t elements = m.nbytes / dtype_size(m.dtype);
    delta::PatchView v;
    try {
        v = delta::check(bytes, p.wire_bytes, elements, dtype_size(m.dtype), what);
    } catch (const Error &e) {
        fail_chunk(e.status(), e.what());
    }
    HandedPatch &h = handed_[i];
    wsync_patch_t &o = h.out;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.base_version = p.base_version;
    o.count = v.count;
    o.elements = elements;
    o.values = v.values;
    o.base_xxh3 = p.base_xxh3;
    o.result_xxh3 = p.result_xxh3;
    // int32 whenever every flat index of the tensor fits (vLLM's sparse patches are int32).
    o.index_bits = elements <= (uint64_t(1) << 31) ? 32 : 64;
    if (delta::flat_in_place(v, elements) && v.width * 8 == o.index_bits) {
        o.indices = v.indices;
    } else {
        h.wide.resize(std::max<uint64_t>(v.count, 1));
        delta::flat_indices(v, h.wide.data());
        if (o.index_bits == 32) {  // 8-byte wire indices of a small tensor: narrow in place
            auto *narrow = reinterpret_cast<uint8_t *>(h.wide.data());
            for (uint64_t k = 0; k < v.count; ++k) {  // byte 4k never passes the unread 8k
                const int32_t x = int32_t(h.wide[k]);
                std::memcpy(narrow + 4 * k, &x, 4);
            }
        }
        o.indices = h.wide.data();
    }
    state_[i] |= kVerified;
    if (!(state_[i] & kTaken)) state_[i] |= kTaken, ++taken_;
    *out = o;
}

}  // namespace wsync
