// wsync bench: the receiver's copy loop (wsync_recv_copy) against glibc memcpy out of the same
// views, at a destination offset past a page and page-aligned, in one process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Runs the comparison over tensors of the given sizes, in chunks of about chunk_bytes, and
// returns a JSON object (text) with GB/s per mode and alignment and the ratios between them.
std::string bench_copy_json(const std::vector<uint64_t> &sizes, uint64_t chunk_bytes,
                            uint64_t dst_offset, bool progress);
