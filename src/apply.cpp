// wsync_dest_table_create and wsync_recv_apply: a chunk loaded into declared destinations by one
// call (header section "Destination tables"). The checks come first and change nothing; then the
// chunk's dense device copies go to the transport as one batch (one kernel launch), and
// everything else (host copies with their verification, patches, parts on hosts) takes the
// path of wsync_recv_copy, entry by entry.
#include "apply.hpp"

#include <algorithm>
#include <cinttypes>
#include <unordered_set>

#include "core.hpp"
#include "error.hpp"

namespace wsync {

namespace {
std::string shape_text(const TensorMeta &m) {
    std::string s = "[";
    for (int32_t k = 0; k < m.ndim; ++k) s += (k ? ", " : "") + std::to_string(m.shape[k]);
    return s + "]";
}
}  // namespace

DestTable::DestTable(Receiver &receiver, const wsync_dest_t *dests, std::size_t n)
    : receiver_(&receiver) {
    if (n == 0) fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_dest_table_create: n is 0 (a table needs a destination)");
    if (n > WSYNC_MAX_CHUNK_TENSORS * uint64_t(4))
        failf(WSYNC_ERR_INVALID_ARGUMENT, "wsync_dest_table_create: %zu destinations is more than %llu", n,
              static_cast<unsigned long long>(WSYNC_MAX_CHUNK_TENSORS) * 4);
    dests_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        const wsync_dest_t &d = dests[i];
        auto who = [&] { return "wsync_dest_table_create: destination " + tensor_label(i, d.name); };
        if (d.struct_size != 0 && d.struct_size < sizeof(wsync_dest_t))
            fail(WSYNC_ERR_INVALID_ARGUMENT, who() + ": struct_size " + std::to_string(d.struct_size) +
                                                 " is less than this layout's " + std::to_string(sizeof(wsync_dest_t)));
        if (d.flags != 0) fail(WSYNC_ERR_INVALID_ARGUMENT, who() + ": flags must be 0");
        if (!d.data) fail(WSYNC_ERR_INVALID_ARGUMENT, who() + ": data is NULL");
        wsync_tensor_t t{};
        t.name = d.name;
        t.shape = d.shape;
        t.ndim = d.ndim;
        t.dtype = d.dtype;
        t.device = {WSYNC_DEVICE_CPU, 0};
        Dest out;
        try {
            out.meta = meta_from_descriptor(t, i, false);
        } catch (const Error &e) {
            fail(e.status(), "wsync_dest_table_create: " + std::string(e.what()));
        }
        const uint64_t esize = dtype_size(out.meta.dtype);
        if (d.src_offset > out.meta.nbytes || d.bytes > out.meta.nbytes - d.src_offset ||
            d.src_offset % esize || d.bytes % esize)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 who() + strf(": bytes [%" PRIu64 ", +%" PRIu64 ") of a %" PRIu64
                              "-byte tensor, or not whole elements of %" PRIu64 " bytes",
                              d.src_offset, d.bytes, out.meta.nbytes, esize));
        out.data = d.data;
        out.offset = d.src_offset;
        out.len = d.bytes ? d.bytes : out.meta.nbytes - d.src_offset;
        const uint64_t end = reinterpret_cast<uint64_t>(d.data) + out.len;
        if (end < reinterpret_cast<uint64_t>(d.data))
            fail(WSYNC_ERR_INVALID_ARGUMENT, who() + ": data + bytes wraps the address space");
        out.memory = receiver.transport().describe_destination(d.data, out.len, [&] {
            return tensor_label(i, d.name) + " of the table";
        });
        // Two destinations of one name that overlap would race in one launch.
        auto &same = by_name_[out.meta.name];
        for (std::size_t other : same) {
            const Dest &o = dests_[other];
            const uint64_t a = reinterpret_cast<uint64_t>(o.data), b = reinterpret_cast<uint64_t>(out.data);
            if (a < b + out.len && b < a + o.len)
                fail(WSYNC_ERR_INVALID_ARGUMENT,
                     who() + ": overlaps destination " + std::to_string(other) + " of the same name");
        }
        same.push_back(i);
        dests_.push_back(std::move(out));
    }
}

