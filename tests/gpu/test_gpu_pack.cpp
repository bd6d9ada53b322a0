// How gpu::Packer moves a chunk's copies (src/gpu/pack.hpp), as a specification: plain copies
// of WSYNC_APPLY_DRIVER_COPY_MIN bytes or more go by the driver's device copy, one each (never
// joined with a neighbour in another allocation), casts and small copies by one kernel launch;
// whatever the split, every destination holds its source's bytes. CTest runs it against the fake driver (label
// gpu-fake: the split, counted by the fake) and the machine's driver (label gpu: the bytes on
// hardware; skips with the reason where there is no usable driver).
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "error.hpp"
#include "gpu/api.hpp"
#include "gpu/device.hpp"
#include "gpu/pack.hpp"
#include "whitebox.hpp"

extern "C" {
#include "fake_gpu/fake_gpu.h"
}

using namespace wsync;
using gpu::CUdeviceptr;
using gpu::PackEntry;

namespace {

struct Gpu {
    const gpu::CudaApi *api = nullptr;
    std::unique_ptr<gpu::Device> dev;
    std::unique_ptr<gpu::Stream> stream;
    std::string why;
    wsync_fake_stats_fn stats = nullptr;  // the fake's counters, when the driver is the fake
    int (*adjacent)(unsigned long long *, size_t, size_t) = nullptr;  // the fake's neighbours
};
Gpu *g = nullptr;

#define NEED_GPU()                                          \
    do {                                                    \
        if (!g->api) {                                      \
            print_message("skipped: %s\n", g->why.c_str()); \
            skip();                                         \
        }                                                   \
    } while (0)

struct Buffer {
    CUdeviceptr ptr = 0;
    explicit Buffer(uint64_t n) {
        gpu::Device::Scope scope(*g->dev);
        assert_int_equal(g->api->cuMemAlloc(&ptr, n), 0);
    }
    ~Buffer() {
        gpu::Device::Scope scope(*g->dev);
        g->api->cuMemFree(ptr);
    }
};

void put(CUdeviceptr dst, const std::vector<uint8_t> &bytes) {
    gpu::Device::Scope scope(*g->dev);
    assert_int_equal(g->api->cuMemcpyHtoDAsync(dst, bytes.data(), bytes.size(), g->stream->get()), 0);
    gpu::poll_until([&] { return g->api->cuStreamQuery(g->stream->get()) == gpu::CUDA_SUCCESS; },
                    sys::Deadline(60000), "upload");
}

std::vector<uint8_t> get(CUdeviceptr src, uint64_t n) {
    std::vector<uint8_t> out(n);
    gpu::Device::Scope scope(*g->dev);
    assert_int_equal(g->api->cuMemcpyDtoHAsync(out.data(), src, n, g->stream->get()), 0);
    gpu::poll_until([&] { return g->api->cuStreamQuery(g->stream->get()) == gpu::CUDA_SUCCESS; },
                    sys::Deadline(60000), "download");
    return out;
}

std::vector<uint8_t> pattern(uint64_t n, unsigned seed) {
    std::vector<uint8_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 2654435761u >> 7) ^ seed);
    return v;
}

struct wsync_fake_stats counters() {
    struct wsync_fake_stats s;
    std::memset(&s, 0, sizeof s);
    if (g->stats) g->stats(&s);
    return s;
}

