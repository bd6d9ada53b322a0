#include "plan/layout.hpp"

#include "copy/copy.hpp"

#include "error.hpp"
#include "wire.hpp"

namespace wsync::layout {

namespace {
bool flagged(const InPlace &in_place, std::size_t i) { return !in_place.empty() && in_place[i]; }
}  // namespace

uint64_t place(TensorTable &table, uint64_t capacity, const std::string &who,
               const InPlace &in_place) {
    table.offsets.resize(table.metas.size());
    uint64_t end = 0;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        if (flagged(in_place, i)) continue;
        const TensorMeta &m = table.metas[i];
        const uint64_t off = round_up(end, kTensorAlign);
        if (m.nbytes > capacity || off > capacity - m.nbytes) {
            // A delta patch crosses as the chunk's bytes: say so, or its size (indices and
            // values, up to twice the tensor's with delta "on") reads like the tensor's.
            const std::string entry =
                table.is_patch(i) ? "the delta patch of tensor '" + m.name + "' (" +
                                        std::to_string(m.nbytes) + " bytes: indices and values)"
                                  : "tensor '" + m.name + "' of " + std::to_string(m.nbytes) +
                                        " bytes";
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 who + ": chunk does not fit in one bucket of " + std::to_string(capacity) +
                     " bytes (" + entry + " would end past it); raise bucket_bytes or plan "
                     "smaller chunks" +
                     (table.is_patch(i) ? std::string(", or use delta \"auto\", whose patches "
                                                      "are never larger than the tensor")
                                        : std::string()));
        }
        table.offsets[i] = off;
        end = off + m.nbytes;
    }
    return end;
}

void check_entry(const TensorTable &table, std::size_t i, uint64_t bytes, const std::string &where,
                 const char *what) {
    const uint64_t off = table.offsets[i], n = table.metas[i].nbytes;
    if (off % kTensorAlign != 0 || n > bytes || off > bytes - n)
        wire::malformed(where + ": tensor '" + table.metas[i].name + "' at offset " +
                        std::to_string(off) + " (+" + std::to_string(n) +
                        " bytes) is misaligned or outside the " + std::to_string(bytes) + "-byte " +
                        what);
}

void check(const TensorTable &table, uint64_t bytes, const std::string &where, const char *what,
           const InPlace &in_place) {
    for (std::size_t i = 0; i < table.metas.size(); ++i)
        if (!flagged(in_place, i)) check_entry(table, i, bytes, where, what);
}

void pack_host(uint8_t *dst, const wsync_tensor_t *tensors, TensorTable &table, bool checksum,
               const InPlace &in_place, copy::Pool &pool) {
    if (checksum) {
        table.checksums.resize(table.metas.size());
        table.tree_sums = true;
    }
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const uint64_t n = table.metas[i].nbytes;
        const bool here = flagged(in_place, i);
        if (checksum)
            table.checksums[i] = here ? pool.tree_hash(tensors[i].data, n)
                                      : pool.copy_tree_hashing(dst + table.offsets[i], tensors[i].data, n, 0, n);
        else if (!here)
            pool.copy(dst + table.offsets[i], tensors[i].data, n);
    }
}

}  // namespace wsync::layout
