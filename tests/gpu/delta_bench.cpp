// Delta sync's GPU kernels against one device copy of the same bytes, in one run on one GPU:
// the tensors of N Llama-8B decoder layers (bf16, 0.4 GiB a layer), with a fraction F of their
// elements changed, go through the trainer's compare + compaction (DeltaKernels::diff: count,
// hash, compact, with its waits), the engine's verified apply (DeltaKernels::apply: header
// check, base hash, scatter, result hash, each step gated on the device-side verdict, one
// wait) and the trainer's fold; the baseline is one cuMemcpyDtoDAsync of all the bytes, which
// is what a dense version costs on the device. The compare runs again with the bases in pinned
// host memory ("delta_base_memory": "pinned_host"), against one cuMemcpyHtoDAsync of all the
// bytes from pinned memory (the bus it reads them across), and must give the same patches.
// Prints one JSON line per F (median seconds of --reps after a warm-up, and ratios to the copy),
// then checks that the engine's tensors equal the trainer's (tree hashes on the device) and
// exits 1 if not.
//   delta_bench [--layers N] [--reps N] [--hidden 4096] [--fractions 0.001,0.01,0.05]
// (scripts/gpu-validate.sh runs it; CTest runs a small one against the fake driver.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "delta/delta.hpp"
#include "error.hpp"
#include "gpu/device.hpp"
#include "gpu/diff.hpp"
#include "bench_util.hpp"

using namespace wsync;
using namespace wsync::gpu;

using bench::drain;
using bench::now;

