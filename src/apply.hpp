// Destination tables (wsync_dest_table_create / wsync_recv_apply): where an engine keeps each
// wire tensor, declared once, so a chunk loads with one call. The table is core: it checks names,
// dtypes and shapes and keeps, per destination, what the receiver's transport said about its
// memory (ReceiverImpl::describe_destination), which it asks the transport to recheck before
// each apply. Iteration::apply (apply.cpp) does the loading.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "strategy.hpp"
#include "tensor.hpp"

namespace wsync {

class Receiver;

class DestTable {
public:
    struct Dest {
        TensorMeta meta;  // the wire tensor it takes: name, dtype, shape, nbytes
        void *data = nullptr;
        uint64_t offset = 0, len = 0;  // the byte range of the wire tensor it takes
        ReceiverImpl::DestMemory memory;
        uint64_t written_version = 0;  // the newest version an apply wrote it in
    };
    // Checks every destination (WSYNC_ERR_INVALID_ARGUMENT naming it) and asks the receiver's
    // transport where its memory is.
    DestTable(Receiver &receiver, const wsync_dest_t *dests, std::size_t n);
    const Receiver *receiver() const { return receiver_; }
    const std::vector<Dest> &dests() const { return dests_; }
    std::vector<Dest> &dests() { return dests_; }
    // The destinations of a wire tensor's name (NULL: none).
    const std::vector<std::size_t> *of(const std::string &name) const {
        auto it = by_name_.find(name);
        return it == by_name_.end() ? nullptr : &it->second;
    }
    // "destination 3 ('layers.0.q') at 0x7f..." for messages.
    std::string label(std::size_t d) const;

private:
    const Receiver *receiver_;
    std::vector<Dest> dests_;
    std::unordered_map<std::string, std::vector<std::size_t>> by_name_;
};

}  // namespace wsync
