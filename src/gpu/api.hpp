// The one table through which libwsync calls the CUDA driver and NCCL.
//
// libwsync.so has no load-time dependency on libcuda, libcudart or libnccl: a GPU strategy
// opens them with dlopen when it is created, and reaches every function through the tables
// below. That keeps the host strategies working on machines without a GPU, lets a user point
// the library at the NCCL that PyTorch ships, and lets CI drive the GPU strategies' logic
// against a fake driver (tests/fake_gpu: device memory in host shared memory, IPC handles over
// /dev/shm, streams as worker threads, broadcast between processes).
//
// The types are declared here rather than taken from cuda.h and nccl.h so the library builds
// without the CUDA toolkit. They follow the driver's and NCCL's binary interfaces, which are
// stable: handles are pointers, CUdeviceptr is 64-bit, IPC handles are 64 bytes, an NCCL unique
// id is 128 bytes. tests/gpu/check_gpu_types.cpp compares them with the real headers whenever
// the toolkit is installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace wsync::gpu {

// ---- CUDA driver API (cuda.h) -------------------------------------------------------------
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st *;
using CUstream = struct CUstream_st *;
using CUevent = struct CUevent_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
struct CUipcMemHandle { char reserved[64]; };
struct CUuuid { char bytes[16]; };
// The virtual memory management API (cuda.h, "Virtual Memory Management"): what PyTorch's
// expandable segments and cudaMallocAsync pools are made of. A physical allocation's handle,
// exported as a POSIX file descriptor, is imported by another process and mapped there.
using CUmemGenericAllocationHandle = unsigned long long;
struct CUmemLocation {
    int type;  // CU_MEM_LOCATION_TYPE_DEVICE
    int id;    // the device ordinal
};
struct CUmemAccessDesc {
    CUmemLocation location;
    int flags;  // CU_MEM_ACCESS_FLAGS_PROT_*
};
constexpr int CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;
constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;

// The oldest driver libwsync's GPU strategies accept (cuDriverGetVersion: 1000 * major + 10 *
// minor): CUDA 12.0 (R525). The embedded pack kernel is PTX ISA 7.0 for sm_80 (see
// scripts/gen-ptx.sh), which drivers from CUDA 11.0 on could JIT; 12.0 is the floor tested
// against and stated in the README.
constexpr int kMinDriverVersion = 12000;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1;
// cuMemHostAlloc: pinned host memory kernels may read and write through a device pointer
// (cuMemHostGetDevicePointer), from every context (cuda.h).
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x01;
constexpr unsigned CU_MEMHOSTALLOC_DEVICEMAP = 0x02;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;  // cuda.h's CUdevice_attribute
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;     // unsigned int, a CU_MEMORYTYPE_*
constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;
constexpr int CU_POINTER_ATTRIBUTE_BUFFER_ID = 7;       // unsigned long long, never reused
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;  // int
// "1 if this pointer maps to an allocation that is suitable for cudaIpcGetMemHandle, 0
// otherwise" (cuda.h). Read into an int preset to 1, so a driver that writes one byte or four
// reads the same.
constexpr int CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10;
// The legacy default stream as a handle (cuda.h: #define CU_STREAM_LEGACY ((CUstream)0x1)):
// work recorded on it follows the work of every blocking stream of the context.
inline const CUstream CU_STREAM_LEGACY = reinterpret_cast<CUstream>(std::uintptr_t(1));

