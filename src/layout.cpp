#include "layout.hpp"

#include "error.hpp"
#include "wire.hpp"

namespace wsync::layout {

uint64_t place(TensorTable &table, uint64_t capacity, const std::string &who) {
    table.offsets.resize(table.metas.size());
    uint64_t end = 0;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const TensorMeta &m = table.metas[i];
        const uint64_t off = round_up(end, kTensorAlign);
        if (m.nbytes > capacity || off > capacity - m.nbytes)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 who + ": chunk does not fit in one bucket of " + std::to_string(capacity) +
                     " bytes (tensor '" + m.name + "' of " + std::to_string(m.nbytes) +
                     " bytes would end past it); raise bucket_bytes or plan smaller chunks");
        table.offsets[i] = off;
        end = off + m.nbytes;
    }
    return end;
}

void check(const TensorTable &table, uint64_t bytes, const std::string &where, const char *what) {
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const uint64_t off = table.offsets[i], n = table.metas[i].nbytes;
        if (off % kTensorAlign != 0 || n > bytes || off > bytes - n)
            wire::malformed(where + ": tensor '" + table.metas[i].name + "' at offset " +
                            std::to_string(off) + " (+" + std::to_string(n) +
                            " bytes) is misaligned or outside the " + std::to_string(bytes) +
                            "-byte " + what);
    }
}

}  // namespace wsync::layout
