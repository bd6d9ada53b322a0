#include "transport/cuda_ipc/request.hpp"

#include <algorithm>
#include <cstring>

#include "transport/local/board.hpp"
#include "error.hpp"
#include "wire.hpp"

namespace wsync::cuda_ipc {

using gpu::CUipcMemHandle;

json encode_handle(const CUipcMemHandle &h) {
    return json::binary(std::vector<uint8_t>(h.reserved, h.reserved + sizeof h.reserved));
}

CUipcMemHandle decode_handle(const json &v, const std::string &where) {
    if (!v.is_binary() || v.get_binary().size() != sizeof(CUipcMemHandle))
        wire::malformed(where + " is not a 64-byte IPC handle");
    CUipcMemHandle h;
    std::memcpy(h.reserved, v.get_binary().data(), sizeof h.reserved);
    return h;
}

std::string segment_of(const json &transport) {
    if (!transport.is_object() || !transport.contains("segment")) return std::string();
    return wire::string_field(transport, "segment", "cuda_ipc request", 255);
}

json merge_requests(const std::vector<const json *> &transports) {
    const std::string w = "cuda_ipc merge";
    const json &first = *transports[0];
    json parts = json::array();
    std::vector<std::string> seen;
    const std::string board = segment_of(first);
    for (std::size_t i = 0; i < transports.size(); ++i) {
        const json &t = *transports[i];
        const std::string where = w + ": part " + std::to_string(i);
        if (wire::uint_field(t, "seq", where, UINT64_MAX) != wire::uint_field(first, "seq", w, UINT64_MAX) ||
            wire::uint_field(t, "slot", where, UINT32_MAX) != wire::uint_field(first, "slot", w, UINT32_MAX) ||
            wire::bool_field(t, "packed", where) != wire::bool_field(first, "packed", w))
            fail(WSYNC_ERR_MISMATCH, where + " is for another chunk seq, slot or mode than part 0");
        if (const std::string of = segment_of(t); of != board)
            fail(WSYNC_ERR_MISMATCH, where + " is of the sync of board '" + wire::printable(of) +
                                         "', part 0 of '" + wire::printable(board) + "'");
        for (const json &p : wire::array_field(t, "parts", where, board::kMaxReceivers)) {
            const std::string &text = wire::string_field(p, "uuid", where, 64);
            gpu::CUuuid u;
            if (!gpu::parse_uuid(text, &u)) wire::malformed(where + ": uuid '" + text + "' is not a GPU UUID");
            std::string canon = gpu::uuid_text(u);
            if (std::find(seen.begin(), seen.end(), canon) != seen.end())
                fail(WSYNC_ERR_MISMATCH, w + ": " + canon + " appears in two parts (part " +
                                             std::to_string(i) + " repeats it); each GPU is served by one sender");
            seen.push_back(canon);
            parts.push_back(p);
        }
    }
    if (parts.size() > board::kMaxReceivers)
        fail(WSYNC_ERR_INVALID_ARGUMENT, w + ": more than 64 parts");
    json out = first;
    out["parts"] = std::move(parts);
    return out;
}

}  // namespace wsync::cuda_ipc
