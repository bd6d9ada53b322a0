// The pack kernel: gathers a chunk's tensors into one contiguous device bucket in one launch,
// optionally casting float32 to bfloat16 or float16 on the way. Its interface is described in
// src/gpu/kernels/pack_abi.hpp; the PTX the library embeds is generated from this file by
// scripts/gen-ptx.sh (compute_80: bfloat16 conversion instructions need sm_80 or newer).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

struct PackEntry {
    unsigned long long src;
    unsigned long long dst;
    unsigned long long count;  // bytes for a copy, elements for a cast
    unsigned int op;           // 0 copy, 1 f32 -> bf16, 2 f32 -> f16
    unsigned int reserved;
};

extern "C" __global__ void wsync_pack(const PackEntry *entries, unsigned int count) {
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = gridDim.x * (unsigned long long)blockDim.x;
    for (unsigned int e = blockIdx.y; e < count; e += gridDim.y) {
        const PackEntry t = entries[e];
        if (t.op == 1) {
            const float *s = reinterpret_cast<const float *>(t.src);
            __nv_bfloat16 *d = reinterpret_cast<__nv_bfloat16 *>(t.dst);
            for (unsigned long long i = tid; i < t.count; i += stride) d[i] = __float2bfloat16_rn(s[i]);
        } else if (t.op == 2) {
            const float *s = reinterpret_cast<const float *>(t.src);
            __half *d = reinterpret_cast<__half *>(t.dst);
            for (unsigned long long i = tid; i < t.count; i += stride) d[i] = __float2half_rn(s[i]);
        } else if (((t.src | t.dst) & 15) == 0) {
            // Both 16-byte aligned (the usual case: buckets align tensors to 256 bytes).
            const uint4 *s = reinterpret_cast<const uint4 *>(t.src);
            uint4 *d = reinterpret_cast<uint4 *>(t.dst);
            const unsigned long long n16 = t.count / 16;
            for (unsigned long long i = tid; i < n16; i += stride) d[i] = s[i];
            const unsigned char *sb = reinterpret_cast<const unsigned char *>(t.src);
            unsigned char *db = reinterpret_cast<unsigned char *>(t.dst);
            for (unsigned long long i = n16 * 16 + tid; i < t.count; i += stride) db[i] = sb[i];
        } else {
            const unsigned char *s = reinterpret_cast<const unsigned char *>(t.src);
            unsigned char *d = reinterpret_cast<unsigned char *>(t.dst);
            for (unsigned long long i = tid; i < t.count; i += stride) d[i] = s[i];
        }
    }
}