// Two 4 MiB tensors in neighbouring allocations (back to back in the address space, as
// cuMemAlloc can place them), copied into one destination side by side, and a small one: two
// driver copies, never one across the allocations (the H200 driver refused that copy with
// CUDA_ERROR_INVALID_VALUE, 2026-12-04), and one launch for the small one.
void neighbouring_allocations_are_never_one_driver_copy(void **) {
    NEED_GPU();
    const uint64_t big = uint64_t(4) << 20, small = 4096;
    CUdeviceptr a = 0, b = 0;
    {
        gpu::Device::Scope scope(*g->dev);
        if (g->adjacent) {  // the fake: two allocations back to back
            assert_int_equal(g->adjacent(&a, 2 * big, big), 0);
            b = a + big;
        } else {
            assert_int_equal(g->api->cuMemAlloc(&a, big), 0);
            assert_int_equal(g->api->cuMemAlloc(&b, big), 0);
        }
    }
    Buffer dst(2 * big + 65536);
    const auto one = pattern(big, 7), two = pattern(big, 9), tail = pattern(small, 11);
    put(a, one);
    put(b, two);
    put(b + big - small, tail);
    std::vector<PackEntry> entries = {
        {a, dst.ptr, big, gpu::kPackCopy, 0},
        {b, dst.ptr + big, big, gpu::kPackCopy, 0},
        {b + big - small, dst.ptr + 2 * big + 8192, small, gpu::kPackCopy, 0},
    };
    gpu::Packer packer(*g->dev);
    const struct wsync_fake_stats before = counters();
    const gpu::Packer::Queued q = packer.pack(entries, g->stream->get());
    assert_int_equal(q.driver_copies, 2);
    assert_int_equal(q.launches, 1);
    const auto got = get(dst.ptr, 2 * big + 8192 + small);
    assert_memory_equal(got.data(), one.data(), big);
    assert_memory_equal(got.data() + big, two.data(), big - small);
    assert_memory_equal(got.data() + 2 * big + 8192, tail.data(), small);
    if (g->stats) {
        const struct wsync_fake_stats after = counters();
        assert_int_equal(after.kernel_launches - before.kernel_launches, 1);
        // the two driver copies, the kernel's entry table, and the download above
        assert_int_equal(after.memcpy_calls - before.memcpy_calls, 4);
    }
    gpu::Device::Scope scope(*g->dev);
    g->api->cuMemFree(a);
    g->api->cuMemFree(b);
}

// Below the threshold plain copies and casts share one launch, whatever their neighbours.
void small_copies_and_casts_share_one_launch(void **) {
    NEED_GPU();
    const uint64_t n = 64 * 1024;
    Buffer src(8 * n), dst(8 * n);
    const auto bytes = pattern(8 * n, 3);
    put(src.ptr, bytes);
    std::vector<PackEntry> entries = {
        {src.ptr, dst.ptr, n, gpu::kPackCopy, 0},
        {src.ptr + n, dst.ptr + 2 * n, n, gpu::kPackCopy, 0},          // source continues, not dst
        {src.ptr + 4 * n, dst.ptr + 3 * n, n, gpu::kPackCopy, 0},      // dst continues, not source
        {src.ptr + 5 * n, dst.ptr + 4 * n, n / 4, gpu::kPackF32ToBf16, 0},  // a cast: never joined
    };
    gpu::Packer packer(*g->dev);
    const gpu::Packer::Queued q = packer.pack(entries, g->stream->get());
    assert_int_equal(q.driver_copies, 0);
    assert_int_equal(q.launches, 1);
    const auto got = get(dst.ptr, 4 * n);
    assert_memory_equal(got.data(), bytes.data(), n);
    assert_memory_equal(got.data() + 2 * n, bytes.data() + n, n);
    assert_memory_equal(got.data() + 3 * n, bytes.data() + 4 * n, n);
}

int setup(void **) {
    g = new Gpu;
    const std::string reason = gpu::cuda_unavailable_reason();
    if (!reason.empty()) {
        g->why = "no usable CUDA driver: " + reason;
        return 0;
    }
    try {
        g->api = &gpu::cuda();
        int count = 0;
        if (g->api->cuDeviceGetCount(&count) != 0 || count < 1) {
            g->api = nullptr;
            g->why = "no GPU";
            return 0;
        }
        g->dev.reset(new gpu::Device(*g->api, 0, "test_gpu_pack"));
        g->stream.reset(new gpu::Stream(*g->dev));
    } catch (const Error &e) {
        g->api = nullptr;
        g->why = e.what();
        return 0;
    }
    if (const char *path = std::getenv("WSYNC_CUDA_LIBRARY"))
        if (void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD))
        {
            g->stats = reinterpret_cast<wsync_fake_stats_fn>(dlsym(h, "wsync_fake_stats"));
            g->adjacent = reinterpret_cast<int (*)(unsigned long long *, size_t, size_t)>(
                dlsym(h, "wsync_fake_mem_alloc_adjacent"));
        }
    return 0;
}

int teardown(void **) {
    if (g) {
        g->stream.reset();
        g->dev.reset();
        delete g;
        g = nullptr;
    }
    return 0;
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(neighbouring_allocations_are_never_one_driver_copy),
        cmocka_unit_test(small_copies_and_casts_share_one_launch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
