// The one table through which the ucx kind calls UCX's UCP API.
//
// libwsync.so has no load-time dependency on libucp: the table is filled with dlopen/dlsym when
// a ucx strategy is created (the "ucx_library" option, else $WSYNC_UCX_LIBRARY, else the
// system's libucp.so.0), like src/gpu/api does for the CUDA driver and NCCL. The types come
// from UCX's own header (<ucp/api/ucp.h>, Debian's libucx-dev); a build without that header
// does not build this kind at all (CMake leaves WSYNC_HAVE_UCX undefined and the registry does
// not list it), because hand-copied UCP parameter structs would silently drift from the
// library's. UCP keeps its ABI within a major version (ucp_init_version checks the API version
// we were built against), and we ask for 1.13, the oldest release we test.
#pragma once

#include <cstdio>
#include <string>

#include <ucp/api/ucp.h>

namespace wsync::ucx {

#define WSYNC_UCP_FUNCTIONS(X)                                                                   \
    X(ucp_get_version, void, (unsigned *, unsigned *, unsigned *))                               \
    X(ucp_config_read, ucs_status_t, (const char *, const char *, ucp_config_t **))              \
    X(ucp_config_modify, ucs_status_t, (ucp_config_t *, const char *, const char *))             \
    X(ucp_config_release, void, (ucp_config_t *))                                                \
    X(ucp_init_version, ucs_status_t,                                                            \
      (unsigned, unsigned, const ucp_params_t *, const ucp_config_t *, ucp_context_h *))         \
    X(ucp_cleanup, void, (ucp_context_h))                                                        \
    X(ucp_context_query, ucs_status_t, (ucp_context_h, ucp_context_attr_t *))                    \
    X(ucp_context_print_info, void, (ucp_context_h, FILE *))                                      \
    X(ucp_worker_create, ucs_status_t, (ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *)) \
    X(ucp_worker_destroy, void, (ucp_worker_h))                                                  \
    X(ucp_worker_get_address, ucs_status_t, (ucp_worker_h, ucp_address_t **, size_t *))         \
    X(ucp_worker_release_address, void, (ucp_worker_h, ucp_address_t *))                         \
    X(ucp_worker_progress, unsigned, (ucp_worker_h))                                             \
    X(ucp_worker_get_efd, ucs_status_t, (ucp_worker_h, int *))                                   \
    X(ucp_worker_arm, ucs_status_t, (ucp_worker_h))                                              \
    X(ucp_worker_signal, ucs_status_t, (ucp_worker_h))                                           \
    X(ucp_worker_set_am_recv_handler, ucs_status_t, (ucp_worker_h, const ucp_am_handler_param_t *)) \
    X(ucp_ep_create, ucs_status_t, (ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *))         \
    X(ucp_ep_close_nbx, ucs_status_ptr_t, (ucp_ep_h, const ucp_request_param_t *))               \
    X(ucp_am_send_nbx, ucs_status_ptr_t,                                                         \
      (ucp_ep_h, unsigned, const void *, size_t, const void *, size_t, const ucp_request_param_t *)) \
    X(ucp_am_recv_data_nbx, ucs_status_ptr_t, (ucp_worker_h, void *, void *, size_t, const ucp_request_param_t *)) \
    X(ucp_am_data_release, void, (ucp_worker_h, void *))                                         \
    X(ucp_request_check_status, ucs_status_t, (void *))                                          \
    X(ucp_request_cancel, void, (ucp_worker_h, void *))                                          \
    X(ucp_request_free, void, (void *))                                                          \
    X(ucs_status_string, const char *, (ucs_status_t))

struct Api {
#define WSYNC_UCP_FIELD(name, ret, params) ret(*name) params = nullptr;
    WSYNC_UCP_FUNCTIONS(WSYNC_UCP_FIELD)
#undef WSYNC_UCP_FIELD
    std::string path;
    unsigned major = 0, minor = 0, release = 0;
};

// The table for `path` ("" : $WSYNC_UCX_LIBRARY, else "libucp.so.0"), opened once per path for
// the life of the process. Throws WSYNC_ERR_UNAVAILABLE naming the file and what is missing.
const Api &api(const std::string &path);
// "" when api(path) would succeed, else why not.
std::string unavailable_reason(const std::string &path);
// "1.13.1"
std::string version_text(const Api &a);

// Throws WSYNC_ERR_SYSTEM (or `status_if_peer` for errors that mean the peer is gone or
// unreachable) with "<what>: <UCX's status string> (UCX status N)".
[[noreturn]] void ucs_fail(const Api &a, ucs_status_t st, const std::string &what,
                           int status_if_peer);
// Whether a UCX status means the remote side is gone or unreachable (not our own bug).
bool is_peer_error(ucs_status_t st);

}  // namespace wsync::ucx
