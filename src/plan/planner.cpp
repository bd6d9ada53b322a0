#include "plan/planner.hpp"

#include <algorithm>

#include "error.hpp"
#include "options.hpp"
#include "tensor.hpp"

namespace wsync {

namespace {

const std::vector<OptionSpec> &plan_options() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        {"chunk_bytes", T::UInt, uint64_t(256) << 20, 1, uint64_t(1) << 62, "planner",
         "batch whole module groups while a chunk stays within this many bytes"},
        {"group_depth", T::UInt, 2, 0, WSYNC_MAX_NDIM, "planner",
         "dotted name parts dropped to find a tensor's module; 0 disables grouping"},
        {"split", T::Bool, false, 0, 0, "planner",
         "split a tensor larger than chunk_bytes into parts (wsync_part_t) across chunks"},
    };
    return specs;
}

// Tensors are counted as shm and packed transports lay them out (each start aligned to 256
// bytes), so a plan with chunk_bytes <= bucket_bytes fits in a bucket.
uint64_t footprint(uint64_t nbytes) { return (nbytes + 255) / 256 * 256; }

}  // namespace

std::string Plan::group_key(const std::string &name, uint64_t depth) {
    if (depth == 0) return std::string();
    std::size_t end = name.size();
    for (uint64_t d = 0; d < depth; ++d) {
        if (end == 0) return std::string();
        std::size_t dot = name.rfind('.', end - 1);
        if (dot == std::string::npos) return std::string();
        end = dot;
    }
    return name.substr(0, end);
}

Plan::Plan(const wsync_tensor_t *metas, std::size_t n, const char *options_json) {
    Options opts("planner", plan_options(), options_json);
    const uint64_t limit = opts.uint("chunk_bytes");
    const uint64_t depth = opts.uint("group_depth");
    const bool split = opts.boolean("split");
    if (n == 0) fail(WSYNC_ERR_INVALID_ARGUMENT, "planner: no tensors to plan (n is 0)");
    // Any number of tensors may be planned; each chunk gets at most WSYNC_MAX_CHUNK_TENSORS.
    std::vector<TensorMeta> m = metas_from_descriptors(metas, n, /*need_data=*/false);

    PlannedChunk cur;
    uint64_t cur_fp = 0;
    auto close = [&] {
        if (!cur.indices.empty()) chunks_.push_back(std::move(cur));
        cur = PlannedChunk();
        cur_fp = 0;
    };
    // Sums are checked: four tensors of 2^62 bytes (the most one may have) wrap to 0.
    auto sum = [&](uint64_t total, uint64_t more, std::size_t i, const char *of) {
        auto r = add_u64(total, more);
        if (!r)
            fail(WSYNC_ERR_INVALID_ARGUMENT, "planner: " + tensor_label(i, metas[i].name) +
                                                 ": size of " + of + " overflows 64 bits");
        return *r;
    };
    auto add_part = [&](std::size_t i, wsync_part_t part) {
        const uint64_t bytes = part.bytes ? part.bytes : m[i].nbytes;
        if (cur.indices.size() == WSYNC_MAX_CHUNK_TENSORS) close();
        cur.indices.push_back(i);
        cur.parts.push_back(part);
        cur.bytes = sum(cur.bytes, bytes, i, "its chunk");
        cur_fp = sum(cur_fp, footprint(bytes), i, "its chunk");
    };
    auto add = [&](std::size_t i) { add_part(i, wsync_part_t{0, 0}); };
    // A tensor over the limit: parts of whole pages and elements, a chunk each; the last part
    // stays open for the tensors that follow.
    auto add_split = [&](std::size_t i) {
        const uint64_t esize = dtype_size(metas[i].dtype);
        uint64_t grain = 4096;
        while (grain % esize != 0) grain += 4096;
        const uint64_t part = limit / grain * grain;
        close();
        // Kept whole, in a chunk of its own, as without "split": a tensor over the limit only by
        // its 256-byte rounding, or a limit below one part (whole pages of whole elements). So
        // "split" never fails a plan that would succeed without it; the sender refuses a chunk
        // its buckets cannot hold, naming the tensor.
        if (part == 0 || part >= m[i].nbytes) return add(i);
        for (uint64_t off = 0; off < m[i].nbytes; off += part) {
            close();
            add_part(i, wsync_part_t{off, std::min(part, m[i].nbytes - off)});
        }
    };

    std::size_t i = 0;
    while (i < n) {
        // A group: consecutive tensors sharing a non-empty module key.
        std::string key = group_key(m[i].name, depth);
        std::size_t j = i + 1;
        uint64_t group_fp = footprint(m[i].nbytes);
        if (!key.empty())
            for (; j < n && group_key(m[j].name, depth) == key; ++j)
                group_fp = sum(group_fp, footprint(m[j].nbytes), j, "its module group");
        if (group_fp > limit) {
            // Too big to keep whole: split between tensors; a lone tensor may exceed the limit.
            close();
            for (std::size_t k = i; k < j; ++k) {
                if (split && footprint(m[k].nbytes) > limit) {
                    add_split(k);
                    continue;
                }
                if (!cur.indices.empty() && cur_fp + footprint(m[k].nbytes) > limit) close();
                add(k);
            }
            close();
        } else {
            // A group that fits no more by count starts a chunk; one of more than
            // WSYNC_MAX_CHUNK_TENSORS tensors is split by add().
            if (cur_fp + group_fp > limit || j - i > WSYNC_MAX_CHUNK_TENSORS - cur.indices.size())
                close();
            for (std::size_t k = i; k < j; ++k) add(k);
        }
        i = j;
    }
    close();
}

}  // namespace wsync