// X(field, exported symbol, return type, parameter list). Versioned symbols (_v2) are the ones
// cuda.h maps the plain names to since CUDA 4.0/11.x; see cuda.h's "#define cuMemAlloc
// cuMemAlloc_v2" block.
#define WSYNC_CUDA_FUNCTIONS(X)                                                                   \
    X(cuInit, "cuInit", CUresult, (unsigned int flags))                                           \
    X(cuDriverGetVersion, "cuDriverGetVersion", CUresult, (int *version))                         \
    X(cuGetErrorName, "cuGetErrorName", CUresult, (CUresult error, const char **str))             \
    X(cuGetErrorString, "cuGetErrorString", CUresult, (CUresult error, const char **str))         \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *count))                               \
    X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice * device, int ordinal))                     \
    X(cuDeviceGetUuid, "cuDeviceGetUuid_v2", CUresult, (CUuuid * uuid, CUdevice dev))             \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult, (int *value, int attrib, CUdevice dev)) \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult,                             \
      (CUcontext * ctx, CUdevice dev))                                                            \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice dev))        \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", CUresult, (CUcontext * ctx))                            \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext ctx))                              \
    X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void))                                     \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr * dptr, std::size_t bytes))             \
    X(cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr dptr))                                    \
    X(cuMemGetAddressRange, "cuMemGetAddressRange_v2", CUresult,                                  \
      (CUdeviceptr * base, std::size_t * size, CUdeviceptr dptr))                                 \
    X(cuPointerGetAttribute, "cuPointerGetAttribute", CUresult,                                   \
      (void *data, int attribute, CUdeviceptr ptr))                                               \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult,                                        \
      (CUdeviceptr dst, const void *src, std::size_t bytes, CUstream stream))                     \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult,                                        \
      (CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream))                     \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult,                                        \
      (void *dst, CUdeviceptr src, std::size_t bytes, CUstream stream))                           \
    X(cuMemHostAlloc, "cuMemHostAlloc", CUresult, (void **pp, std::size_t bytes, unsigned int flags)) \
    X(cuMemFreeHost, "cuMemFreeHost", CUresult, (void *p))                                        \
    X(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", CUresult,                        \
      (CUdeviceptr * dptr, void *p, unsigned int flags))                                          \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", CUresult, (CUipcMemHandle * handle, CUdeviceptr p)) \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", CUresult,                                      \
      (CUdeviceptr * p, CUipcMemHandle handle, unsigned int flags))                               \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", CUresult, (CUdeviceptr p))                      \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", CUresult,                       \
      (CUmemGenericAllocationHandle * handle, void *addr))                                        \
    X(cuMemRelease, "cuMemRelease", CUresult, (CUmemGenericAllocationHandle handle))              \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", CUresult,                     \
      (void *shareable, CUmemGenericAllocationHandle handle, int type, unsigned long long flags))  \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", CUresult,                 \
      (CUmemGenericAllocationHandle * handle, void *os_handle, int type))                         \
    X(cuMemAddressReserve, "cuMemAddressReserve", CUresult,                                       \
      (CUdeviceptr * ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,              \
       unsigned long long flags))                                                                 \
    X(cuMemAddressFree, "cuMemAddressFree", CUresult, (CUdeviceptr ptr, std::size_t size))        \
    X(cuMemMap, "cuMemMap", CUresult,                                                             \
      (CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle, \
       unsigned long long flags))                                                                 \
    X(cuMemUnmap, "cuMemUnmap", CUresult, (CUdeviceptr ptr, std::size_t size))                    \
    X(cuMemSetAccess, "cuMemSetAccess", CUresult,                                                 \
      (CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc *desc, std::size_t count))        \
    X(cuStreamCreate, "cuStreamCreate", CUresult, (CUstream * stream, unsigned int flags))        \
    X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult, (CUstream stream))                         \
    X(cuStreamQuery, "cuStreamQuery", CUresult, (CUstream stream))                                \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult,                                           \
      (CUstream stream, CUevent event, unsigned int flags))                                       \
    X(cuEventCreate, "cuEventCreate", CUresult, (CUevent * event, unsigned int flags))            \
    X(cuEventDestroy, "cuEventDestroy_v2", CUresult, (CUevent event))                             \
    X(cuEventRecord, "cuEventRecord", CUresult, (CUevent event, CUstream stream))                 \
    X(cuEventQuery, "cuEventQuery", CUresult, (CUevent event))                                    \
    X(cuModuleLoadData, "cuModuleLoadData", CUresult, (CUmodule * module, const void *image))     \
    X(cuModuleUnload, "cuModuleUnload", CUresult, (CUmodule module))                              \
    X(cuModuleGetFunction, "cuModuleGetFunction", CUresult,                                       \
      (CUfunction * fn, CUmodule module, const char *name))                                       \
    X(cuLaunchKernel, "cuLaunchKernel", CUresult,                                                 \
      (CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,         \
       unsigned int by, unsigned int bz, unsigned int shared_bytes, CUstream stream,              \
       void **params, void **extra))

// ---- NCCL (nccl.h) ------------------------------------------------------------------------
using ncclResult_t = int;
using ncclComm_t = struct ncclComm *;
struct ncclUniqueId { char internal[128]; };
constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclInProgress = 7;
constexpr int ncclUint8 = 1;

// The configuration struct as NCCL 2.14 introduced it (with ncclCommInitRankConfig and
// non-blocking communicators). NCCL reads a config by its size and version fields, so newer
// libraries accept this prefix; NCCL_CONFIG_INITIALIZER's magic and "undefined" value follow.
struct ncclConfig_t {
    std::size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
};
constexpr unsigned int kNcclConfigMagic = 0xcafebeef;
constexpr int kNcclConfigUndefInt = INT32_MIN;
constexpr int kNcclMinVersion = 21400;  // 2.14.0: ncclCommInitRankConfig, non-blocking init
// NCCL's version code: 2.8.x and older were X*1000+Y*100+Z, later X*10000+Y*100+Z (nccl.h).
std::string nccl_version_text(int code);

