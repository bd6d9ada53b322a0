// The pack kernel against the driver's own device copy of the same bytes, in one run on one GPU
// (and the library's hybrid: copies of 4 MiB or more by the driver, the rest by the kernel):
// a Llama-shaped chunk (the nine tensors of one 8B decoder layer, bf16, 0.4 GiB; --layers N
// packs N layers in one launch) packed into a bucket with Packer::pack, and the same bytes moved
// by one cuMemcpyDtoDAsync. Prints one JSON line: each one's seconds (median of --reps after a
// warm-up) and the ratio, so docs/gpu-validation.md records whether packing runs at device-copy
// speed. Packed bytes are then compared with the sources (the first and last 4 KiB of every
// tensor, read back through the driver), and the run fails if any differ.
//   pack_bench [--layers N] [--reps N]       (scripts/gpu-validate.sh runs it)
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "error.hpp"
#include "gpu/device.hpp"
#include "gpu/pack.hpp"
#include "bench_util.hpp"

using namespace wsync;
using namespace wsync::gpu;

using bench::drain;
using bench::now;

int main(int argc, char **argv) {
    int layers = 1, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else { std::fprintf(stderr, "usage: pack_bench [--layers N] [--reps N]\n"); return 2; }
    }
    try {
        const CudaApi &api = cuda();
        Device dev(api, 0, "pack_bench");
        Device::Scope scope(dev);
        // One 8B decoder layer: q, k, v, o, gate, up, down, two norms (elements).
        const uint64_t h = 4096, kv = 1024, inter = 14336;
        std::vector<uint64_t> elems;
        for (int l = 0; l < layers; ++l)
            for (uint64_t n : {h * h, kv * h, kv * h, h * h, inter * h, inter * h, h * inter, h, h})
                elems.push_back(n);
        std::vector<DeviceBuffer> src;
        std::vector<PackEntry> entries;
        uint64_t total = 0;
        for (uint64_t n : elems) total += (n * 2 + 255) / 256 * 256;
        DeviceBuffer bucket(dev, total, "bucket"), flat_src(dev, total, "copy source");
        uint64_t off = 0, tile = 0;
        for (uint64_t n : elems) {
            src.emplace_back(dev, n * 2, "tensor");
            std::vector<uint16_t> host(n);
            for (uint64_t i = 0; i < n; ++i) host[i] = uint16_t(i * 2654435761u >> 7) ^ uint16_t(src.size());
            WSYNC_CU(api, cuMemcpyHtoDAsync(src.back().ptr(), host.data(), n * 2, nullptr), "fill");
            drain(dev, nullptr);
            PackEntry e{src.back().ptr(), bucket.ptr() + off, n * 2, kPackCopy, uint32_t(tile)};
            tile += pack_tiles(e);
            entries.push_back(e);
            off += (n * 2 + 255) / 256 * 256;
        }
        Stream stream(dev);
        Packer packer(dev, UINT64_MAX);  // the kernel alone
        Packer hybrid(dev);              // as the library packs: large copies by the driver
        auto time_it = [&](auto &&work) {
            std::vector<double> t;
            for (int r = 0; r <= reps; ++r) {
                const double t0 = now();
                work();
                drain(dev, stream.get());
                if (r) t.push_back(now() - t0);  // the first is the warm-up
            }
            std::sort(t.begin(), t.end());
            return t[t.size() / 2];
        };
        const double pack_s = time_it([&] { packer.pack(entries, stream.get()); });
        const double hybrid_s = time_it([&] { hybrid.pack(entries, stream.get()); });
        const double copy_s = time_it([&] {
            WSYNC_CU(api, cuMemcpyDtoDAsync(bucket.ptr(), flat_src.ptr(), total, stream.get()), "copy");
        });
        // The library's driver table has no device-to-host copy; the driver's own is read here.
        const char *lib = std::getenv("WSYNC_CUDA_LIBRARY");
        void *drv = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        using DtoH = CUresult (*)(void *, CUdeviceptr, std::size_t);
        auto dtoh = drv ? reinterpret_cast<DtoH>(dlsym(drv, "cuMemcpyDtoH_v2")) : nullptr;
        if (!dtoh) { std::fprintf(stderr, "pack_bench: no cuMemcpyDtoH_v2\n"); return 1; }
        // Each way packs over other bytes (the plain copy's), then is read back.
        bool exact = true;
        for (Packer *p : {&packer, &hybrid}) {
            WSYNC_CU(api, cuMemcpyDtoDAsync(bucket.ptr(), flat_src.ptr(), total, stream.get()), "copy");
            p->pack(entries, stream.get());
            drain(dev, stream.get());
            for (std::size_t i = 0; i < entries.size() && exact; ++i) {
                const uint64_t n = entries[i].count, k = std::min<uint64_t>(n, 4096);
                std::vector<unsigned char> a(k), b(k);
                for (uint64_t at : {uint64_t(0), n - k}) {
                    exact = exact && dtoh(a.data(), entries[i].src + at, k) == CUDA_SUCCESS &&
                            dtoh(b.data(), entries[i].dst + at, k) == CUDA_SUCCESS && a == b;
                }
            }
        }
        std::printf("{\"bytes\": %llu, \"tensors\": %zu, \"tiles\": %llu, \"pack_s\": %.6f, "
                    "\"copy_s\": %.6f, \"pack_gbps\": %.1f, \"copy_gbps\": %.1f, "
                    "\"pack_to_copy\": %.3f, \"hybrid_s\": %.6f, \"hybrid_to_copy\": %.3f, "
                    "\"driver_copy_min\": %llu, \"exact\": %s}\n",
                    (unsigned long long)total, entries.size(), (unsigned long long)tile, pack_s,
                    copy_s, total / pack_s / 1e9, total / copy_s / 1e9, pack_s / copy_s, hybrid_s,
                    hybrid_s / copy_s, (unsigned long long)hybrid.driver_copy_min(),
                    exact ? "true" : "false");
        return exact ? 0 : 1;
    } catch (const Error &e) {
        std::fprintf(stderr, "pack_bench: %s\n", e.what());
        return 1;
    }
}
