#include "transport/ucx/api.hpp"

#include <cstdlib>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <mutex>

#include "error.hpp"

namespace wsync::ucx {
namespace {

struct Loaded {
    Api api;
    std::string error;  // why it could not be used; "" when it can
};

std::string resolve(const std::string &path) {
    if (!path.empty()) return path;
    const char *env = std::getenv("WSYNC_UCX_LIBRARY");
    return env && *env ? env : "libucp.so.0";
}

// RTLD_LOCAL: UCX's symbols stay out of the global namespace, so a process may hold another
// copy (e.g. a CUDA-enabled UCX from a wheel) without clashes. dlsym on the handle also finds
// ucs_status_string in libucs, which libucp pulls in as a dependency.
void load(const std::string &path, Loaded &out) {
    void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        out.error = "cannot load " + path + " (" + (why ? why : "unknown loader error") + ")";
        return;
    }
    std::string missing;
#define WSYNC_UCP_BIND(name, ret, params)                                                         \
    out.api.name = reinterpret_cast<ret(*) params>(dlsym(handle, #name));                         \
    if (!out.api.name) missing += (missing.empty() ? "" : ", ") + std::string(#name);
    WSYNC_UCP_FUNCTIONS(WSYNC_UCP_BIND)
#undef WSYNC_UCP_BIND
    if (!missing.empty()) {
        out.error = path + " lacks " + missing + " (UCX 1.13 or newer is needed)";
        dlclose(handle);
        return;
    }
    out.api.ucp_get_version(&out.api.major, &out.api.minor, &out.api.release);
    if (out.api.major != UCP_API_MAJOR || out.api.minor < 13) {
        out.error = path + " is UCX " + version_text(out.api) + "; the ucx kind needs UCX " +
                    std::to_string(UCP_API_MAJOR) + ".13 or newer within major version " +
                    std::to_string(UCP_API_MAJOR);
        dlclose(handle);
        return;
    }
    out.api.path = path;  // the handle stays open for the life of the process
}

const Loaded &loaded(const std::string &path) {
    // Never destroyed: a trainer's serving thread reads the table while the process exits (a
    // caller that ends without destroying its sender), after static destructors have run.
    static std::mutex &mu = *new std::mutex;
    static auto &cache = *new std::map<std::string, std::unique_ptr<Loaded>>;
    const std::string p = resolve(path);
    std::lock_guard<std::mutex> lock(mu);
    auto &slot = cache[p];
    if (!slot) {
        slot = std::make_unique<Loaded>();
        load(p, *slot);
    }
    return *slot;
}

}  // namespace

const Api &api(const std::string &path) {
    const Loaded &l = loaded(path);
    if (!l.error.empty()) fail(WSYNC_ERR_UNAVAILABLE, "ucx: UCX unavailable: " + l.error);
    return l.api;
}

std::string unavailable_reason(const std::string &path) {
    const Loaded &l = loaded(path);
    return l.error.empty() ? "" : "UCX unavailable: " + l.error;
}

std::string version_text(const Api &a) {
    return std::to_string(a.major) + "." + std::to_string(a.minor) + "." + std::to_string(a.release);
}

bool is_peer_error(ucs_status_t st) {
    switch (st) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
        return true;
    default:
        return false;
    }
}

void ucs_fail(const Api &a, ucs_status_t st, const std::string &what, int status_if_peer) {
    const char *s = a.ucs_status_string ? a.ucs_status_string(st) : nullptr;
    fail(is_peer_error(st) ? static_cast<wsync_status_t>(status_if_peer) : WSYNC_ERR_SYSTEM,
         what + ": " + (s ? s : "unknown UCX status") + " (UCX status " +
             std::to_string(static_cast<int>(st)) + ")");
}

}  // namespace wsync::ucx
