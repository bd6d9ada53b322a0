// See bench_copy.hpp. Each mode runs on its own single-receiver shm sync, so no receiver does
// unmeasured work on the bytes between the pack and the measured copy.
#include "bench_copy.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "wsync.h"

namespace {

using Clock = std::chrono::steady_clock;

void must(wsync_status_t st, const char *what) {
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "wsync bench (copy): %s: %s: %s\n", what, wsync_status_string(st),
                     wsync_last_error());
        std::exit(1);
    }
}

// Pre-faulted buffers, each tensor `offset` bytes past a page boundary.
struct Arena {
    uint8_t *base = nullptr;
    std::vector<uint8_t *> at;
    Arena(const std::vector<uint64_t> &sizes, uint64_t offset) {
        uint64_t total = 0;
        for (uint64_t n : sizes) total += (n + offset + 4095) / 4096 * 4096;
        base = static_cast<uint8_t *>(std::aligned_alloc(4096, total));
        if (!base) {
            std::fprintf(stderr, "wsync bench (copy): out of memory\n");
            std::exit(1);
        }
        std::memset(base, 1, total);
        uint64_t off = 0;
        for (uint64_t n : sizes) {
            at.push_back(base + off + offset);
            off += (n + offset + 4095) / 4096 * 4096;
        }
    }
    ~Arena() { std::free(base); }
};

struct Sync {
    wsync_strategy_t *tx_strategy = nullptr, *rx_strategy = nullptr;
    wsync_blob_t init{};
    wsync_sender_t *sender = nullptr;
    wsync_receiver_t *receiver = nullptr;
    Sync(uint64_t bucket, bool checksum, const char *rx_options) {
        std::string o = "{\"receivers\": 1, \"buckets\": 2, \"bucket_bytes\": " +
                        std::to_string(bucket) + ", \"checksum\": " +
                        (checksum ? "true" : "false") + "}";
        must(wsync_strategy_create("shm", o.c_str(), &tx_strategy), "strategy");
        must(wsync_strategy_create_init_info(tx_strategy, &init), "init info");
        must(wsync_sender_create(tx_strategy, init.data, init.size, &sender), "sender");
        must(wsync_strategy_create("shm", rx_options, &rx_strategy), "strategy");
        must(wsync_receiver_create(rx_strategy, init.data, init.size, 0, &receiver), "receiver");
    }
    ~Sync() {
        wsync_receiver_destroy(receiver);
        wsync_sender_destroy(sender);
        wsync_strategy_destroy(rx_strategy);
        wsync_strategy_destroy(tx_strategy);
        wsync_blob_free(&init);
    }
};

// copy_verified: wsync_recv_copy with checksums on, on the copy threads (a tree hash's pieces
// are verified by all of them); copy_verified_one_thread: the same tree-hashed copy on an engine
// with "copy_threads": 1, the way every verified copy ran (though over one XXH3-64 stream) before
// format 5. Only the engine's options matter: only its copies are timed.
enum Mode { kMemcpy, kCopy, kCopyThreads, kCopyVerified, kCopyVerifiedOne, kNextVerifiedMemcpy, kModes };
const char *const kModeNames[kModes] = {"memcpy", "copy", "copy_threads", "copy_verified",
                                        "copy_verified_one_thread", "next_verified_memcpy"};

}  // namespace

