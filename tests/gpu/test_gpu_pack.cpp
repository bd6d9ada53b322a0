// How gpu::Packer moves a chunk's copies (src/gpu/pack.hpp), as a specification: neighbours in
// both memories become one copy; plain copies of WSYNC_APPLY_DRIVER_COPY_MIN bytes or more go by
// the driver's device copy, casts and small copies by one kernel launch; whatever the split,
// every destination holds its source's bytes. CTest runs it against the fake driver (label
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

// Two 4 MiB tensors side by side in the source and in the destination, then a small one apart:
// one driver copy of 8 MiB, one launch for the small one.
void neighbours_in_both_memories_are_one_driver_copy(void **) {
    NEED_GPU();
    const uint64_t big = uint64_t(4) << 20, small = 4096;
    Buffer src(2 * big + 65536), dst(2 * big + 65536);
    const auto bytes = pattern(2 * big + 65536, 7);
    put(src.ptr, bytes);
    std::vector<PackEntry> entries = {
        {src.ptr, dst.ptr, big, gpu::kPackCopy, 0},
        {src.ptr + big, dst.ptr + big, big, gpu::kPackCopy, 0},
        {src.ptr + 2 * big + 4096, dst.ptr + 2 * big + 8192, small, gpu::kPackCopy, 0},
    };
    gpu::Packer packer(*g->dev);
    const struct wsync_fake_stats before = counters();
    const gpu::Packer::Queued q = packer.pack(entries, g->stream->get());
    assert_int_equal(q.driver_copies, 1);
    assert_int_equal(q.launches, 1);
    const auto got = get(dst.ptr, 2 * big + 8192 + small);
    assert_memory_equal(got.data(), bytes.data(), 2 * big);
    assert_memory_equal(got.data() + 2 * big + 8192, bytes.data() + 2 * big + 4096, small);
    if (g->stats) {
        const struct wsync_fake_stats after = counters();
        assert_int_equal(after.kernel_launches - before.kernel_launches, 1);
        // the 8 MiB copy, the kernel's entry table, and the download above
        assert_int_equal(after.memcpy_calls - before.memcpy_calls, 3);
    }
}

// Copies that continue each other in the source but not in the destination (or the reverse)
// stay apart; a cast never joins a copy; below the threshold everything is one launch.
void only_copies_contiguous_on_both_sides_join_and_small_ones_share_a_launch(void **) {
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
            g->stats = reinterpret_cast<wsync_fake_stats_fn>(dlsym(h, "wsync_fake_stats"));
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
        cmocka_unit_test(neighbours_in_both_memories_are_one_driver_copy),
        cmocka_unit_test(only_copies_contiguous_on_both_sides_join_and_small_ones_share_a_launch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
