#include "gpu/api.hpp"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <mutex>

#include "error.hpp"

namespace wsync::gpu {

namespace {

const char *env_or(const char *name, const char *fallback) {
    const char *v = std::getenv(name);
    return v && *v ? v : fallback;
}

// Opens `path` and fills every field of `table` from it, or says why not. RTLD_LOCAL keeps the
// driver's symbols out of the global namespace, so a process can also have its own copy of
// NCCL (PyTorch's) without clashes.
template <class Table>
std::string open_table(const std::string &path, Table &table,
                       void (*bind)(void *handle, Table &table, std::string &missing)) {
    void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        return "cannot load " + path + " (" + (why ? why : "unknown loader error") + ")";
    }
    std::string missing;
    bind(handle, table, missing);
    if (!missing.empty()) {
        dlclose(handle);
        return path + " lacks " + missing;
    }
    table.path = path;
    return "";  // the handle stays open for the life of the process
}

#define WSYNC_GPU_BIND(field, symbol, ret, params)                                                \
    table.field = reinterpret_cast<ret(*) params>(dlsym(handle, symbol));                         \
    if (!table.field) missing += (missing.empty() ? "" : ", ") + std::string(symbol);

void bind_cuda(void *handle, CudaApi &table, std::string &missing) {
    WSYNC_CUDA_FUNCTIONS(WSYNC_GPU_BIND)
}
void bind_nccl(void *handle, NcclApi &table, std::string &missing) {
    WSYNC_NCCL_FUNCTIONS(WSYNC_GPU_BIND)
}
#undef WSYNC_GPU_BIND

// cuDriverGetVersion's number, 1000 * major + 10 * minor, as "12.4".
std::string driver_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

struct CudaState {
    std::once_flag once;
    CudaApi api;
    std::string error;
};

// Never destroyed (nor NcclState below): helper threads (cuda_ipc's acknowledgement queue,
// nccl_broadcast's watch of its communicator) call through the tables while the process exits,
// after static destructors have run.
CudaState &cuda_state() {
    static CudaState &state = *new CudaState;
    std::call_once(state.once, [] {
        const std::string path = env_or("WSYNC_CUDA_LIBRARY", "libcuda.so.1");
        state.error = open_table(path, state.api, bind_cuda);
        if (!state.error.empty()) {
            state.error = "CUDA driver unavailable: " + state.error;
            return;
        }
        CUresult rc = state.api.cuInit(0);
        if (rc != CUDA_SUCCESS) {
            const char *name = nullptr;
            state.api.cuGetErrorName(rc, &name);
            state.error = "CUDA driver " + path + ": cuInit failed with " +
                          (name ? name : "CUresult " + std::to_string(rc)) +
                          (rc == CUDA_ERROR_NO_DEVICE ? " (no CUDA-capable device)" : "");
            return;
        }
        state.api.driver_version = 0;
        state.api.cuDriverGetVersion(&state.api.driver_version);
        if (state.api.driver_version < kMinDriverVersion) {
            state.error = "CUDA driver " + path + " is " + driver_text(state.api.driver_version) +
                          "; libwsync's GPU strategies need a CUDA " +
                          driver_text(kMinDriverVersion) + " driver (R525) or newer";
        }
    });
    return state;
}

struct NcclState {
    std::mutex mu;
    std::map<std::string, std::unique_ptr<NcclApi>> loaded;  // by path; never unloaded
    std::map<std::string, std::string> errors;
};

NcclState &nccl_state() {
    static NcclState &state = *new NcclState;
    return state;
}

std::string nccl_path(const std::string &path) {
    return path.empty() ? env_or("WSYNC_NCCL_LIBRARY", "libnccl.so.2") : path;
}

// Loads (once) the NCCL at `file`; returns the table or nullptr with *why filled.
const NcclApi *load_nccl(const std::string &file, std::string *why) {
    NcclState &s = nccl_state();
    std::lock_guard<std::mutex> lock(s.mu);
    auto hit = s.loaded.find(file);
    if (hit != s.loaded.end()) return hit->second.get();
    auto err = s.errors.find(file);
    if (err != s.errors.end()) {
        *why = err->second;
        return nullptr;
    }
    auto api = std::make_unique<NcclApi>();
    std::string e = open_table(file, *api, bind_nccl);
    if (e.empty()) {
        api->version = 0;
        if (api->ncclGetVersion(&api->version) != ncclSuccess)
            e = file + ": ncclGetVersion failed";
        else if (api->version < kNcclMinVersion)
            e = file + " is NCCL " + nccl_version_text(api->version) +
                "; libwsync needs 2.14 or newer (non-blocking communicators)";
    }
    if (!e.empty()) {
        *why = "NCCL unavailable: " + e;
        s.errors[file] = *why;
        return nullptr;
    }
    return (s.loaded[file] = std::move(api)).get();
}

}  // namespace

