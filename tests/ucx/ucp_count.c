/* A test stand-in for libucp.so.0 that counts what the ucx kind reads: loaded through the
 * "ucx_library" option, it defines ucp_am_send_nbx (counting each Fetch an engine sends and the
 * bytes it asks for, then calling the real one) and nothing else; every other UCP symbol the
 * kind looks up is found in the real libucp.so.0, which this library depends on. So a test
 * measures the bytes the receiver asked the trainer to move at the UCX API itself, read from
 * the message as docs/wire-format.md defines it (ucx wire version 3: a Fetch is type 9 on
 * active-message id 1, its byte count the u64 at offset 48), not from the library's own
 * bookkeeping. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

static _Atomic uint64_t get_bytes, get_calls;

typedef ucs_status_ptr_t (*send_fn)(ucp_ep_h, unsigned, const void *, size_t, const void *, size_t,
                                    const ucp_request_param_t *);

enum { CONTROL_ID = 1, FETCH = 9, BYTES_AT = 48 };

ucs_status_ptr_t ucp_am_send_nbx(ucp_ep_h ep, unsigned id, const void *header, size_t header_length,
                                 const void *buffer, size_t count, const ucp_request_param_t *param) {
    static _Atomic(send_fn) real;
    send_fn f = atomic_load(&real);
    if (!f) {
        void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
        f = h ? (send_fn)dlsym(h, "ucp_am_send_nbx") : NULL;
        if (!f) return UCS_STATUS_PTR(UCS_ERR_NO_ELEM);
        atomic_store(&real, f);
    }
    const uint8_t *m = buffer;
    /* A Fetch of bytes: its `chunk` field (after `bytes`) is 0; a Fetch of the checksums that
     * follow a chunk's bytes (kFetchSums) moves no byte of the chunk and is not counted. */
    if (id == CONTROL_ID && count >= BYTES_AT + 12 && m[0] == 3 && m[1] == 0 && m[2] == FETCH && m[3] == 0 &&
        (m[BYTES_AT + 8] | m[BYTES_AT + 9] | m[BYTES_AT + 10] | m[BYTES_AT + 11]) == 0) {
        uint64_t n = 0;
        for (int i = 0; i < 8; ++i) n |= (uint64_t)m[BYTES_AT + i] << (8 * i);
        atomic_fetch_add(&get_bytes, n);
        atomic_fetch_add(&get_calls, 1);
    }
    return f(ep, id, header, header_length, buffer, count, param);
}

uint64_t wsync_test_get_bytes(void) { return atomic_load(&get_bytes); }
uint64_t wsync_test_get_calls(void) { return atomic_load(&get_calls); }
void wsync_test_get_reset(void) {
    atomic_store(&get_bytes, 0);
    atomic_store(&get_calls, 0);
}
