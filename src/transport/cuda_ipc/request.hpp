// cuda_ipc's requests: the handle codec of the request's parts, and the merge of several
// senders' partial requests for one chunk into one.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/api.hpp"

namespace wsync::cuda_ipc {

using json = nlohmann::json;

// An IPC handle as a 64-byte CBOR byte string, and back (WSYNC_ERR_MALFORMED naming `where`).
json encode_handle(const gpu::CUipcMemHandle &h);
gpu::CUipcMemHandle decode_handle(const json &v, const std::string &where);

// The request's "segment" (its sync's board name), or "" for a request from before the field
// existed; WSYNC_ERR_MALFORMED when it is there but not a string of at most 255 bytes.
std::string segment_of(const json &transport);

// Concatenates the senders' parts of one chunk's request (all of one sync, by "segment"); each
// GPU may appear once.
json merge_requests(const std::vector<const json *> &transports);

}  // namespace wsync::cuda_ipc
