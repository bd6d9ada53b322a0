// The C ABI's translation helpers, shared by its two files (send.cpp: versions, blobs,
// strategies, senders; receive.cpp: receivers, iterations, the planner, introspection). Each
// entry point only translates: it checks pointer arguments, clears outputs, calls the core, and
// turns exceptions into a status plus the per-thread message (guard). No exception leaves the
// ABI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core.hpp"
#include "error.hpp"
#include "plan/planner.hpp"
#include "wsync.h"

namespace wsync::abi {

template <class F>
wsync_status_t guard(F &&f) noexcept {
    try {
        f();
        return WSYNC_OK;
    } catch (const Error &e) {
        wsync::set_last_error(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        wsync::set_last_error("out of memory");
        return WSYNC_ERR_NO_MEMORY;
    } catch (const std::exception &e) {
        wsync::set_last_error(e.what());  // a library bug: nothing else should escape the core
        return WSYNC_ERR_INTERNAL;
    } catch (...) {
        wsync::set_last_error("unknown internal error");
        return WSYNC_ERR_INTERNAL;
    }
}

inline void require(const void *p, const char *fn, const char *arg) {
    if (!p) fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + arg + " is NULL");
}

inline void require_bytes(const uint8_t *p, size_t len, const char *fn, const char *arg) {
    if (!p || len == 0)
        fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(fn) + ": " + arg + " is NULL or empty");
}

inline wsync_blob_t to_blob(const std::vector<uint8_t> &bytes) {
    auto *p = static_cast<uint8_t *>(std::malloc(bytes.size()));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, bytes.data(), bytes.size());
    return wsync_blob_t{p, bytes.size()};
}

inline char *to_cstring(const std::string &s) {
    auto *p = static_cast<char *>(std::malloc(s.size() + 1));
    if (!p) throw std::bad_alloc();
    std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

// The "Structs" rule of wsync.h: every layout a struct has had stays accepted. A caller passes
// the struct_size of the header it was built against (or 0: that struct's oldest layout).
// Layouts<T>::oldest is the size of T's first sized layout; a struct that grew lists its field
// added last as the end of the layout before (wsync.h's size history).
template <class T>
struct Layouts {
    static constexpr uint32_t oldest = sizeof(T);
};
template <>
struct Layouts<wsync_apply_result_t> {  // 0.6.0: 40 bytes; 0.6.1 added device_copies
    static constexpr uint32_t oldest = offsetof(wsync_apply_result_t, device_copies);
};
static_assert(Layouts<wsync_apply_result_t>::oldest == WSYNC_APPLY_RESULT_SIZE_0_6_0,
              "wsync.h's size history and the library agree");

// The size a caller's struct_size stands for: its own, or for 0 the oldest layout; smaller than
// the oldest is WSYNC_ERR_INVALID_ARGUMENT naming the struct.
template <class T>
uint32_t caller_size(uint32_t size, const char *what) {
    const uint32_t n = size == 0 ? Layouts<T>::oldest : size;
    if (n < Layouts<T>::oldest)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(what) + ".struct_size is " + std::to_string(size) + ", less than " +
                 std::to_string(Layouts<T>::oldest) + " (the oldest layout of it this library knows)");
    return n;
}

// Inputs: bytes past the fields this version knows must be zero. No input struct has grown yet;
// the first that does must be read by copying the caller's bytes into a zeroed T, which the
// static_assert below makes someone write.
template <class T>
void check_struct_size(const T *p, uint32_t size, const char *what) {
    static_assert(Layouts<T>::oldest == sizeof(T),
                  "an input struct that grew must be read by copy up to the caller's size");
    const uint32_t n = caller_size<T>(size, what);
    if (n == sizeof(T)) return;
    if (n > (1u << 16))
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(what) + ".struct_size " + std::to_string(n) + " is implausibly large");
    const auto *extra = reinterpret_cast<const unsigned char *>(p) + sizeof(T);
    for (uint32_t i = 0; i < n - sizeof(T); ++i)
        if (extra[i])
            fail(WSYNC_ERR_UNSUPPORTED, std::string(what) + " sets fields newer than this library (" +
                                            wsync_version_string() + ") knows");
}

// Outputs: the caller's struct_size says how much may be written. Only the fields both know are
// written (an older caller's smaller struct gets the fields it has, a newer caller's larger one
// keeps its tail), and struct_size is set to the bytes written.
template <class T>
void write_sized(T *out, const T &value, const char *what) {
    const uint32_t n = std::min<uint32_t>(caller_size<T>(out->struct_size, what), sizeof(T));
    T v = value;
    v.struct_size = n;
    std::memcpy(out, &v, n);
}

// The handles. A sender or receiver used by a process other than its creator's (a forked child
// holding a copy) is refused with WSYNC_ERR_WRONG_STATE, as is a strategy that made init info
// (it serves a segment or endpoint); one that made none is options only, usable anywhere.
inline wsync::Strategy *core(wsync_strategy_t *h) {
    auto *s = reinterpret_cast<wsync::Strategy *>(h);
    if (s && s->made_init()) s->owner.require("strategy (it made init info)");
    return s;
}
inline wsync::Sender *core(wsync_sender_t *h) {
    auto *s = reinterpret_cast<wsync::Sender *>(h);
    if (s) s->owner.require("sender");
    return s;
}
inline const wsync::Sender *core(const wsync_sender_t *h) {
    auto *s = reinterpret_cast<const wsync::Sender *>(h);
    if (s) s->owner.require("sender");
    return s;
}
inline wsync::Receiver *core(wsync_receiver_t *h) {
    auto *r = reinterpret_cast<wsync::Receiver *>(h);
    if (r) r->owner.require("receiver");
    return r;
}
inline const wsync::Receiver *core(const wsync_receiver_t *h) {
    auto *r = reinterpret_cast<const wsync::Receiver *>(h);
    if (r) r->owner.require("receiver");
    return r;
}
// Destroys a handle's object, unless this process is a forked child holding a copy: then the
// copy is left as it is (its teardown would act on the parent's shared state), never freed.
template <class Core, class Handle>
void destroy(Handle *h) noexcept {
    auto *c = reinterpret_cast<Core *>(h);
    if (c && c->owner.here()) delete c;
}
inline wsync::Iteration *core(wsync_recv_t *h) { return reinterpret_cast<wsync::Iteration *>(h); }
inline const wsync::Iteration *core(const wsync_recv_t *h) {
    return reinterpret_cast<const wsync::Iteration *>(h);
}
inline wsync::Plan *core(wsync_plan_t *h) { return reinterpret_cast<wsync::Plan *>(h); }
inline const wsync::Plan *core(const wsync_plan_t *h) { return reinterpret_cast<const wsync::Plan *>(h); }

}  // namespace wsync::abi
