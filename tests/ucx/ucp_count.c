/* A test stand-in for libucp.so.0 that counts what the ucx kind reads: loaded through the
 * "ucx_library" option, it defines ucp_get_nbx (counting each GET and its bytes, then calling
 * the real one) and nothing else; every other UCP symbol the kind looks up is found in the real
 * libucp.so.0, which this library depends on. So a test measures the bytes the receiver asked
 * UCX to move at the UCX API itself, not from the library's own bookkeeping. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

static _Atomic uint64_t get_bytes, get_calls;

typedef ucs_status_ptr_t (*get_fn)(ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *);

ucs_status_ptr_t ucp_get_nbx(ucp_ep_h ep, void *buffer, size_t count, uint64_t remote_addr, ucp_rkey_h rkey,
                             const ucp_request_param_t *param) {
    static _Atomic(get_fn) real;
    get_fn f = atomic_load(&real);
    if (!f) {
        void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
        f = h ? (get_fn)dlsym(h, "ucp_get_nbx") : NULL;
        if (!f) return UCS_STATUS_PTR(UCS_ERR_NO_ELEM);
        atomic_store(&real, f);
    }
    atomic_fetch_add(&get_bytes, count);
    atomic_fetch_add(&get_calls, 1);
    return f(ep, buffer, count, remote_addr, rkey, param);
}

uint64_t wsync_test_get_bytes(void) { return atomic_load(&get_bytes); }
uint64_t wsync_test_get_calls(void) { return atomic_load(&get_calls); }
void wsync_test_get_reset(void) {
    atomic_store(&get_bytes, 0);
    atomic_store(&get_calls, 0);
}
