// What the C++ white-box tests of library internals share: cmocka, XXH3 (header-only) and
// reproducible noise. Include it after the library's own headers: cmocka.h defines a fail()
// macro that would rename wsync::fail.
#pragma once

#include <cstdint>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

#define XXH_INLINE_ALL
#include <xxhash.h>

// n bytes from a 64-bit LCG seeded with `seed` (top byte of each state).
inline std::vector<uint8_t> noise(size_t n, uint64_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = uint8_t(seed >> 56);
    }
    return v;
}
