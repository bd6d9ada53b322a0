// The CUDA driver as the tool's GPU benches use it (bench --strategy cuda_ipc, bench
// --delta-fraction --strategy cuda_ipc), opened at run time (WSYNC_CUDA_LIBRARY, else
// libcuda.so.1): the tool does not link it. Only functions the CI fake driver (tests/fake_gpu)
// implements are used, so the benches can be smoke-tested without a GPU.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <dlfcn.h>

#include "cli.hpp"

namespace wsync_cli {
namespace cu {
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void *;
using CUstream = void *;
struct Api {
    std::string path;
    CUresult (*Init)(unsigned int);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)();
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);  // synchronous
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);        // synchronous
};
inline Api api;

// Opens the driver and resolves the symbols, without calling into it (so fork stays safe).
// On failure: exit 2 with a message naming the library.
inline void load() {
    const char *env = std::getenv("WSYNC_CUDA_LIBRARY");
    api.path = env && *env ? env : "libcuda.so.1";
    void *h = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        std::fprintf(stderr, "wsync bench: cannot load the CUDA driver '%s' (%s); set "
                     "WSYNC_CUDA_LIBRARY or run on a machine with a GPU\n",
                     api.path.c_str(), e ? e : "unknown error");
        std::exit(2);
    }
    auto sym = [&](const char *name, auto *fn) {
        void *p = dlsym(h, name);
        if (!p) {
            std::fprintf(stderr, "wsync bench: the CUDA driver '%s' lacks %s\n", api.path.c_str(),
                         name);
            std::exit(2);
        }
        *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
    };
    sym("cuInit", &api.Init);
    sym("cuGetErrorName", &api.GetErrorName);
    sym("cuDeviceGet", &api.DeviceGet);
    sym("cuDevicePrimaryCtxRetain", &api.DevicePrimaryCtxRetain);
    sym("cuCtxSetCurrent", &api.CtxSetCurrent);
    sym("cuCtxSynchronize", &api.CtxSynchronize);
    sym("cuMemAlloc_v2", &api.MemAlloc);
    sym("cuMemFree_v2", &api.MemFree);
    sym("cuMemcpyHtoDAsync_v2", &api.MemcpyHtoDAsync);
    sym("cuMemcpyDtoDAsync_v2", &api.MemcpyDtoDAsync);
    sym("cuMemcpyHtoD_v2", &api.MemcpyHtoD);
    sym("cuMemcpyDtoH_v2", &api.MemcpyDtoH);
}
inline std::string error(CUresult r, const char *what) {
    const char *name = nullptr;
    if (api.GetErrorName(r, &name) != 0 || !name) name = "unknown CUDA error";
    return std::string(what) + " failed: " + name + " (" + std::to_string(r) + ")";
}
// Throws the message: the caller decides whether that is die() or an engine failure frame.
inline void ok(CUresult r, const char *what) {
    if (r != 0) throw std::runtime_error(error(r, what));
}
// cuInit + the primary context of device 0, current on this thread.
inline void start_device0() {
    CUresult r = api.Init(0);
    if (r != 0) {
        std::fprintf(stderr, "wsync bench: %s (driver '%s')\n", error(r, "cuInit").c_str(),
                     api.path.c_str());
        std::exit(2);
    }
    CUdevice dev;
    CUcontext ctx;
    ok(api.DeviceGet(&dev, 0), "cuDeviceGet(0)");
    ok(api.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    ok(api.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}
inline std::vector<CUdeviceptr> alloc_each(const std::vector<TensorSpec> &m) {
    std::vector<CUdeviceptr> p(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i) ok(api.MemAlloc(&p[i], m[i].bytes), "cuMemAlloc_v2");
    return p;
}
inline void free_each(std::vector<CUdeviceptr> &p) {
    for (CUdeviceptr d : p)
        if (d) api.MemFree(d);
    p.clear();
}
}  // namespace cu

}  // namespace wsync_cli
