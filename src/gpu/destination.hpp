// What the GPU receivers answer for a destination table (ReceiverImpl::describe_destination and
// recheck_destination): device memory of the receiver's GPU, checked with the driver once when
// the table is made, and its allocations compared again before each apply.
#pragma once

#include "gpu/device.hpp"
#include "strategy.hpp"

namespace wsync::gpu {

// Device memory of `dev`'s GPU holding [data, data + len) (one allocation or a mapped span);
// else WSYNC_ERR_INVALID_ARGUMENT naming what().
inline ReceiverImpl::DestMemory describe_device_destination(const Device &dev, void *data, uint64_t len,
                                                            const std::function<std::string()> &what,
                                                            const char *kind) {
    ReceiverImpl::DestMemory m;
    m.device = true;
    for (const MemPiece &p : check_device_destination(dev, data, len, what, kind, "wsync_dest_table_create")) {
        m.pieces.emplace_back(p.base, p.size);
        m.ids.push_back(p.buffer_id);
    }
    return m;
}

inline void recheck_device_destination(const Device &dev, const ReceiverImpl::DestMemory &m,
                                       const std::function<std::string()> &what) {
    std::vector<MemPiece> pieces(m.pieces.size());
    for (std::size_t k = 0; k < pieces.size(); ++k)
        pieces[k] = MemPiece{m.pieces[k].first, static_cast<std::size_t>(m.pieces[k].second), m.ids[k]};
    recheck_device_destination(dev, pieces, what, "wsync_recv_apply");
}

}  // namespace wsync::gpu