int main(int argc, char **argv) {
    int layers = 1, reps = 10;
    uint64_t hidden = 4096;  // Llama 8B; kv = hidden / 4, intermediate = hidden * 3.5
    std::vector<double> fractions = {0.001, 0.01, 0.05};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--hidden")) hidden = std::strtoull(argv[i + 1], nullptr, 10);
        else if (!std::strcmp(argv[i], "--fractions")) {
            fractions.clear();
            for (const char *p = argv[i + 1]; *p;) {
                char *end;
                fractions.push_back(std::strtod(p, &end));
                p = *end == ',' ? end + 1 : end;
                if (end == p && *p) break;
            }
        } else {
            std::fprintf(stderr, "usage: delta_bench [--layers N] [--reps N] [--hidden H] [--fractions F,...]\n");
            return 2;
        }
    }
    try {
        const CudaApi &api = cuda();
        Device dev(api, 0, "delta_bench");
        Device::Scope scope(dev);
        Stream stream(dev);
        DeltaKernels k(dev);
        const uint64_t h = hidden, kv = hidden / 4, inter = hidden * 7 / 2;
        std::vector<uint64_t> elems;
        for (int l = 0; l < layers; ++l)
            for (uint64_t n : {h * h, kv * h, kv * h, h * h, inter * h, inter * h, h * inter, h, h})
                elems.push_back(n);
        uint64_t total = 0;
        for (uint64_t n : elems) total += n * 2;
        std::vector<DeviceBuffer> base, next, engine;
        DeviceBuffer copy_src(dev, total, "copy source"), copy_dst(dev, total, "copy destination");
        DeviceBuffer pinned_src(dev, total, "pinned copy source", DeviceBuffer::Where::kPinnedHost);
        std::vector<DeviceBuffer> pinned_base;
        bool exact = true;
        for (double f : fractions) {
            base.clear(), next.clear(), engine.clear(), pinned_base.clear();
            std::vector<DeltaKernels::DiffJob> jobs;
            std::vector<uint64_t> base_hash;
            uint64_t seed = 1;
            for (uint64_t n : elems) {
                std::vector<uint16_t> b(n);
                for (uint64_t i = 0; i < n; ++i) b[i] = uint16_t((i * 2654435761u) >> 9) ^ uint16_t(seed);
                base.emplace_back(dev, n * 2, "base");
                pinned_base.emplace_back(dev, n * 2, "pinned base", DeviceBuffer::Where::kPinnedHost);
                WSYNC_CU(api, cuMemcpyHtoDAsync(pinned_base.back().ptr(), b.data(), n * 2, stream.get()), "fill");
                engine.emplace_back(dev, n * 2, "engine");
                WSYNC_CU(api, cuMemcpyHtoDAsync(base.back().ptr(), b.data(), n * 2, stream.get()), "fill");
                WSYNC_CU(api, cuMemcpyHtoDAsync(engine.back().ptr(), b.data(), n * 2, stream.get()), "fill");
                base_hash.push_back(delta::tree_hash(b.data(), n * 2));
                // About f of the elements change (a random walk of gaps with mean 1/f).
                const uint64_t mean = f > 0 ? std::max<uint64_t>(1, uint64_t(1 / f)) : 0;
                for (uint64_t i = 0; mean && i < n;) {
                    b[i] ^= 0x5a5a;
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    i += 1 + (seed >> 33) % (2 * mean);
                }
                next.emplace_back(dev, n * 2, "next");
                WSYNC_CU(api, cuMemcpyHtoDAsync(next.back().ptr(), b.data(), n * 2, stream.get()), "fill");
                jobs.push_back({next.back().ptr(), base.back().ptr(), n, 2, UINT64_MAX});
                drain(dev, stream.get());
            }
            auto median = [&](auto &&work, auto &&setup) {
                std::vector<double> t;
                for (int r = 0; r <= reps; ++r) {
                    setup();
                    drain(dev, stream.get());
                    const double t0 = now();
                    work();
                    drain(dev, stream.get());
                    if (r) t.push_back(now() - t0);
                }
                std::sort(t.begin(), t.end());
                return t[t.size() / 2];
            };
            std::vector<DeltaKernels::DiffOut> out;
            const double copy_s = median([&] {
                WSYNC_CU(api, cuMemcpyDtoDAsync(copy_dst.ptr(), copy_src.ptr(), total, stream.get()), "copy");
            }, [] {});
            const double h2d_s = median([&] {
                WSYNC_CU(api, cuMemcpyHtoDAsync(copy_dst.ptr(), pinned_src.host(), total, stream.get()),
                         "copy from pinned memory");
            }, [] {});
            // Bases in pinned host memory first (their patches are compared with the GPU's below).
            std::vector<DeltaKernels::DiffJob> pinned_jobs = jobs;
            for (std::size_t i = 0; i < jobs.size(); ++i) pinned_jobs[i].base = pinned_base[i].ptr();
            const double diff_pinned_s =
                median([&] { k.diff(pinned_jobs, stream.get(), sys::Deadline(600000), "bench", &out); }, [] {});
            std::vector<std::vector<uint8_t>> pinned_patches(out.size());
            for (std::size_t i = 0; i < out.size(); ++i) {
                pinned_patches[i].resize(out[i].nbytes);
                WSYNC_CU(api, cuMemcpyDtoHAsync(pinned_patches[i].data(), out[i].bytes, out[i].nbytes, stream.get()),
                         "read back");
            }
            const double diff_s = median([&] { k.diff(jobs, stream.get(), sys::Deadline(600000), "bench", &out); }, [] {});
            for (std::size_t i = 0; i < out.size(); ++i) {
                std::vector<uint8_t> p(out[i].nbytes);
                WSYNC_CU(api, cuMemcpyDtoHAsync(p.data(), out[i].bytes, out[i].nbytes, stream.get()), "read back");
                exact = exact && p == pinned_patches[i];
            }
            uint64_t changed = 0, patch_bytes = 0;
            std::vector<DeltaKernels::ApplyJob> apply;
            for (std::size_t i = 0; i < jobs.size(); ++i) {
                changed += out[i].changed;
                patch_bytes += out[i].nbytes;
                DeltaKernels::ApplyJob a;
                a.dst = engine[i].ptr();
                a.elements = jobs[i].elements;
                a.esize = 2;
                a.patch = out[i].bytes;
                a.nbytes = out[i].nbytes;
                a.base_hash = base_hash[i];
                a.result_hash = out[i].result_hash;
                a.label = "tensor 't" + std::to_string(i) + "'";
                apply.push_back(a);
            }
            // The apply is timed as an engine runs it (check, base hash, scatter, result hash,
            // three launches a tensor, one wait), each repetition onto the base again (the
            // engine's tensors copied back from the trainer's bases, untimed); the last one's
            // outcomes are checked.
            auto rebase = [&] {
                for (std::size_t i = 0; i < jobs.size(); ++i)
                    WSYNC_CU(api, cuMemcpyDtoDAsync(engine[i].ptr(), base[i].ptr(), jobs[i].elements * 2, stream.get()),
                             "rebase");
            };
            std::vector<DeltaKernels::ApplyOut> res;
            const double apply_s = median([&] { res = k.apply(apply, stream.get(), sys::Deadline(600000)); }, rebase);
            for (const auto &r : res) exact = exact && r.outcome == DeltaKernels::Outcome::kApplied;
            std::vector<DeltaKernels::FoldJob> fold;
            for (std::size_t i = 0; i < jobs.size(); ++i)
                fold.push_back({base[i].ptr(), jobs[i].elements, 2, out[i].bytes, out[i].changed, out[i].width});
            const double fold_s = median([&] { k.fold(fold, stream.get()); }, [] {});
            std::vector<DeviceRange> e, t;
            for (std::size_t i = 0; i < jobs.size(); ++i) {
                e.push_back({engine[i].ptr(), jobs[i].elements * 2});
                t.push_back({next[i].ptr(), jobs[i].elements * 2});
            }
            const double hash_s = median([&] { k.tree_hashes(e, stream.get(), sys::Deadline(600000), "bench"); }, [] {});
            exact = exact && k.tree_hashes(e, stream.get(), sys::Deadline(600000), "bench") ==
                                 k.tree_hashes(t, stream.get(), sys::Deadline(600000), "bench");
            std::vector<DeviceRange> b;
            for (std::size_t i = 0; i < jobs.size(); ++i) b.push_back({base[i].ptr(), jobs[i].elements * 2});
            exact = exact && k.tree_hashes(b, stream.get(), sys::Deadline(600000), "bench") ==
                                 k.tree_hashes(t, stream.get(), sys::Deadline(600000), "bench");
            std::printf("{\"fraction\": %g, \"bytes\": %llu, \"tensors\": %zu, \"changed\": %llu, "
                        "\"patch_bytes\": %llu, \"copy_s\": %.6f, \"diff_s\": %.6f, "
                        "\"apply_s\": %.6f, \"fold_s\": %.6f, \"hash_s\": %.6f, "
                        "\"diff_to_copy\": %.3f, \"apply_to_copy\": %.3f, \"hash_gbps\": %.1f, "
                        "\"h2d_s\": %.6f, \"diff_pinned_s\": %.6f, \"diff_pinned_to_h2d\": %.3f, "
                        "\"exact\": %s}\n",
                        f, (unsigned long long)total, jobs.size(), (unsigned long long)changed,
                        (unsigned long long)patch_bytes, copy_s, diff_s, apply_s, fold_s, hash_s,
                        diff_s / copy_s, apply_s / copy_s, total / hash_s / 1e9, h2d_s, diff_pinned_s,
                        diff_pinned_s / h2d_s, exact ? "true" : "false");
            std::fflush(stdout);
        }
        return exact ? 0 : 1;
    } catch (const Error &e) {
        std::fprintf(stderr, "delta_bench: %s\n", e.what());
        return 1;
    }
}
