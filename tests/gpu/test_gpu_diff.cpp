// The GPU side of delta sync (src/gpu/diff.hpp, kernels in src/gpu/kernels/delta.cu), as a
// specification: tree hashes of device memory equal the host's; a patch the GPU makes is byte
// for byte the patch the host encoder makes of the same tensors; a fold makes the base the new
// version; the verified apply writes a patch only onto its base and only to its result, and
// leaves a destination as it was otherwise; a malformed patch is refused naming the tensor and
// the index; a failed launch or a stuck stream ends in a named error within the deadline.
//
// CTest runs it against the fake driver (label gpu-fake: the launch logic, with the kernels
// emulated from their ABI) and against the machine's driver (label gpu: the kernels' numerics
// on hardware; every test skips with the reason where there is no usable driver).
// scripts/gpu-validate.sh runs the latter.
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "delta/delta.hpp"
#include "error.hpp"
#include "gpu/api.hpp"
#include "gpu/device.hpp"
#include "gpu/diff.hpp"
#include "sys.hpp"
#include "whitebox.hpp"
#include "fake_gpu/fake_gpu.h"

using namespace wsync;
using gpu::CUdeviceptr;
using gpu::DeltaKernels;

namespace {

struct Gpu {
    const gpu::CudaApi *api = nullptr;
    std::unique_ptr<gpu::Device> dev;
    std::unique_ptr<gpu::Stream> stream;
    std::unique_ptr<DeltaKernels> kernels;
    std::string why;
};
Gpu *g = nullptr;

// The fake driver's test hooks, when the driver is the fake.
typedef void (*set_fail_fn)(const char *, int, int);
typedef int (*hold_fn)(void *);
typedef void (*release_fn)(void);
set_fail_fn fake_set_fail = nullptr;
hold_fn fake_hold = nullptr;
release_fn fake_release = nullptr;
wsync_fake_stats_fn fake_stats = nullptr;

#define NEED_GPU()                                           \
    do {                                                     \
        if (!g->api) {                                       \
            print_message("skipped: %s\n", g->why.c_str());  \
            skip();                                          \
        }                                                    \
    } while (0)

const sys::Deadline long_deadline() { return sys::Deadline(60000); }

// Device memory holding `bytes` (plus `pad` bytes in front, so a range can start unaligned).
struct DevBytes {
    gpu::DeviceBuffer buf;
    CUdeviceptr ptr = 0;
    uint64_t size = 0;
};
DevBytes to_device(const std::vector<uint8_t> &bytes, uint64_t pad = 0) {
    DevBytes d;
    d.buf = gpu::DeviceBuffer(*g->dev, bytes.size() + pad + 64, "test");
    d.ptr = d.buf.ptr() + pad;
    d.size = bytes.size();
    gpu::Device::Scope s(*g->dev);
    if (!bytes.empty())
        assert_int_equal(g->api->cuMemcpyHtoDAsync(d.ptr, bytes.data(), bytes.size(), g->stream->get()), 0);
    return d;
}
void sync_stream() {
    gpu::Event e(*g->dev);
    gpu::Device::Scope s(*g->dev);
    e.record(g->stream->get());
    gpu::poll_until([&] { return e.done(); }, sys::Deadline(60000), "test sync");
}
std::vector<uint8_t> from_device(CUdeviceptr p, uint64_t n) {
    sync_stream();
    std::vector<uint8_t> out(n);
    gpu::Device::Scope s(*g->dev);
    if (n) assert_int_equal(g->api->cuMemcpyDtoHAsync(out.data(), p, n, g->stream->get()), 0);
    return out;
}

// `n` elements of esize bytes, and a copy with about `fraction` of them changed (including
// the first and last element when fraction > 0, NaN payloads and signed zeros for floats).
std::vector<uint8_t> changed_copy(const std::vector<uint8_t> &base, size_t esize, double fraction,
                                  uint64_t seed) {
    std::vector<uint8_t> now = base;
    const size_t n = base.size() / esize;
    if (fraction <= 0 || n == 0) return now;
    std::vector<uint8_t> r = noise(n * 4, seed);
    auto flip = [&](size_t e) { now[e * esize + (e % esize)] ^= uint8_t(1 + (e & 0x7f)); };
    flip(0);
    flip(n - 1);
    for (size_t e = 0; e < n; ++e) {
        uint32_t v;
        std::memcpy(&v, r.data() + 4 * e, 4);
        if (double(v) / 4294967296.0 < fraction) flip(e);
    }
    return now;
}

std::vector<uint8_t> host_patch(const std::vector<uint8_t> &base, const std::vector<uint8_t> &now,
                                size_t esize, uint64_t *count) {
    delta::Changes ch;
    uint64_t hash = 0;
    std::vector<uint8_t> scratch = base;
    assert_true(delta::find_changes(now.data(), scratch.data(), now.size(), esize, UINT64_MAX, nullptr, ch, &hash));
    std::vector<uint8_t> patch;
    delta::encode(ch, now.size() / esize, patch);
    *count = ch.count;
    return patch;
}

template <class F>
void expect_error(F f, wsync_status_t status, const char *needle) {
    try {
        f();
    } catch (const Error &e) {
        if (e.status() != status || !std::strstr(e.what(), needle)) {
            print_message("got status %d: %s (wanted %d with \"%s\")\n", int(e.status()), e.what(),
                          int(status), needle);
            fail();
        }
        return;
    }
    print_message("no error (wanted \"%s\")\n", needle);
    fail();
}

// ---------------------------------------------------------------------------------------------
void tree_hashes_of_device_memory_equal_the_host_tree_hash(void **) {
    NEED_GPU();
    const uint64_t sizes[] = {0, 1, 100, 240, 241, 65535, 65536, 65537, 3 * 65536 + 17, (1u << 20) + 5};
    std::vector<DevBytes> held;
    std::vector<gpu::DeviceRange> ranges;
    std::vector<uint64_t> want;
    uint64_t seed = 1;
    for (uint64_t n : sizes) {
        for (uint64_t pad : {0, 3}) {  // 8-byte aligned and not: the kernel's two load paths
            std::vector<uint8_t> b = noise(n, seed++);
            held.push_back(to_device(b, pad));
            ranges.push_back({held.back().ptr, n});
            want.push_back(delta::tree_hash(b.data(), n));
        }
    }
    const std::vector<uint64_t> got = g->kernels->tree_hashes(ranges, g->stream->get(), long_deadline(), "test");
    assert_int_equal(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
        if (got[i] != want[i]) print_message("range %zu (%llu bytes) differs\n", i, (unsigned long long)ranges[i].bytes);
        assert_true(got[i] == want[i]);
    }
    // The tree hash of one piece is the XXH3 of that piece's hash, not of the bytes.
    std::vector<uint8_t> one = noise(1000, 7);
    const uint64_t h = XXH3_64bits(one.data(), one.size());
    assert_true(delta::tree_hash(one.data(), one.size()) == XXH3_64bits(&h, 8));
}

void a_gpu_patch_is_the_host_encoders_patch_byte_for_byte(void **) {
    NEED_GPU();
    // Several tensors in one call: every element size, densities from none to all, lengths that
    // end inside a thread's slice, inside a tile, and on a tile's edge (8192 elements).
    struct Case {
        size_t esize;
        size_t elements;
        double fraction;
    };
    const Case cases[] = {{2, 8192 * 3 + 77, 0.01}, {2, 8192, 0.0}, {1, 100000, 0.3}, {4, 31, 1.0},
                          {8, 8192 * 2, 0.001},     {2, 1, 1.0},    {4, 50000, 0.05}, {2, 3 * 8192 + 1, 1.0},
                          {8, 4097, 0.2},           {1, 7, 0.0}};
    std::vector<std::vector<uint8_t>> bases, nows;
    std::vector<DevBytes> held;
    std::vector<DeltaKernels::DiffJob> jobs;
    uint64_t seed = 11;
    for (const Case &c : cases) {
        bases.push_back(noise(c.elements * c.esize, seed++));
        nows.push_back(changed_copy(bases.back(), c.esize, c.fraction, seed++));
        held.push_back(to_device(nows.back()));
        const CUdeviceptr now = held.back().ptr;
        held.push_back(to_device(bases.back()));
        jobs.push_back({now, held.back().ptr, c.elements, uint32_t(c.esize), UINT64_MAX});
    }
    std::vector<DeltaKernels::DiffOut> out;
    g->kernels->diff(jobs, g->stream->get(), long_deadline(), "test", &out);
    assert_int_equal(out.size(), jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
        uint64_t count = 0;
        const std::vector<uint8_t> want = host_patch(bases[i], nows[i], cases[i].esize, &count);
        assert_true(out[i].patch);
        assert_int_equal(out[i].changed, count);
        assert_int_equal(out[i].width, 4);
        assert_int_equal(out[i].nbytes, want.size());
        assert_true(out[i].bytes % 8 == 0);
        assert_true(out[i].result_hash == delta::tree_hash(nows[i].data(), nows[i].size()));
        const std::vector<uint8_t> got = from_device(out[i].bytes, out[i].nbytes);
        if (got != want) print_message("case %zu: the GPU patch differs from the host's\n", i);
        assert_true(got == want);
    }
}

// The compare reads 16-byte vectors when now and base are both 16-byte aligned, element by
// element otherwise (a vector load off its boundary faults, and the fake refuses it as the GPU
// does) and for the elements of a vector the tensor ends in: at every element size, for lengths
// that end inside a lane's vector, a warp's 1024 elements and a tile, with now and base at every
// combination of aligned, equally misaligned and differently misaligned, the patch is the host
// encoder's byte for byte.
void a_gpu_patch_is_exact_at_every_element_size_length_and_alignment(void **) {
    NEED_GPU();
    std::vector<std::vector<uint8_t>> bases, nows;
    std::vector<size_t> esizes;
    std::vector<DevBytes> held;
    std::vector<DeltaKernels::DiffJob> jobs;
    uint64_t seed = 301;
    for (size_t esize : {1, 2, 4, 8}) {
        for (size_t elements : {size_t(1), size_t(16 / esize) + 1, size_t(1023), size_t(1025), size_t(8192 + 3)}) {
            // (now's, base's) distance from a 16-byte boundary, in elements.
            for (std::pair<size_t, size_t> pad : {std::pair<size_t, size_t>{0, 0}, {1, 1}, {0, 1}, {1, 0}}) {
                const double fraction = elements % 2 ? 0.05 : 1.0;
                bases.push_back(noise(elements * esize, seed++));
                nows.push_back(changed_copy(bases.back(), esize, fraction, seed++));
                esizes.push_back(esize);
                held.push_back(to_device(nows.back(), pad.first * esize));
                const CUdeviceptr now = held.back().ptr;
                held.push_back(to_device(bases.back(), pad.second * esize));
                jobs.push_back({now, held.back().ptr, elements, uint32_t(esize), UINT64_MAX});
            }
        }
    }
    std::vector<DeltaKernels::DiffOut> out;
    g->kernels->diff(jobs, g->stream->get(), long_deadline(), "test", &out);
    for (size_t i = 0; i < jobs.size(); ++i) {
        uint64_t count = 0;
        const std::vector<uint8_t> want = host_patch(bases[i], nows[i], esizes[i], &count);
        assert_true(out[i].patch);
        assert_int_equal(out[i].changed, count);
        const std::vector<uint8_t> got = from_device(out[i].bytes, out[i].nbytes);
        if (got != want)
            print_message("job %zu (esize %zu, %llu elements, now at %llu, base at %llu mod 16) differs\n", i,
                          esizes[i], (unsigned long long)jobs[i].elements, (unsigned long long)(jobs[i].now % 16),
                          (unsigned long long)(jobs[i].base % 16));
        assert_true(got == want);
    }
}

void a_tensor_over_its_limit_gets_no_patch_and_an_empty_one_goes_dense(void **) {
    NEED_GPU();
    std::vector<uint8_t> base = noise(2 * 20000, 21), now = changed_copy(base, 2, 0.01, 22);
    uint64_t count = 0;
    host_patch(base, now, 2, &count);
    assert_true(count > 10);
    DevBytes n = to_device(now), b = to_device(base), e1 = to_device({}), e2 = to_device({});
    std::vector<DeltaKernels::DiffJob> jobs = {{n.ptr, b.ptr, 20000, 2, count - 1},
                                               {n.ptr, b.ptr, 20000, 2, count},
                                               {e1.ptr, e2.ptr, 0, 2, UINT64_MAX}};
    std::vector<DeltaKernels::DiffOut> out;
    g->kernels->diff(jobs, g->stream->get(), long_deadline(), "test", &out);
    assert_false(out[0].patch);
    assert_int_equal(out[0].changed, count);  // counted exactly, even when over the limit
    assert_true(out[0].result_hash == delta::tree_hash(now.data(), now.size()));
    assert_true(out[1].patch);
    assert_false(out[2].patch);
    assert_true(out[2].result_hash == delta::tree_hash(nullptr, 0));
    // Sizes and alignments the kernels do not take are refused by name, before any launch.
    expect_error([&] {
        std::vector<DeltaKernels::DiffJob> bad = {{n.ptr, b.ptr, 100, 3, UINT64_MAX}};
        g->kernels->diff(bad, g->stream->get(), long_deadline(), "chunk 4", &out);
    }, WSYNC_ERR_INVALID_ARGUMENT, "chunk 4: tensor 0 (elements of 3 bytes");
    expect_error([&] {
        std::vector<DeltaKernels::DiffJob> bad = {{n.ptr + 2, b.ptr, 100, 4, UINT64_MAX}};
        g->kernels->diff(bad, g->stream->get(), long_deadline(), "chunk 5", &out);
    }, WSYNC_ERR_INVALID_ARGUMENT, "aligned to their size");
}

void a_fold_makes_the_base_the_new_version(void **) {
    NEED_GPU();
    std::vector<uint8_t> base = noise(4 * 70000, 31), now = changed_copy(base, 4, 0.02, 32);
    DevBytes n = to_device(now), b = to_device(base);
    std::vector<DeltaKernels::DiffOut> out;
    g->kernels->diff({{n.ptr, b.ptr, 70000, 4, UINT64_MAX}}, g->stream->get(), long_deadline(), "test", &out);
    g->kernels->fold({{b.ptr, 70000, 4, out[0].bytes, out[0].changed, out[0].width}}, g->stream->get());
    assert_true(from_device(b.ptr, base.size()) == now);
}

// "delta_base_memory": "pinned_host": a base in pinned host memory, which the kernels reach
// through its device mapping, gives the same patch as one on the GPU, and folds the same.
void a_base_in_pinned_host_memory_diffs_and_folds_as_one_on_the_gpu(void **) {
    NEED_GPU();
    const size_t E = 50000;
    std::vector<uint8_t> base = noise(2 * E, 81), now = changed_copy(base, 2, 0.01, 82);
    DevBytes n = to_device(now), on_gpu = to_device(base);
    gpu::DeviceBuffer pinned(*g->dev, base.size(), "test base", gpu::DeviceBuffer::Where::kPinnedHost);
    {
        gpu::Device::Scope sc(*g->dev);
        assert_int_equal(g->api->cuMemcpyHtoDAsync(pinned.ptr(), base.data(), base.size(), g->stream->get()), 0);
    }
    std::vector<DeltaKernels::DiffOut> a, b;
    g->kernels->diff({{n.ptr, on_gpu.ptr, E, 2, UINT64_MAX}}, g->stream->get(), long_deadline(), "gpu", &a);
    const std::vector<uint8_t> pa = from_device(a[0].bytes, a[0].nbytes);
    g->kernels->diff({{n.ptr, pinned.ptr(), E, 2, UINT64_MAX}}, g->stream->get(), long_deadline(), "pinned", &b);
    const std::vector<uint8_t> pb = from_device(b[0].bytes, b[0].nbytes);
    assert_true(pa == pb);
    assert_true(a[0].changed > 0 && a[0].result_hash == b[0].result_hash);
    g->kernels->fold({{pinned.ptr(), E, 2, b[0].bytes, b[0].changed, b[0].width}}, g->stream->get());
    assert_true(from_device(pinned.ptr(), now.size()) == now);
}

// Uploads a host-made patch (its bytes) and returns the job that applies it onto `dst`.
DeltaKernels::ApplyJob apply_job(const DevBytes &dst, size_t elements, size_t esize,
                                 const DevBytes &patch, uint64_t base_hash, uint64_t result_hash,
                                 const char *name) {
    DeltaKernels::ApplyJob j;
    j.dst = dst.ptr;
    j.elements = elements;
    j.esize = uint32_t(esize);
    j.patch = patch.ptr;
    j.nbytes = patch.size;
    j.base_hash = base_hash;
    j.result_hash = result_hash;
    j.label = std::string("tensor '") + name + "'";
    return j;
}

void the_apply_writes_a_patch_only_onto_its_base_and_only_to_its_result(void **) {
    NEED_GPU();
    const size_t E = 30000;
    std::vector<uint8_t> base = noise(2 * E, 41), now = changed_copy(base, 2, 0.01, 42);
    uint64_t count = 0;
    const std::vector<uint8_t> patch = host_patch(base, now, 2, &count);
    const uint64_t hb = delta::tree_hash(base.data(), base.size()), hr = delta::tree_hash(now.data(), now.size());
    // Patches with defects the receiver must find on its own.
    std::vector<uint8_t> swapped = patch, outside = patch, garbage = patch;
    // Headers of the right length that lie about one field each: element size, element
    // count, change count (swapped with the padding rule, the length still fits), coding.
    std::vector<uint8_t> bad_esize = patch, bad_elements = patch, bad_count = patch, gaps = patch;
    bad_esize[8] = 4;
    bad_elements[24] ^= 1;
    bad_count[16] ^= 1;
    gaps[4] = 1;
    std::memcpy(swapped.data() + 32, patch.data() + 36, 4);  // indices 0 and 1 swapped
    std::memcpy(swapped.data() + 36, patch.data() + 32, 4);
    const uint32_t past = uint32_t(E);
    std::memcpy(outside.data() + 32 + 4 * (count - 1), &past, 4);  // the last index past the end
    garbage[0] = 'X';
    std::vector<uint8_t> touched = base;
    touched[2 * 123] ^= 1;  // an engine that changed its copy

    DevBytes p = to_device(patch), ps = to_device(swapped), po = to_device(outside), pg = to_device(garbage);
    DevBytes good = to_device(base), wrong_base = to_device(touched), wrong_result = to_device(base),
             d_swapped = to_device(base), d_outside = to_device(base), d_garbage = to_device(base),
             d_short = to_device(base);
    DevBytes short_patch = to_device(std::vector<uint8_t>(patch.begin(), patch.end() - 2));
    DevBytes pe = to_device(bad_esize), pn = to_device(bad_elements), pc = to_device(bad_count),
             pgap = to_device(gaps);
    DevBytes d_esize = to_device(base), d_elements = to_device(base), d_count = to_device(base),
             d_gaps = to_device(base);
    std::vector<DeltaKernels::ApplyJob> jobs = {
        apply_job(good, E, 2, p, hb, hr, "good"),
        apply_job(wrong_base, E, 2, p, hb, hr, "wrong_base"),
        apply_job(wrong_result, E, 2, p, hb, hr ^ 1, "wrong_result"),
        apply_job(d_swapped, E, 2, ps, hb, hr, "swapped"),
        apply_job(d_outside, E, 2, po, hb, hr, "outside"),
        apply_job(d_garbage, E, 2, pg, hb, hr, "garbage"),
        apply_job(d_short, E, 2, short_patch, hb, hr, "short"),
        apply_job(d_esize, E, 2, pe, hb, hr, "esize"),
        apply_job(d_elements, E, 2, pn, hb, hr, "elements"),
        apply_job(d_count, E, 2, pc, hb, hr, "count"),
        apply_job(d_gaps, E, 2, pgap, hb, hr, "gaps"),
    };
    const auto out = g->kernels->apply(jobs, g->stream->get(), long_deadline());
    using O = DeltaKernels::Outcome;
    assert_int_equal(int(out[0].outcome), int(O::kApplied));
    assert_true(from_device(good.ptr, now.size()) == now);
    assert_int_equal(int(out[1].outcome), int(O::kBaseDiffers));
    assert_true(out[1].got == delta::tree_hash(touched.data(), touched.size()));
    assert_non_null(std::strstr(out[1].message.c_str(), "'wrong_base'"));
    assert_true(from_device(wrong_base.ptr, base.size()) == touched);
    assert_int_equal(int(out[2].outcome), int(O::kResultDiffers));
    assert_true(out[2].got == hr);
    assert_true(from_device(wrong_result.ptr, base.size()) == base);  // put back, bit for bit
    assert_int_equal(int(out[3].outcome), int(O::kMalformed));
    assert_non_null(std::strstr(out[3].message.c_str(), "tensor 'swapped': patch index 1 is out of order"));
    assert_int_equal(int(out[4].outcome), int(O::kMalformed));
    const std::string last = "patch index " + std::to_string(count - 1) + " is out of order or outside";
    assert_non_null(std::strstr(out[4].message.c_str(), last.c_str()));
    assert_int_equal(int(out[5].outcome), int(O::kMalformed));
    assert_non_null(std::strstr(out[5].message.c_str(), "magic"));
    assert_int_equal(int(out[6].outcome), int(O::kMalformed));
    assert_non_null(std::strstr(out[6].message.c_str(), "tensor 'short'"));
    assert_non_null(std::strstr(out[7].message.c_str(), "tensor 'esize': patch is for elements of 4 bytes"));
    assert_non_null(std::strstr(out[8].message.c_str(), "tensor 'elements': patch is for a tensor of"));
    assert_non_null(std::strstr(out[9].message.c_str(), "tensor 'count': patch of"));
    assert_non_null(std::strstr(out[10].message.c_str(), "tensor 'gaps': patch is gap-coded"));
    for (int k = 7; k <= 10; ++k) assert_int_equal(int(out[k].outcome), int(O::kMalformed));
    for (const DevBytes *d : {&d_swapped, &d_outside, &d_garbage, &d_short, &d_esize, &d_elements, &d_count, &d_gaps})
        assert_true(from_device(d->ptr, base.size()) == base);  // untouched
}

// A verified apply is three launches (check + base hash + verdict, scatter, result hash +
// verdict + restore), whatever the tensor's size; on a tensor of more than 30 pieces the
// verdicts hash more than 240 bytes of piece hashes (XXH3's long path, by a whole warp), and a
// wrong result is put back by the end launch's last block.
void a_verified_apply_is_three_launches_and_verdicts_hash_long_piece_lists(void **) {
    NEED_GPU();
    const size_t E = 1700000;  // bf16, 3.4 MB: 52 pieces
    std::vector<uint8_t> base = noise(2 * E, 51), now = changed_copy(base, 2, 0.001, 52);
    uint64_t count = 0;
    const DevBytes p = to_device(host_patch(base, now, 2, &count));
    const uint64_t hb = delta::tree_hash(base.data(), base.size()), hr = delta::tree_hash(now.data(), now.size());
    std::vector<uint8_t> touched = base;
    touched[2 * (E - 5)] ^= 4;  // in the last piece
    DevBytes good = to_device(base), wrong_base = to_device(touched), wrong_result = to_device(base);
    struct wsync_fake_stats before {}, after {};
    if (fake_stats) fake_stats(&before);
    const auto out = g->kernels->apply({apply_job(good, E, 2, p, hb, hr, "good"),
                                        apply_job(wrong_base, E, 2, p, hb, hr, "wrong_base"),
                                        apply_job(wrong_result, E, 2, p, hb, hr ^ 8, "wrong_result")},
                                       g->stream->get(), long_deadline());
    if (fake_stats) {
        fake_stats(&after);
        assert_int_equal(after.kernel_launches - before.kernel_launches, 3 * 3);
    }
    using O = DeltaKernels::Outcome;
    assert_int_equal(int(out[0].outcome), int(O::kApplied));
    assert_true(from_device(good.ptr, now.size()) == now);
    assert_int_equal(int(out[1].outcome), int(O::kBaseDiffers));
    assert_true(out[1].got == delta::tree_hash(touched.data(), touched.size()));
    assert_true(from_device(wrong_base.ptr, base.size()) == touched);
    assert_int_equal(int(out[2].outcome), int(O::kResultDiffers));
    assert_true(out[2].got == hr);
    assert_true(from_device(wrong_result.ptr, base.size()) == base);
}

void a_trainer_and_an_engine_stay_bit_identical_through_many_versions(void **) {
    NEED_GPU();
    // The GPU path end to end: the trainer diffs against its base and folds at commit, the
    // engine applies; random densities per version, several tensors of different sizes.
    const size_t sizes[] = {8192 * 5 + 3, 1000, 65536 + 9};
    const size_t esize[] = {2, 4, 1};
    std::vector<std::vector<uint8_t>> model;
    std::vector<DevBytes> trainer_now, trainer_base, engine;
    uint64_t seed = 51;
    for (size_t t = 0; t < 3; ++t) {
        model.push_back(noise(sizes[t] * esize[t], seed++));
        trainer_now.push_back(to_device(model[t]));
        trainer_base.push_back(to_device(model[t]));
        engine.push_back(to_device(model[t]));
    }
    const double fractions[] = {0.0, 0.001, 0.01, 0.2, 1.0, 0.05};
    for (int v = 0; v < 6; ++v) {
        std::vector<uint64_t> base_hash;
        std::vector<DeltaKernels::DiffJob> jobs;
        for (size_t t = 0; t < 3; ++t) {
            base_hash.push_back(delta::tree_hash(model[t].data(), model[t].size()));
            model[t] = changed_copy(model[t], esize[t], fractions[(v + t) % 6], seed++);
            gpu::Device::Scope s(*g->dev);
            assert_int_equal(g->api->cuMemcpyHtoDAsync(trainer_now[t].ptr, model[t].data(), model[t].size(),
                                                       g->stream->get()), 0);
            jobs.push_back({trainer_now[t].ptr, trainer_base[t].ptr, sizes[t], uint32_t(esize[t]), UINT64_MAX});
        }
        std::vector<DeltaKernels::DiffOut> out;
        g->kernels->diff(jobs, g->stream->get(), long_deadline(), "test", &out);
        std::vector<DeltaKernels::ApplyJob> apply;
        std::vector<DeltaKernels::FoldJob> fold;
        for (size_t t = 0; t < 3; ++t) {
            DeltaKernels::ApplyJob a;
            a.dst = engine[t].ptr;
            a.elements = sizes[t];
            a.esize = uint32_t(esize[t]);
            a.patch = out[t].bytes;
            a.nbytes = out[t].nbytes;
            a.base_hash = base_hash[t];
            a.result_hash = out[t].result_hash;
            a.label = "tensor 't" + std::to_string(t) + "'";
            apply.push_back(a);
            fold.push_back({trainer_base[t].ptr, sizes[t], uint32_t(esize[t]), out[t].bytes, out[t].changed, out[t].width});
        }
        const auto res = g->kernels->apply(apply, g->stream->get(), long_deadline());
        g->kernels->fold(fold, g->stream->get());
        for (size_t t = 0; t < 3; ++t) {
            assert_int_equal(int(res[t].outcome), int(DeltaKernels::Outcome::kApplied));
            assert_true(from_device(engine[t].ptr, model[t].size()) == model[t]);
            assert_true(from_device(trainer_base[t].ptr, model[t].size()) == model[t]);
        }
    }
}

void a_failed_launch_is_named_and_a_stuck_stream_ends_at_the_deadline(void **) {
    NEED_GPU();
    if (!fake_set_fail || !fake_hold) {
        print_message("skipped: needs the fake driver's failure injection\n");
        skip();
    }
    std::vector<uint8_t> base = noise(2 * 9000, 61), now = changed_copy(base, 2, 0.01, 62);
    DevBytes n = to_device(now), b = to_device(base);
    std::vector<DeltaKernels::DiffOut> out;
    // The launch itself refused.
    fake_set_fail("cuLaunchKernel", 0, 1 /* CUDA_ERROR_INVALID_VALUE */);
    expect_error([&] {
        g->kernels->diff({{n.ptr, b.ptr, 9000, 2, UINT64_MAX}}, g->stream->get(), long_deadline(), "test", &out);
    }, WSYNC_ERR_SYSTEM, "launching wsync_delta_count");
    // A kernel that faults while it runs: the wait names the failure.
    fake_set_fail("cuLaunchKernel@async", 0, 0);
    expect_error([&] {
        g->kernels->tree_hashes({{n.ptr, now.size()}}, g->stream->get(), long_deadline(), "test");
    }, WSYNC_ERR_SYSTEM, "test: hashing on the GPU: cuEventQuery (a kernel or copy on GPU-");
    fake_set_fail(nullptr, 0, 0);
    // The failed stream is sticky, as on a GPU: a fresh DeltaKernels on a fresh stream works.
    g->stream.reset(new gpu::Stream(*g->dev));
    // A stream that never gets to the work: TIMEOUT at the deadline, naming the step.
    assert_int_equal(fake_hold(g->stream->get()), 0);
    const auto t0 = std::chrono::steady_clock::now();
    expect_error([&] {
        g->kernels->diff({{n.ptr, b.ptr, 9000, 2, UINT64_MAX}}, g->stream->get(), sys::Deadline(300),
                         "chunk 9", &out);
    }, WSYNC_ERR_TIMEOUT, "chunk 9: comparing with the bases on the GPU did not finish within 300 ms");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    assert_true(s >= 0.29 && s < 5.0);
    fake_release();
    sync_stream();
    // And the same object works again once the stream moves.
    g->kernels->diff({{n.ptr, b.ptr, 9000, 2, UINT64_MAX}}, g->stream->get(), long_deadline(), "test", &out);
    assert_true(out[0].patch);
}

// Issue 33: a patch larger than any before grows the kernels' buffers while another stream of the
// process still has work that does not finish (on a nccl_broadcast sender: an earlier broadcast
// waiting for its receivers). Freeing the old buffer would wait for the whole device, with no
// deadline (the fake's cuMemFree waits for every stream, as the driver's does); it is kept
// instead, and the diff returns.
void growing_a_buffer_frees_nothing_while_other_work_is_pending(void **) {
    NEED_GPU();
    if (!fake_hold) {
        print_message("skipped: needs the fake driver's held streams\n");
        skip();
    }
    std::vector<uint8_t> base = noise(2 * 20000, 71);
    std::vector<uint8_t> small = changed_copy(base, 2, 0.001, 72), large = changed_copy(base, 2, 0.3, 73);
    DevBytes b = to_device(base), s1 = to_device(small), s2 = to_device(large);
    std::vector<DeltaKernels::DiffOut> out;
    g->kernels->diff({{s1.ptr, b.ptr, 20000, 2, UINT64_MAX}}, g->stream->get(), long_deadline(), "small", &out);
    assert_true(out[0].patch);
    const uint64_t small_bytes = out[0].nbytes;
    // Another stream with work that does not finish: the broadcast still waiting.
    gpu::Stream broadcast(*g->dev);
    assert_int_equal(fake_hold(broadcast.get()), 0);
    DevBytes scratch = to_device(base);
    {
        gpu::Device::Scope scope(*g->dev);
        assert_int_equal(g->api->cuMemcpyDtoDAsync(scratch.ptr, b.ptr, base.size(), broadcast.get()), 0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    g->kernels->diff({{s2.ptr, b.ptr, 20000, 2, UINT64_MAX}}, g->stream->get(), long_deadline(), "large", &out);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    assert_true(out[0].patch && out[0].nbytes > 4 * small_bytes);  // it did need more room
    assert_true(took < 5.0);  // and did not wait for the held stream (the fake's would forever)
    fake_release();
    gpu::Device::Scope scope(*g->dev);
    gpu::poll_until([&] { return g->api->cuStreamQuery(broadcast.get()) == gpu::CUDA_SUCCESS; },
                    long_deadline(), "the held stream");
}

// The engine's apply is queued with no host wait: every step is gated on the device-side
// verdict of the one before, and one collect() reads every verdict (docs/delta.md).
void queued_applies_wait_for_nothing_and_one_collect_reads_every_verdict(void **) {
    NEED_GPU();
    if (!fake_set_fail || !fake_hold) {
        print_message("skipped: needs the fake driver's stream hold\n");
        skip();
    }
    const size_t E = 20000;
    std::vector<uint8_t> base = noise(2 * E, 71), now = changed_copy(base, 2, 0.01, 72);
    uint64_t count = 0;
    const DevBytes p = to_device(host_patch(base, now, 2, &count));
    const uint64_t hb = delta::tree_hash(base.data(), base.size()), hr = delta::tree_hash(now.data(), now.size());
    std::vector<uint8_t> touched = base;
    touched[2 * 77] ^= 1;
    using O = DeltaKernels::Outcome;
    for (int round = 0; round < 2; ++round) {
        DevBytes d0 = to_device(base), d1 = to_device(touched), d2 = to_device(base);
        const std::vector<DeltaKernels::ApplyJob> jobs = {apply_job(d0, E, 2, p, hb, hr, "a"),
                                                          apply_job(d1, E, 2, p, hb, hr, "b"),
                                                          apply_job(d2, E, 2, p, hb, hr, "c")};
        // Round 0: the stream is parked, and queuing returns anyway, with nothing applied yet.
        if (round == 0) {
            sync_stream();  // the uploads above have run
            assert_int_equal(fake_hold(g->stream->get()), 0);
        }
        for (const auto &j : jobs) {
            DeltaKernels::ApplyOut refused;
            assert_true(g->kernels->queue_apply(j, g->stream->get(), long_deadline(), &refused));
        }
        assert_int_equal(g->kernels->queued(), 3);
        if (round == 0) {
            // The fake's device memory is this process's memory: read it without a stream.
            const auto *raw = reinterpret_cast<const uint8_t *>(d0.ptr);
            assert_true(std::vector<uint8_t>(raw, raw + base.size()) == base);
            // The one wait is bounded, names the step, and empties the queue.
            expect_error([&] { g->kernels->collect(sys::Deadline(300), "chunk 4"); }, WSYNC_ERR_TIMEOUT,
                         "chunk 4 did not finish within 300 ms");
            assert_int_equal(g->kernels->queued(), 0);
            fake_release();
            sync_stream();
            continue;
        }
        const auto out = g->kernels->collect(long_deadline(), "chunk 5");
        assert_int_equal(out.size(), 3);
        assert_int_equal(int(out[0].outcome), int(O::kApplied));
        assert_int_equal(int(out[1].outcome), int(O::kBaseDiffers));
        assert_non_null(std::strstr(out[1].message.c_str(), "tensor 'b'"));
        assert_int_equal(int(out[2].outcome), int(O::kApplied));
        assert_true(from_device(d0.ptr, now.size()) == now);
        assert_true(from_device(d1.ptr, touched.size()) == touched);
        assert_true(from_device(d2.ptr, now.size()) == now);
    }
    // A launch refused part-way through a patch's steps: the call names it, and collect()
    // waits for what was queued and reports that patch as not applied.
    DevBytes d = to_device(base);
    fake_set_fail("cuLaunchKernel", 2, 1 /* CUDA_ERROR_INVALID_VALUE */);
    DeltaKernels::ApplyOut refused;
    expect_error([&] { g->kernels->queue_apply(apply_job(d, E, 2, p, hb, hr, "d"), g->stream->get(),
                                               long_deadline(), &refused); },
                 WSYNC_ERR_SYSTEM, "launching wsync_apply_end");
    fake_set_fail(nullptr, 0, 0);
    const auto out = g->kernels->collect(long_deadline(), "chunk 6");
    assert_int_equal(out.size(), 1);
    assert_int_equal(int(out[0].outcome), int(O::kMalformed));
    assert_non_null(std::strstr(out[0].message.c_str(), "tensor 'd': its apply could not be queued whole"));
    assert_int_equal(g->kernels->queued(), 0);
}

// After a collect() that timed out, the stuck apply keeps its own buffers: when its stream
// finally moves it applies its patch where it was meant to, and an apply queued meanwhile on
// another stream is not disturbed by it (nor it by that one).
void a_timed_out_apply_keeps_its_buffers_and_later_applies_get_their_own(void **) {
    NEED_GPU();
    if (!fake_hold) {
        print_message("skipped: needs the fake driver's stream hold\n");
        skip();
    }
    const size_t E = 20000;
    // The later patch is larger, so the saved values' buffer must grow: freeing the old one
    // would wait for the stuck work, without a bound.
    std::vector<uint8_t> base = noise(2 * E, 91), now = changed_copy(base, 2, 0.02, 92),
                         now2 = changed_copy(base, 2, 0.3, 93);
    uint64_t count = 0, count2 = 0;
    const DevBytes p = to_device(host_patch(base, now, 2, &count)), p2 = to_device(host_patch(base, now2, 2, &count2));
    assert_true(count2 * 2 > 4096);  // past the first patch's buffer (at least 4096 bytes)
    const uint64_t hb = delta::tree_hash(base.data(), base.size()), hr = delta::tree_hash(now.data(), now.size()),
                   hr2 = delta::tree_hash(now2.data(), now2.size());
    DevBytes d1 = to_device(base), d2 = to_device(base);
    sync_stream();
    gpu::Stream other(*g->dev);
    assert_int_equal(fake_hold(g->stream->get()), 0);
    DeltaKernels::ApplyOut refused;
    assert_true(g->kernels->queue_apply(apply_job(d1, E, 2, p, hb, hr, "stuck"), g->stream->get(),
                                        long_deadline(), &refused));
    expect_error([&] { g->kernels->collect(sys::Deadline(200), "chunk 7"); }, WSYNC_ERR_TIMEOUT, "chunk 7");
    // Another stream, meanwhile: its own slot, piece hashes and saved values.
    assert_true(g->kernels->queue_apply(apply_job(d2, E, 2, p2, hb, hr2, "later"), other.get(),
                                        sys::Deadline(2000), &refused));
    const auto out = g->kernels->collect(long_deadline(), "chunk 8");
    assert_int_equal(int(out[0].outcome), int(DeltaKernels::Outcome::kApplied));
    fake_release();
    sync_stream();
    const auto *r1 = reinterpret_cast<const uint8_t *>(d1.ptr), *r2 = reinterpret_cast<const uint8_t *>(d2.ptr);
    assert_true(std::vector<uint8_t>(r1, r1 + now.size()) == now);  // the stuck one ran, whole
    assert_true(std::vector<uint8_t>(r2, r2 + now2.size()) == now2);
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
        g->dev.reset(new gpu::Device(*g->api, 0, "test_gpu_diff"));
        g->stream.reset(new gpu::Stream(*g->dev));
        g->kernels.reset(new DeltaKernels(*g->dev));
    } catch (const Error &e) {
        g->api = nullptr;
        g->why = e.what();
        return 0;
    }
    if (const char *path = std::getenv("WSYNC_CUDA_LIBRARY")) {
        if (void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD)) {
            fake_set_fail = reinterpret_cast<set_fail_fn>(dlsym(h, "wsync_fake_set_fail"));
            fake_hold = reinterpret_cast<hold_fn>(dlsym(h, "wsync_fake_stream_hold"));
            fake_release = reinterpret_cast<release_fn>(dlsym(h, "wsync_fake_stream_release_held"));
            fake_stats = reinterpret_cast<wsync_fake_stats_fn>(dlsym(h, "wsync_fake_stats"));
        }
    }
    return 0;
}

int teardown(void **) {
    if (g) {
        g->kernels.reset();
        g->stream.reset();
        g->dev.reset();
        delete g;
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tree_hashes_of_device_memory_equal_the_host_tree_hash),
        cmocka_unit_test(a_gpu_patch_is_the_host_encoders_patch_byte_for_byte),
        cmocka_unit_test(a_gpu_patch_is_exact_at_every_element_size_length_and_alignment),
        cmocka_unit_test(a_tensor_over_its_limit_gets_no_patch_and_an_empty_one_goes_dense),
        cmocka_unit_test(a_fold_makes_the_base_the_new_version),
        cmocka_unit_test(the_apply_writes_a_patch_only_onto_its_base_and_only_to_its_result),
        cmocka_unit_test(a_verified_apply_is_three_launches_and_verdicts_hash_long_piece_lists),
        cmocka_unit_test(a_trainer_and_an_engine_stay_bit_identical_through_many_versions),
        cmocka_unit_test(a_failed_launch_is_named_and_a_stuck_stream_ends_at_the_deadline),
        cmocka_unit_test(queued_applies_wait_for_nothing_and_one_collect_reads_every_verdict),
        cmocka_unit_test(a_base_in_pinned_host_memory_diffs_and_folds_as_one_on_the_gpu),
        cmocka_unit_test(a_timed_out_apply_keeps_its_buffers_and_later_applies_get_their_own),
        cmocka_unit_test(growing_a_buffer_frees_nothing_while_other_work_is_pending),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, teardown);
}