std::string DestTable::label(std::size_t d) const {
    return "destination " + tensor_label(d, dests_[d].meta.name.c_str()) +
           strf(" at 0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(dests_[d].data)));
}

// ---------------------------------------------------------------------------------------------
void Receiver::land(const DestTable *table) {
    const std::string who = std::string("wsync_receiver_land (") + kind_.name + ")";
    if (open_)
        fail(WSYNC_ERR_WRONG_STATE, who + ": an iteration is open: end or fail it first (its chunk "
                                          "is being pulled into the destinations landing has now)");
    if (!table) {
        impl_->land({});
        return;
    }
    if (table->receiver() != this)
        fail(WSYNC_ERR_INVALID_ARGUMENT, who + ": the destination table was made for another receiver");
    if (mirror_on_)
        fail(WSYNC_ERR_UNSUPPORTED, who + ": this receiver keeps its own copy of each tensor (\"delta_mirror\"), "
                                          "which its loads come from; landing would bypass it");
    std::vector<Landing> dests;
    dests.reserve(table->dests().size());
    for (const DestTable::Dest &d : table->dests())
        if (!d.memory.device)  // device memory is loaded from the receive buffer, by the GPU
            dests.push_back({d.meta, static_cast<uint8_t *>(d.data), d.offset, d.len});
    if (!impl_->land(std::move(dests)))
        fail(WSYNC_ERR_UNSUPPORTED,
             who + ": this kind does not land bytes" +
                 (std::string(kind_.name) == "ucx"
                      ? std::string(" for a receiver with \"device\" (its chunks land in pinned memory the GPU copies from)")
                      : std::string(" (\"shm\" and \"cuda_ipc\" map the trainer's memory, \"nccl_broadcast\" "
                                    "receives into its own device buffer): load with wsync_recv_apply")));
}

// ---------------------------------------------------------------------------------------------
void Iteration::apply(DestTable &table, uint32_t flags, wsync_apply_result_t *out) {
    constexpr uint32_t kKnown = WSYNC_APPLY_PARTIAL | WSYNC_APPLY_COMPLETE;
    if (flags & ~kKnown) failf(WSYNC_ERR_INVALID_ARGUMENT, "wsync_recv_apply: unknown flags 0x%x", flags & ~kKnown);
    if (table.receiver() != owner_)
        wsync::fail(WSYNC_ERR_INVALID_ARGUMENT,
             "wsync_recv_apply: the destination table was made for another receiver");
    if (failed_ != WSYNC_OK) already_failed();
    check_revoked();
    *out = wsync_apply_result_t{};
    const std::size_t n = table_.metas.size();
    const std::string version = std::to_string(header_.version);
    // 1. Every entry against the table; nothing moves until all pass.
    std::vector<const std::vector<std::size_t> *> dests(n, nullptr);
    for (std::size_t i = 0; i < n; ++i) {
        if (state_[i] & kTaken) continue;  // a copy or a view took it already
        const TensorMeta &m = table_.metas[i];
        dests[i] = table.of(m.name);
        if (!dests[i]) {
            if (flags & WSYNC_APPLY_PARTIAL) {
                ++out->unmatched;
                continue;
            }
            wsync::fail(WSYNC_ERR_MISMATCH, "wsync_recv_apply: " + tensor_label(i, m.name.c_str()) + " in " +
                                         chunk_label(header_) + " has no destination in the table");
        }
        for (std::size_t d : *dests[i]) {
            const DestTable::Dest &dst = table.dests()[d];
            if (!same_dtype(dst.meta.dtype, m.dtype) || !same_shape(dst.meta, m))
                wsync::fail(WSYNC_ERR_MISMATCH,
                     "wsync_recv_apply: " + tensor_label(i, m.name.c_str()) + " in " + chunk_label(header_) +
                         " is " + dtype_name(m.dtype) + " " + shape_text(m) + ", its " + table.label(d) +
                         " takes " + dtype_name(dst.meta.dtype) + " " + shape_text(dst.meta));
        }
        if (table_.is_patch(i) && dests[i]->size() > 1)
            wsync::fail(WSYNC_ERR_UNSUPPORTED,
                 "wsync_recv_apply: " + tensor_label(i, m.name.c_str()) + " in " + chunk_label(header_) +
                     " is a patch and has " + std::to_string(dests[i]->size()) +
                     " destinations; a patch applies onto one (give the table one destination of "
                     "this name and copy it to the others)");
    }
    if ((flags & WSYNC_APPLY_COMPLETE) && header_.last) {
        std::vector<uint8_t> now(table.dests().size(), 0);
        for (std::size_t i = 0; i < n; ++i)
            if (dests[i])
                for (std::size_t d : *dests[i]) now[d] = 1;
        std::string missing;
        std::size_t count = 0;
        for (std::size_t d = 0; d < table.dests().size(); ++d) {
            if (now[d] || table.dests()[d].written_version == header_.version) continue;
            if (++count <= 8) missing += (missing.empty() ? "" : ", ") + ("'" + table.dests()[d].meta.name + "'");
        }
        if (count)
            wsync::fail(WSYNC_ERR_MISMATCH,
                 "wsync_recv_apply: version " + version + " ends with " + chunk_label(header_) + " and " +
                     std::to_string(count) + " destination(s) of the table were not written by it: " +
                     missing + (count > 8 ? " and " + std::to_string(count - 8) + " more" : "") +
                     " (WSYNC_APPLY_COMPLETE: the version is not committed here)");
    }
    // The memory of device destinations: still the allocations the table was made over.
    for (std::size_t i = 0; i < n; ++i)
        if (dests[i])
            for (std::size_t d : *dests[i])
                if (table.dests()[d].memory.device)
                    owner_->impl_->recheck_destination(table.dests()[d].memory, [&] { return table.label(d); });

    // 2. Dense entries into device memory: one batch for the transport.
    const bool device_chunk = !device_is_host(backing_->device());
    std::vector<ChunkBacking::DeviceCopy> batch;
    std::vector<uint8_t> batched(n, 0);
    if (device_chunk) {
        for (std::size_t i = 0; i < n; ++i) {
            if (!dests[i] || table_.is_patch(i)) continue;
            const uint8_t *src = landed(i);
            for (std::size_t d : *dests[i]) {
                const DestTable::Dest &dst = table.dests()[d];
                uint64_t off = dst.offset, len = dst.len;
                void *to = dst.data;
                if (!share_of_entry(i, &off, &to, &len)) continue;
                const uintptr_t a = reinterpret_cast<uintptr_t>(to), s = reinterpret_cast<uintptr_t>(src);
                if (a < s + table_.wire_bytes(i) && s < a + len)
                    wsync::fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_recv_apply: " + table.label(d) +
                                                         " overlaps the received bytes of " +
                                                         tensor_label(i, table_.metas[i].name.c_str()));
                batch.push_back({src + off, to, len});
                out->bytes += len;
                ++out->writes;
            }
            batched[i] = 1;
        }
        if (!batch.empty()) {
            ChunkBacking::BatchQueued q;
            if (backing_->copy_batch_to_device(batch, [&] { return chunk_label(header_); }, &q))
                out->launches = q.launches, out->device_copies = q.driver_copies;
            else
                std::fill(batched.begin(), batched.end(), 0), out->bytes = 0, out->writes = 0;
        }
    }
    // 3. The rest as wsync_recv_copy would take it (host copies verified; patches applied).
    for (std::size_t i = 0; i < n; ++i) {
        if (!dests[i]) continue;
        if (!batched[i]) {
            for (std::size_t d : *dests[i]) {
                const DestTable::Dest &dst = table.dests()[d];
                copy(i, dst.offset, dst.data, dst.len);
                uint64_t off = dst.offset, len = dst.len;  // what that wrote, for the result
                void *to = dst.data;
                if (share_of_entry(i, &off, &to, &len)) out->bytes += len;
                ++out->writes;
            }
        }
        if (!(state_[i] & kTaken)) state_[i] |= kTaken, ++taken_;
        ++out->tensors;
        for (std::size_t d : *dests[i]) table.dests()[d].written_version = header_.version;
    }
}

}  // namespace wsync