#define WSYNC_NCCL_FUNCTIONS(X)                                                                   \
    X(ncclGetVersion, "ncclGetVersion", ncclResult_t, (int *version))                             \
    X(ncclGetErrorString, "ncclGetErrorString", const char *, (ncclResult_t result))              \
    X(ncclGetUniqueId, "ncclGetUniqueId", ncclResult_t, (ncclUniqueId * id))                      \
    X(ncclCommInitRankConfig, "ncclCommInitRankConfig", ncclResult_t,                             \
      (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config))           \
    X(ncclCommGetAsyncError, "ncclCommGetAsyncError", ncclResult_t,                               \
      (ncclComm_t comm, ncclResult_t * error))                                                    \
    X(ncclCommAbort, "ncclCommAbort", ncclResult_t, (ncclComm_t comm))                            \
    X(ncclCommFinalize, "ncclCommFinalize", ncclResult_t, (ncclComm_t comm))                      \
    X(ncclCommDestroy, "ncclCommDestroy", ncclResult_t, (ncclComm_t comm))                        \
    X(ncclBroadcast, "ncclBroadcast", ncclResult_t,                                               \
      (const void *send, void *recv, std::size_t count, int datatype, int root, ncclComm_t comm, \
       CUstream stream))

#define WSYNC_GPU_FIELD(field, symbol, ret, params) ret(*field) params = nullptr;
struct CudaApi {
    WSYNC_CUDA_FUNCTIONS(WSYNC_GPU_FIELD)
    std::string path;    // the file that was opened
    int driver_version;  // cuDriverGetVersion, e.g. 13000
};
struct NcclApi {
    WSYNC_NCCL_FUNCTIONS(WSYNC_GPU_FIELD)
    std::string path;
    int version;  // ncclGetVersion
};
#undef WSYNC_GPU_FIELD

// The CUDA driver: the file named by the environment variable WSYNC_CUDA_LIBRARY, else
// libcuda.so.1. Opened and cuInit(0)-ed once per process (thread-safe); later calls return the
// same table. Throws WSYNC_ERR_UNAVAILABLE naming the file and the loader's or driver's error.
const CudaApi &cuda();
// "" when cuda() would succeed, else why not.
std::string cuda_unavailable_reason();
// "CUDA driver 13000 (libcuda.so.1)"; throws like cuda().
std::string cuda_runtime_text();

// NCCL: `path` if not empty (the strategy's "nccl_library" option), else the environment
// variable WSYNC_NCCL_LIBRARY, else libnccl.so.2 (so a user can point at the copy PyTorch ships,
// e.g. .../site-packages/nvidia/nccl/lib/libnccl.so.2). Each distinct file is opened once per
// process. Throws WSYNC_ERR_UNAVAILABLE naming the file, or the version found when it is older
// than 2.14.
const NcclApi &nccl(const std::string &path);
std::string nccl_unavailable_reason(const std::string &path);

// Throws WSYNC_ERR_INTERNAL-free errors for a failed driver call: "<what>: cuX failed:
// CUDA_ERROR_Y (text)". `status` picks the wsync status (WSYNC_ERR_SYSTEM by default;
// out-of-memory always maps to WSYNC_ERR_NO_MEMORY).
[[noreturn]] void cuda_fail(const CudaApi &api, CUresult rc, const std::string &what);
[[noreturn]] void nccl_fail(const NcclApi &api, ncclResult_t rc, const std::string &what);

// Calls a driver function and throws through cuda_fail on anything but CUDA_SUCCESS.
#define WSYNC_CU(api, call, what)                                                                 \
    do {                                                                                          \
        ::wsync::gpu::CUresult wsync_rc_ = (api).call;                                            \
        if (wsync_rc_ != ::wsync::gpu::CUDA_SUCCESS) ::wsync::gpu::cuda_fail((api), wsync_rc_, (what)); \
    } while (0)

// "GPU-1a2b3c4d-...": the form nvidia-smi and CUDA_VISIBLE_DEVICES use.
std::string uuid_text(const CUuuid &uuid, const char *prefix = "GPU-");
// Parses "GPU-<uuid>", "MIG-<uuid>" or a bare 32-hex-digit uuid (dashes anywhere ignored) into
// 16 bytes; false if it is none of these.
bool parse_uuid(const std::string &text, CUuuid *out);

}  // namespace wsync::gpu