std::string bench_copy_json(const std::vector<uint64_t> &sizes, uint64_t chunk_bytes,
                            uint64_t dst_offset, bool progress) {
    // The model as chunks of consecutive tensors; tensors sit at 256-byte offsets in a bucket.
    std::vector<std::string> names(sizes.size());
    std::vector<int64_t> shapes(sizes.size());
    std::vector<wsync_tensor_t> t(sizes.size());
    Arena weights(sizes, 64);
    std::vector<std::vector<wsync_tensor_t>> chunks(1);
    uint64_t in_chunk = 0, bucket = 4096, total = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        names[i] = "t" + std::to_string(i);
        shapes[i] = int64_t(sizes[i]);
        t[i] = wsync_tensor_t{};
        t[i].name = names[i].c_str();
        t[i].data = weights.at[i];
        t[i].shape = &shapes[i];
        t[i].ndim = 1;
        t[i].dtype = {WSYNC_DTYPE_UINT, 8, 1};
        t[i].device = {WSYNC_DEVICE_CPU, 0};
        for (uint64_t k = 0; k < sizes[i]; k += 4096) weights.at[i][k] = uint8_t(i + k);
        uint64_t padded = (sizes[i] + 255) / 256 * 256;
        if (!chunks.back().empty() && in_chunk + padded > chunk_bytes) chunks.emplace_back(), in_chunk = 0;
        chunks.back().push_back(t[i]);
        in_chunk += padded;
        bucket = std::max(bucket, (in_chunk + 4095) / 4096 * 4096);
        total += sizes[i];
    }
    Sync plain(bucket, false, "{\"verify\": false, \"copy_threads\": 1}");
    Sync threads(bucket, false, "{\"verify\": false}");
    Sync verified(bucket, true, "{\"verify\": true}");
    Sync verified_one(bucket, true, "{\"verify\": true, \"copy_threads\": 1}");
    Arena at_offset(sizes, dst_offset), at_page(sizes, 0);

    // One pass: the whole model through `s`, timing only the loader's copies.
    auto pass = [&](Sync &s, Mode m, Arena &dst) {
        double busy = 0;
        size_t first = 0;
        for (size_t c = 0; c < chunks.size(); ++c) {
            wsync_chunk_t ch{chunks[c].data(), chunks[c].size(),
                             c + 1 == chunks.size() ? WSYNC_CHUNK_LAST : 0u, 0};
            wsync_blob_t req;
            must(wsync_sender_send_chunk(s.sender, &ch, &req), "send");
            wsync_recv_t *it;
            must(wsync_receiver_receive(s.receiver, req.data, req.size, &it), "receive");
            wsync_blob_free(&req);
            auto t0 = Clock::now();
            for (size_t i = 0; i < chunks[c].size(); ++i) {
                uint8_t *d = dst.at[first + i];
                uint64_t n = sizes[first + i];
                if (m == kMemcpy || m == kNextVerifiedMemcpy) {
                    wsync_tensor_t v;
                    bool has;
                    must(wsync_recv_next(it, &v, &has), "next");
                    std::memcpy(d, v.data, n);
                } else {
                    must(wsync_recv_copy(it, i, 0, d, n), "copy");
                }
            }
            busy += std::chrono::duration<double>(Clock::now() - t0).count();
            must(wsync_recv_end(it), "end");
            must(wsync_sender_flush(s.sender, 60000), "flush");
            first += chunks[c].size();
        }
        return total / busy / 1e9;
    };

    constexpr int kReps = 3;
    std::vector<double> gbps[2][kModes];
    for (int rep = 0; rep < kReps; ++rep)
        for (int o = 0; o < 2; ++o)
            for (int m = 0; m < kModes; ++m) {
                Sync &s = m == kCopyThreads       ? threads
                          : m == kCopyVerifiedOne ? verified_one
                          : m >= kCopyVerified    ? verified
                                                  : plain;
                gbps[o][m].push_back(pass(s, Mode(m), o == 0 ? at_offset : at_page));
            }
    double med[2][kModes];
    for (int o = 0; o < 2; ++o)
        for (int m = 0; m < kModes; ++m) {
            auto v = gbps[o][m];
            std::sort(v.begin(), v.end());
            med[o][m] = v[v.size() / 2];
        }
    auto object = [&](int o) {
        std::string j = "{";
        for (int m = 0; m < kModes; ++m) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "%s\"%s_gbps\": %.3f", m ? ", " : "", kModeNames[m],
                          med[o][m]);
            j += buf;
        }
        return j + "}";
    };
    char ratios[512];
    std::snprintf(ratios, sizeof ratios,
                  "{\"copy_at_offset_over_memcpy_page\": %.3f, "
                  "\"copy_at_offset_over_memcpy_at_offset\": %.3f, "
                  "\"memcpy_at_offset_over_memcpy_page\": %.3f, "
                  "\"copy_verified_over_copy\": %.3f, "
                  "\"copy_verified_over_next_verified_memcpy\": %.3f, "
                  "\"copy_verified_over_one_thread\": %.3f}",
                  med[0][kCopy] / med[1][kMemcpy], med[0][kCopy] / med[0][kMemcpy],
                  med[0][kMemcpy] / med[1][kMemcpy], med[0][kCopyVerified] / med[0][kCopy],
                  med[0][kCopyVerified] / med[0][kNextVerifiedMemcpy],
                  med[0][kCopyVerified] / med[0][kCopyVerifiedOne]);
    if (progress) {
        std::printf("\nreceiver copy, GB/s (median of %d; model %.1f MB)\n", kReps, total / 1e6);
        std::printf("%-24s %14s %14s\n", "", ("dst page+" + std::to_string(dst_offset)).c_str(),
                    "page-aligned");
        for (int m = 0; m < kModes; ++m)
            std::printf("%-24s %14.2f %14.2f\n", kModeNames[m], med[0][m], med[1][m]);
    }
    return "{\"dst_offset\": " + std::to_string(dst_offset) + ", \"reps\": " +
           std::to_string(kReps) + ", \"at_dst_offset\": " + object(0) +
           ", \"page_aligned\": " + object(1) + ", \"ratios\": " + ratios + "}";
}