std::string nccl_version_text(int code) {
    int major, minor, patch;
    if (code >= 10000) {
        major = code / 10000, minor = code / 100 % 100, patch = code % 100;
    } else {
        major = code / 1000, minor = code / 100 % 10, patch = code % 100;
    }
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

const CudaApi &cuda() {
    CudaState &s = cuda_state();
    if (!s.error.empty()) fail(WSYNC_ERR_UNAVAILABLE, s.error);
    return s.api;
}

std::string cuda_unavailable_reason() { return cuda_state().error; }

std::string cuda_runtime_text() {
    const CudaApi &api = cuda();
    return "CUDA driver " + driver_text(api.driver_version) + " (" + api.path + "; libwsync needs " +
           driver_text(kMinDriverVersion) + " or newer)";
}

const NcclApi &nccl(const std::string &path) {
    std::string why;
    const NcclApi *api = load_nccl(nccl_path(path), &why);
    if (!api) fail(WSYNC_ERR_UNAVAILABLE, why);
    return *api;
}

std::string nccl_unavailable_reason(const std::string &path) {
    std::string why;
    return load_nccl(nccl_path(path), &why) ? "" : why;
}

void cuda_fail(const CudaApi &api, CUresult rc, const std::string &what) {
    const char *name = nullptr, *text = nullptr;
    if (api.cuGetErrorName) api.cuGetErrorName(rc, &name);
    if (api.cuGetErrorString) api.cuGetErrorString(rc, &text);
    std::string msg = what + ": " + (name ? name : "CUresult " + std::to_string(rc));
    if (text) msg += std::string(" (") + text + ")";
    fail(rc == CUDA_ERROR_OUT_OF_MEMORY ? WSYNC_ERR_NO_MEMORY : WSYNC_ERR_SYSTEM, msg);
}

void nccl_fail(const NcclApi &api, ncclResult_t rc, const std::string &what) {
    const char *text = api.ncclGetErrorString ? api.ncclGetErrorString(rc) : nullptr;
    fail(WSYNC_ERR_SYSTEM, what + ": ncclResult_t " + std::to_string(rc) +
                               (text ? std::string(" (") + text + ")" : std::string()));
}

std::string uuid_text(const CUuuid &uuid, const char *prefix) {
    static const char digits[] = "0123456789abcdef";
    std::string out = prefix;
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
        auto b = static_cast<unsigned char>(uuid.bytes[i]);
        out.push_back(digits[b >> 4]);
        out.push_back(digits[b & 15]);
    }
    return out;
}

bool parse_uuid(const std::string &text, CUuuid *out) {
    std::string s = text;
    if (s.rfind("GPU-", 0) == 0 || s.rfind("MIG-", 0) == 0) s = s.substr(4);
    std::string hex;
    for (char c : s) {
        if (c == '-') continue;
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
        hex.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
    if (hex.size() != 32) return false;
    for (int i = 0; i < 16; ++i)
        out->bytes[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    return true;
}

}  // namespace wsync::gpu
