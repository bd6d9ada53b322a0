// wsync: the command line of demo and bench.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli.hpp"

namespace wsync_cli {
uint64_t parse_uint(const std::string &flag, const char *v, uint64_t lo, uint64_t hi) {
    if (!v) usage_error(flag + " needs a value");
    char *end = nullptr;
    errno = 0;
    unsigned long long x = std::strtoull(v, &end, 10);
    if (errno || !*v || *end || x < lo || x > hi)
 usage_error(flag + ": '" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]");
    return x;
}


Args parse_args(int argc, char **argv, int first, bool bench) {
    Args a;
    if (bench) {
        a.size_mb = 2048;
        a.receivers = 1;
    }
    for (int i = first; i < argc; ++i) {
        std::string f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (f == "--size-mb") a.size_mb = parse_uint(f, v, 1, 1 << 20), a.size_set = true, ++i;
        else if (f == "--size-gb" && bench)
            a.size_mb = parse_uint(f, v, 1, 1024) << 10, a.size_set = true, ++i;
        else if (f == "--strategy" && bench) {
            if (!v || (std::strcmp(v, "shm") && std::strcmp(v, "cuda_ipc") && std::strcmp(v, "ucx")))
                usage_error("--strategy takes shm, cuda_ipc or ucx");
            a.strategy = v, ++i;
        } else if (f == "--transports" && bench) {
            if (!v) usage_error("--transports takes UCX transports, e.g. tcp");
            a.transports = v, ++i;
        } else if (f == "--net-devices" && bench) {
            if (!v) usage_error("--net-devices takes UCX network devices, e.g. lo or eth0");
            a.net_devices = v, ++i;
        } else if (f == "--engine-netns" && bench) {
            if (!v) usage_error("--engine-netns takes a name from `ip netns list`");
            a.engine_netns = v, ++i;
        } else if (f == "--packed" && bench) {
            if (!v || (std::strcmp(v, "true") && std::strcmp(v, "false")))
                usage_error("--packed takes true or false");
            a.packed = std::strcmp(v, "true") == 0, ++i;
        } else if (f == "--dtype" && bench) {
            if (!v || (std::strcmp(v, "bfloat16") && std::strcmp(v, "float16")))
                usage_error("--dtype takes bfloat16 or float16");
            a.dtype = v, ++i;
        }
        else if (f == "--receivers") a.receivers = parse_uint(f, v, 1, 64), ++i;
        else if (f == "--steps") a.steps = parse_uint(f, v, 2, 1000), ++i;
        else if (f == "--chunk-mb") a.chunk_mb = parse_uint(f, v, 1, 1 << 16), ++i;
        else if (f == "--bucket-mb") a.bucket_mb = parse_uint(f, v, 1, 1 << 16), ++i;
        else if (f == "--buckets") a.buckets = parse_uint(f, v, 1, 64), a.buckets_set = true, ++i;
        else if (f == "--copy-threads") a.copy_threads = int(parse_uint(f, v, 0, 64)), ++i;
        else if (f == "--timeout-ms") a.timeout_ms = parse_uint(f, v, 1, 1ull << 40), ++i;
        else if (f == "--no-checksum") a.checksum = false, a.checksum_compare = false;
        else if (f == "--json" && bench) a.json = true;
        else if (f == "--no-checksum-compare" && bench) a.checksum_compare = false;
        else if (f == "--dst-offset") a.dst_offset = parse_uint(f, v, 0, 4095), ++i;
        else if (f == "--load") {
            if (!v || (std::strcmp(v, "copy") && std::strcmp(v, "memcpy") && std::strcmp(v, "apply") &&
                       std::strcmp(v, "views") && std::strcmp(v, "land")))
                usage_error("--load takes copy, memcpy or apply (shm, ucx), land (ucx), apply or views (cuda_ipc)");
            a.load_copy = std::strcmp(v, "copy") == 0;
            a.load_table = std::strcmp(v, "apply") == 0 || std::strcmp(v, "land") == 0;
            a.load_land = std::strcmp(v, "land") == 0;
            a.load_set = true;
            a.load_views = std::strcmp(v, "views") == 0, ++i;
        } else if (f == "--split") {
            if (!v || (std::strcmp(v, "on") && std::strcmp(v, "off")))
                usage_error("--split takes on or off");
            a.split = std::strcmp(v, "on") == 0, ++i;
        } else if (f == "--no-copy-bench" && bench) a.copy_bench = false;
        else if (f == "--arena") a.arena = true;
        else if (f == "--gpu") a.gpu = true;
        else if (f == "--no-arena-compare" && bench) a.arena_compare = false;
        else if (f == "--rounds" && bench) a.rounds = uint32_t(parse_uint(f, v, 1, 100)), ++i;
        else usage_error("unknown option '" + f + "' (see: wsync help)");
    }
    return a;
}

}  // namespace wsync_cli
