// Split tensors: a tensor larger than a bucket travels as byte-range parts in consecutive
// chunks of one version (wsync_sender_send_parts, the planner's "split" option). A part entry in
// a tensor table keeps the whole tensor's name, dtype and shape; its PartInfo says which bytes
// of the whole it carries. This file holds the rules both sides share: what a valid part is, the
// "parts" column of a request (docs/wire-format.md), and the per-version order check (parts of
// one tensor arrive in order, back to back, and all of them before the version commits).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor.hpp"

namespace wsync::parts {

// Checks the caller's part for descriptor i (its meta m) and returns it as a PartInfo (bytes 0
// when the part is the whole tensor). WSYNC_ERR_INVALID_ARGUMENT naming the tensor otherwise.
PartInfo from_caller(const wsync_part_t &p, const TensorMeta &m, std::size_t i);

// The sender's side: fills table.parts from the caller's ranges (parts may be NULL; left empty
// when every entry is whole).
void take(TensorTable &table, const wsync_part_t *parts);

// What a transport is given for a table with parts: each part as a 1-D tensor of its elements
// starting at its first byte. to_wire swaps the table's metas for those; from_wire puts the whole
// tensors' metas back, keeping what the transport changed (a cast scales the part's range).
struct Wire {
    std::vector<wsync_tensor_t> descs;
    std::vector<int64_t> shapes;
    std::vector<TensorMeta> logical;
};
const wsync_tensor_t *to_wire(TensorTable &table, const wsync_tensor_t *tensors, Wire &w);
void from_wire(TensorTable &table, Wire &w);

// Writes the "parts" column when the table has a part.
void encode(const TensorTable &table, json &obj);
// Reads the optional "parts" column; WSYNC_ERR_MALFORMED naming the entry on any defect.
void decode(const json &obj, TensorTable &table);

// Parts in flight within one version: name -> the next byte expected.
class Tracker {
public:
    // Checks the chunk's entries against what came before in this version and records them.
    // Throws `status` naming the tensor when a part is out of order, a tensor restarts, or a
    // whole tensor arrives while its parts are still coming.
    void add(const TensorTable &table, wsync_status_t status, const std::string &where);
    // Throws `status` when a split tensor has parts still missing (at a version's commit).
    void require_complete(wsync_status_t status, const std::string &where) const;
    void reset() { open_.clear(); }
    bool empty() const { return open_.empty(); }

private:
    std::unordered_map<std::string, uint64_t> open_;
};

}  // namespace wsync::parts
