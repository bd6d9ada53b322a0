/*
 * wsync.h — libwsync: move model weights from trainers to inference engines.
 *
 * One C99 header; it includes only <stddef.h>, <stdint.h> and <stdbool.h>.
 *
 * ---------------------------------------------------------------------------------------------
 * Overview
 * ---------------------------------------------------------------------------------------------
 * A *strategy* (wsync_strategy_t) is made from a kind name and a JSON options string. Kinds:
 *   "shm"            host memory through one POSIX shared-memory segment (one machine);
 *   "cuda_ipc"       GPU memory through CUDA IPC handles (processes on the same GPUs), packed
 *                    into reusable device buckets or shared per allocation ("packed": false);
 *   "nccl_broadcast" GPU memory broadcast from the trainer to every receiver over NCCL; each
 *                    receiver also reports to the trainer's sender over TCP (a port of the
 *                    process that made the init info, named in it; the sender must be made
 *                    from that strategy), so failures, deaths and stalls are named there;
 *   "ucx"            host or GPU memory across machines through UCX (libucp.so.0, loaded at run
 *                    time), as an authenticated network service (docs/kinds.md, "ucx").
 * The GPU kinds open the CUDA driver (libcuda.so.1, or $WSYNC_CUDA_LIBRARY) and NCCL
 * (libnccl.so.2, $WSYNC_NCCL_LIBRARY or the "nccl_library" option) at run time: libwsync has no
 * load-time dependency on either, and without them those kinds fail with WSYNC_ERR_UNAVAILABLE.
 * The trainer side asks it for an *init-info blob*, which a controller forwards to the
 * engines. Trainers make a *sender* from the blob, engines a *receiver* (with their receiver
 * index). Each training step the trainer sends *chunks* (many tensors each) and gets one
 * *request blob* per chunk; the controller forwards those bytes to every receiver, whose loader
 * drives a *receive iteration* over tensor views. Ending the iteration acknowledges the chunk;
 * wsync_sender_flush() returns once every receiver has acknowledged every chunk.
 * This header states the contract every kind keeps and, briefly, where a kind changes it
 * (blocking, what memory a call reads, which statuses); how each kind works, and why, is in
 * docs/kinds.md; what each kind supports is data (wsync_strategy_kinds(), "capabilities").
 *
 * ---------------------------------------------------------------------------------------------
 * Rules that hold for every function (read these once)
 * ---------------------------------------------------------------------------------------------
 * Status.   Every function that can fail returns wsync_status_t. WSYNC_OK is 0. Error values
 *           are pinned forever; new ones may be added, so treat an unknown value as an error.
 * Messages. On failure a function stores a message naming the cause (the option key, the
 *           tensor, the receiver index, the peer's pid) in a per-thread slot read by
 *           wsync_last_error(). On success the slot is left untouched (like errno).
 * Outputs.  An output handle is written NULL (an output blob {NULL, 0}) when a call fails, so
 *           a failed call leaves nothing to free. Functions never keep a caller's pointer past
 *           their return unless the comment says so.
 * Freeing.  Every wsync_*_destroy(NULL), wsync_blob_free(NULL) and wsync_string_free(NULL) is
 *           a no-op. Blobs and strings returned by the library are freed only with
 *           wsync_blob_free() and wsync_string_free().
 * Threads.  The library is thread-safe in the sense that distinct handles may be used from
 *           distinct threads at the same time. One handle (and everything made from it, such as
 *           a receiver's iteration) must be used by one thread at a time; callers serialise.
 *           A handle may move between threads. Functions without a handle argument may be
 *           called from any thread at any time.
 * Blocking. Only functions documented as "Blocks" wait, and every wait has a deadline
 *           (an explicit timeout_ms argument or the strategy's "timeout_ms" option). Nothing
 *           waits forever.
 * Structs.  Every public struct that may grow has a `struct_size` field. Callers set it to
 *           sizeof(the struct) as their header declares it (the WSYNC_*_INIT initialisers below
 *           do), or 0, which means the struct's oldest layout (0.2 for those of 0.2, the first
 *           sized release; 0.1 callers, who zeroed the field then named reserved_, keep
 *           working). Every layout a struct has had stays accepted: a program built against an
 *           older header keeps working with a newer library. The library reads inputs up to
 *           struct_size (bytes past the fields it knows must be 0, else WSYNC_ERR_UNSUPPORTED).
 *           Outputs with a struct_size (set it before the call) get the fields that both the
 *           caller's layout and this library know, nothing past them, and struct_size set to
 *           the bytes written; a size below the struct's oldest layout is
 *           WSYNC_ERR_INVALID_ARGUMENT (outputs smaller than the library's layout: since
 *           0.7.0). Size history (layouts that grew): wsync_apply_result_t 0.6.0
 *           WSYNC_APPLY_RESULT_SIZE_0_6_0 bytes, 0.6.1 + device_copies.
 *           Tensor views (wsync_recv_next, wsync_recv_peek) are always written in the 0.2
 *           layout with struct_size set. In arrays (a chunk's tensors) the first element's
 *           struct_size is the stride and every element must carry the same value.
 * Errors never cross as exceptions, signals or aborts: every failure is a status.
 * fork():   a child forked from a process holding handles (a tokenizer or data-loader worker)
 *           does not hold what they hold: the library's liveness locks and listening sockets
 *           stay with the parent (closed in the child at fork, pthread_atfork), so a parent
 *           killed while the child lives is seen dead by its peers as if it had no child, and a
 *           restarted peer takes its place at once (since 0.7.0). In the child, a sender or
 *           receiver copy, and a strategy copy that made init info, is refused with
 *           WSYNC_ERR_WRONG_STATE naming both pids; its wsync_*_destroy() leaves it as it is
 *           (a no-op). A strategy that made no init info is options only and works in the
 *           child. Create handles in the process that uses them.
 * Trust.    Every word a peer process can write is validated before use: a stray write by a
 *           peer never crashes this process nor makes it wait past a deadline. Processes that
 *           share one trainer's memory are one trust domain, though: an engine that writes
 *           chosen words can pin its failures on another engine, and one that truncates the
 *           shared file makes the others die of SIGBUS (docs/failure-model.md, "Trust").
 *
 * ---------------------------------------------------------------------------------------------
 * Sections: 1 versions and statuses, 2 tensors, chunks and blobs, 3 strategies, 4 sender,
 *           5 receiver and receive iteration, 6 planner, 7 blobs and introspection.
 */
#ifndef WSYNC_H
#define WSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define WSYNC_API
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define WSYNC_API __attribute__((visibility("default")))
#else
#  define WSYNC_API
#endif

/* =============================================================================================
 * 1. Versions and statuses
 * ===========================================================================================*/

#define WSYNC_VERSION_MAJOR 0
#define WSYNC_VERSION_MINOR 7
#define WSYNC_VERSION_PATCH 0
/* One formula, forever: MAJOR * 10000 + MINOR * 100 + PATCH (0.2.0 -> 200).
 * What each release changed, and which wire, request and board formats it speaks: CHANGELOG.md
 * in the source tree. "Since X" below marks behaviour older releases lack. */
#define WSYNC_VERSION_NUMBER \
    (WSYNC_VERSION_MAJOR * 10000 + WSYNC_VERSION_MINOR * 100 + WSYNC_VERSION_PATCH)

/* The version of the library actually loaded, by the formula above. Never fails. A binding
 * compares (wsync_version_number() / 10000) with the major version it was written for. */
WSYNC_API uint32_t wsync_version_number(void);

/* The loaded library's version as static text, e.g. "0.1.0". Never NULL; never free it. */
WSYNC_API const char *wsync_version_string(void);

/* Status codes. Values are pinned; new codes may be added later. Forced to 32 bits. */
typedef enum wsync_status_t {
    WSYNC_OK = 0,
    WSYNC_ERR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or ill-formed argument or option   */
    WSYNC_ERR_UNSUPPORTED = 2,      /* valid, but not supported by this strategy or build      */
    WSYNC_ERR_UNAVAILABLE = 3,      /* a run-time dependency is missing (driver, NCCL, /dev/shm)*/
    WSYNC_ERR_MALFORMED = 4,        /* a blob is truncated, corrupt, foreign or of a wrong version*/
    WSYNC_ERR_MISMATCH = 5,         /* well-formed but does not fit: other strategy, stale
                                       request, chunk out of order, plan differs from the model */
    WSYNC_ERR_TIMEOUT = 6,          /* a deadline passed before the peers answered              */
    WSYNC_ERR_PEER = 7,             /* a peer died, detached, or reported failure               */
    WSYNC_ERR_NO_MEMORY = 8,        /* an allocation or a shared-memory reservation failed      */
    WSYNC_ERR_WRONG_STATE = 9,      /* a call out of order (e.g. receive while iterating)       */
    WSYNC_ERR_SYSTEM = 10,          /* an operating-system call failed; the message has errno   */
    WSYNC_ERR_INTERNAL = 11,        /* a bug in libwsync; please report the message             */
    WSYNC_ERR_INTEGRITY = 12,       /* received bytes or a blob failed their checksum           */
    WSYNC_ERR_ABANDONED = 13,       /* the sender abandoned the version (a send failed, it called
                                       wsync_sender_abandon, or the trainer died mid-version)   */
    WSYNC_ERR_SKIPPED = 14,         /* since 0.7.0: a later chunk of a version that already failed
                                       here, skipped unread (acknowledged to the sender as that
                                       version's failure, not a new one): nothing to load or
                                       report; the version's own status is in
                                       wsync_receiver_poll()'s failed_status. (A version the
                                       sender abandoned stays WSYNC_ERR_ABANDONED.)            */
    WSYNC_STATUS_FORCE_32BIT_ = 0x7fffffff
} wsync_status_t;

/* Static name of a status, e.g. "WSYNC_ERR_TIMEOUT"; "WSYNC_ERR_UNKNOWN" for values this
 * version does not know. Never NULL; never free it. Does not touch wsync_last_error(). */
WSYNC_API const char *wsync_status_string(wsync_status_t status);

/* The message of the last failure on the calling thread, e.g.
 * "shm: flush timed out after 2000 ms: receivers [1] did not acknowledge chunk seq 12".
 * Never NULL ("" when this thread has had no failure). The pointer stays valid until the next
 * failing wsync call on this thread; copy it to keep it. Never free it. */
WSYNC_API const char *wsync_last_error(void);

/* =============================================================================================
 * 2. Tensors, chunks and blobs
 * ===========================================================================================*/

/* Element type, laid out exactly as DLPack's DLDataType; the codes are DLPack's codes.
 * Element size in bytes is bits * lanes / 8, which must be a whole number. */
typedef struct wsync_dtype_t {
    uint8_t code;   /* WSYNC_DTYPE_* */
    uint8_t bits;   /* bits per lane: 8, 16, 32, 64, ... */
    uint16_t lanes; /* 1 for scalars */
} wsync_dtype_t;

#define WSYNC_DTYPE_INT 0
#define WSYNC_DTYPE_UINT 1
#define WSYNC_DTYPE_FLOAT 2
/* 3 is DLPack's opaque handle: rejected. */
#define WSYNC_DTYPE_BFLOAT 4
#define WSYNC_DTYPE_COMPLEX 5
#define WSYNC_DTYPE_BOOL 6
#define WSYNC_DTYPE_FLOAT8_E3M4 7
#define WSYNC_DTYPE_FLOAT8_E4M3 8
#define WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ 9
#define WSYNC_DTYPE_FLOAT8_E4M3FN 10
#define WSYNC_DTYPE_FLOAT8_E4M3FNUZ 11
#define WSYNC_DTYPE_FLOAT8_E5M2 12
#define WSYNC_DTYPE_FLOAT8_E5M2FNUZ 13
#define WSYNC_DTYPE_FLOAT8_E8M0FNU 14
#define WSYNC_DTYPE_FLOAT6_E2M3FN 15
#define WSYNC_DTYPE_FLOAT6_E3M2FN 16
#define WSYNC_DTYPE_FLOAT4_E2M1FN 17

/* Where a tensor's bytes live, laid out exactly as DLPack's DLDevice; the codes are DLPack's. */
typedef struct wsync_device_t {
    int32_t type;  /* WSYNC_DEVICE_* */
    int32_t index; /* device ordinal; 0 for host memory */
} wsync_device_t;

#define WSYNC_DEVICE_CPU 1
#define WSYNC_DEVICE_CUDA 2
#define WSYNC_DEVICE_CUDA_HOST 3 /* pinned host memory: treated as host memory */
#define WSYNC_DEVICE_ROCM 10
#define WSYNC_DEVICE_ROCM_HOST 11
#define WSYNC_DEVICE_CUDA_MANAGED 13

#define WSYNC_MAX_NDIM 16        /* most dimensions a tensor may have */
#define WSYNC_MAX_NAME_BYTES 1024 /* longest tensor name in bytes, without the NUL */
#define WSYNC_MAX_CHUNK_TENSORS 4194304 /* most tensors in one chunk (2^22): the most a receiver
                                           accepts, so a sender refuses more */
#define WSYNC_MAX_BLOB_BYTES 268435456u /* largest blob (init info or request) any call reads,
                                          256 MiB; a larger one is WSYNC_ERR_MALFORMED. 0.5. */

/* wsync_tensor_t.flags */
#define WSYNC_TENSOR_READ_ONLY 1u /* set on views whose memory must not be written */
#define WSYNC_TENSOR_PATCH 2u     /* set by wsync_recv_peek() on an entry that crossed as a
                                     patch (delta sync): take it with wsync_recv_patch() or
                                     wsync_recv_copy(), not as a view. 0.5. */

/* A tensor: a descriptor the caller fills for sending, or a view the library fills when
 * receiving. Only dense, row-major (C-contiguous) tensors with at least one element move.
 * As input, every pointer is borrowed for the duration of the call only. */
typedef struct wsync_tensor_t {
    const char *name;       /* NUL-terminated UTF-8, 1..WSYNC_MAX_NAME_BYTES bytes, unique in a
                               chunk; by convention dotted module paths ("layers.0.attn.q.weight") */
    void *data;             /* first element; ignored by the planner */
    const int64_t *shape;   /* ndim extents, each >= 1 */
    const int64_t *strides; /* NULL, or ndim strides in elements that must describe a compact
                               row-major layout (as torch reports for a contiguous tensor) */
    int32_t ndim;           /* 0..WSYNC_MAX_NDIM; 0 is a scalar of one element */
    wsync_dtype_t dtype;
    wsync_device_t device;
    uint32_t flags;         /* WSYNC_TENSOR_*; must be 0 on input */
    uint32_t struct_size;   /* 0 or sizeof(wsync_tensor_t); see "Structs" above */
} wsync_tensor_t;

/* wsync_chunk_t.flags */
#define WSYNC_CHUNK_LAST 1u /* this chunk commits the current sync version (see section 4) */

/* A chunk: the tensors moved by one wsync_sender_send_chunk(). Usually one chunk of a plan. */
typedef struct wsync_chunk_t {
    const wsync_tensor_t *tensors; /* count descriptors, borrowed for the call */
    size_t count;                  /* >= 1; or 0 with WSYNC_CHUNK_LAST and tensors NULL: an empty
                                      closing chunk, the same as wsync_sender_commit() */
    uint32_t flags;                /* WSYNC_CHUNK_*; other bits must be 0 */
    uint32_t struct_size;          /* 0 or sizeof(wsync_chunk_t) */
} wsync_chunk_t;

/* A byte range of one tensor: a *part*. A tensor larger than a bucket travels as parts in
 * consecutive chunks of one version (the planner's "split" option makes them; send them with
 * wsync_sender_send_parts()). offset and bytes count bytes of the whole tensor (row-major), both
 * multiples of its element size; bytes = 0 means the whole tensor. Never grows. 0.5. */
typedef struct wsync_part_t {
    uint64_t offset; /* first byte of the part within the whole tensor */
    uint64_t bytes;  /* the part's size, >= 1; 0: the whole tensor (offset must then be 0) */
} wsync_part_t;

/* Bytes owned by the library (init info, requests). Copy them anywhere; free with
 * wsync_blob_free(). Blobs are self-describing (see docs/wire-format.md): magic, format
 * version, blob type and strategy kind, then the strategy's fields, in CBOR. */
typedef struct wsync_blob_t {
    uint8_t *data;
    size_t size;
} wsync_blob_t;

/* Frees blob->data and sets *blob to {NULL, 0}. NULL, or a blob already {NULL, 0}, is a no-op. */
WSYNC_API void wsync_blob_free(wsync_blob_t *blob);

/* Frees a string returned by the library (JSON outputs). NULL is a no-op. */
WSYNC_API void wsync_string_free(char *str);

/* =============================================================================================
 * 3. Strategies
 * ===========================================================================================*/

typedef struct wsync_strategy_t wsync_strategy_t;

/* Creates a strategy of the given kind ("shm"; see wsync_strategy_kinds()) with options, a JSON
 * object as text ("{\"receivers\": 2}"); NULL or "" means all defaults. Options are strictly
 * validated: an unknown key, a key given twice, a value of the wrong type or out of range fails
 * with WSYNC_ERR_INVALID_ARGUMENT naming the key. Each option belongs to one side
 * (wsync_strategy_describe_options() says which): a strategy that only makes receivers accepts
 * the trainer's options and ignores them (what the trainer chose reaches every receiver in the
 * init info), so one configuration may serve both sides; the receiver options ("verify",
 * "copy_threads", "delta_mirror", ...) act only on receivers that strategy makes.
 * Every kind also takes the delta-sync options ("delta", "delta_decide", "delta_max_percent",
 * "delta_anchor_every", and where the kind has them "delta_threads", "delta_base_memory";
 * docs/delta.md, docs/kinds.md). With "delta" other than "off" the sender keeps a copy of every
 * tensor it sent (up to twice the tensors' bytes; host memory for "shm" and "ucx", the trainer's
 * GPU or pinned host memory for "cuda_ipc" and "nccl_broadcast"). WSYNC_ERR_UNSUPPORTED, saying
 * why, for an option the kind does not take ("delta_base_memory" on "shm" or "ucx"), for a
 * "delta" other than "off" on "cuda_ipc" with packed=false or several senders, and on a GPU
 * kind with a "dtype" cast.
 * A kind this build does not know fails with WSYNC_ERR_UNSUPPORTED; a kind whose run-time
 * dependency is missing (e.g. no CUDA driver, or libcrypto.so.3 for "ucx") fails with
 * WSYNC_ERR_UNAVAILABLE naming what is missing.
 * "ucx" differs in three ways a caller must know (docs/kinds.md, "ucx"): it sets
 * UCX_TCP_CONN_NB=y in the process environment with setenv() before its first UCX context,
 * unless already set (a process that starts threads first sets it itself); its init info is a
 * secret (it holds the key that authenticates engines: hand it only to the engines meant to
 * attach); and its option "net_devices" is required (WSYNC_ERR_INVALID_ARGUMENT naming it when
 * missing; "all" listens on every interface). Over tcp ("transports" "tcp", "data_path" "auto")
 * the sender also listens on a second TCP port, on the first device "net_devices" names, for
 * the engines' data streams; only engines that prove the connection's key are served there
 * (docs/failure-model.md, "Who may talk to a trainer"). With checksums on, a host chunk sent
 * there is hashed as it is sent rather than at send_chunk, and an engine fetches its checksums
 * after its bytes (since 0.8.0, ucx wire version 3: a library of ucx wire version 2, 0.7, and
 * this one refuse each other's init info with WSYNC_ERR_MALFORMED naming the versions).
 * Borrows kind and options_json for the call. On success *out is a new strategy, freed with
 * wsync_strategy_destroy(). Does not block. */
WSYNC_API wsync_status_t wsync_strategy_create(const char *kind, const char *options_json,
                                               wsync_strategy_t **out);

/* Destroys a strategy. Senders and receivers made from it stay valid (they hold what they need);
 * resources the strategy made for its init info (the shm segment) live until the sender made
 * from that init info is destroyed too. NULL is a no-op. Does not block. */
WSYNC_API void wsync_strategy_destroy(wsync_strategy_t *strategy);

/* Writes the strategy's kind name to *kind_out: static text, never freed. */
WSYNC_API wsync_status_t wsync_strategy_kind(const wsync_strategy_t *strategy,
                                             const char **kind_out);

/* Lists the kinds this build knows, as a JSON array of objects
 * [{"kind": "shm", "available": true, "reason": "", "runtime": "", "stability": "stable"}, ...]:
 * "reason" says what is missing when a kind is unavailable; "runtime" what an available kind
 * would use, e.g. "CUDA driver 13000 (libcuda.so.1); NCCL 2.28.9 (libnccl.so.2)"; "stability"
 * is "experimental" for a kind whose options and wire may change in any minor version
 * (0.5: "ucx"), else "stable" (since 0.5). "capabilities" (since 0.7) is what the kind does
 * differently, as data rather than prose, so a caller (or a test suite) asks instead of matching
 * kind names:
 *   "tensor_memory": array of "host" and/or "cuda", where sender tensors and receiver views live;
 *   "senders": "one", or "many" (several senders' requests of a chunk merge, wsync_request_merge);
 *   "drop_receiver": whether wsync_sender_drop_receiver() lets the others go on (else
 *       WSYNC_ERR_UNSUPPORTED);
 *   "reattach": whether a process made later with an index another receiver held (a restarted
 *       or replacement engine) takes part from the next version;
 *   "collective": whether the receivers take each chunk together, so that one receiver that
 *       dies, stalls or fails fails it on all and ends the sender;
 *   "gpu_per_receiver": whether the sender and every receiver need a GPU of their own;
 *   "delta": "none", "host" or "device", where delta sync (docs/delta.md) runs.
 * Keys are only ever added; a caller ignores keys it does not know and treats a missing key as
 * unknown (a library older than 0.7 has no "capabilities"). docs/conformance.md lists how the
 * conformance suite reads each. *json_out is freed with wsync_string_free(). Does not block. */
WSYNC_API wsync_status_t wsync_strategy_kinds(char **json_out);

/* Describes a kind's options as a JSON object: {"key": {"type": "uint", "default": 2,
 * "min": 1, "max": 64, "side": "sender", "doc": "...", "stability": "stable"}, ...}; a uint
 * option without a default has "default": null (unset unless given: "ucx"'s receiver option
 * "device"); an "experimental" option (0.5: the delta options) may change in any minor version
 * (since 0.5).
 * *json_out is freed with wsync_string_free(). Fails with WSYNC_ERR_UNSUPPORTED for an unknown
 * kind. */
WSYNC_API wsync_status_t wsync_strategy_describe_options(const char *kind, char **json_out);

/* Trainer side: makes the init info that every sender and receiver of this sync is created
 * from, and whatever the kind needs to exist first (docs/kinds.md, "Init info": a segment for
 * "shm" and "cuda_ipc", the NCCL unique id for "nccl_broadcast", the session key for "ucx").
 * "nccl_broadcast": the unique id is in the blob, so this process must stay alive until the
 * group is formed; a "device" this process does not see fails here with
 * WSYNC_ERR_INVALID_ARGUMENT. Call once per strategy; a second call fails with
 * WSYNC_ERR_WRONG_STATE. A segment larger than /dev/shm can hold, or than this process's
 * file-size limit (RLIMIT_FSIZE, checked first, so the kernel's SIGXFSZ is never raised; since
 * 0.7.0), fails with WSYNC_ERR_NO_MEMORY naming the cause.
 * On success *out holds the blob, freed with
 * wsync_blob_free(). May take time proportional to the buckets' size (pre-faulting); does not
 * wait for peers. */
WSYNC_API wsync_status_t wsync_strategy_create_init_info(wsync_strategy_t *strategy,
                                                         wsync_blob_t *out);

/* =============================================================================================
 * 4. Sender (trainer side)
 *
 * Versions are transactions. The chunks of one sync form a *version* (1, 2, ...): it begins
 * with its first chunk and is committed by a chunk flagged WSYNC_CHUNK_LAST (or by
 * wsync_sender_commit(), when a producer learns only afterwards that it is done). The commit's
 * request carries the version's manifest: tensor count, bytes, chunk count and a digest of the
 * name/dtype/shape table of every chunk. A receiver completes a version only when it received,
 * verified and ended every chunk and its own tally equals the manifest.
 * When any call that publishes (send_chunk, commit) fails after the version has published a
 * chunk, the version is *abandoned*: receivers that began it fail it with WSYNC_ERR_ABANDONED
 * (they learn it from the acknowledgement board at their next call, or from the next version's
 * first request), and the next chunk begins a new version number. Nothing of an abandoned
 * version is ever completed anywhere.
 * ===========================================================================================*/

typedef struct wsync_sender_t wsync_sender_t;

/* Creates a sender from init info (len bytes at init, borrowed for the call). For "shm" the
 * strategy must be the one whose wsync_strategy_create_init_info() made this blob; a blob of
 * another strategy or kind fails with WSYNC_ERR_MISMATCH (WSYNC_ERR_WRONG_STATE when this
 * strategy made no init info at all, e.g. one created for an engine), a corrupt one with
 * WSYNC_ERR_MALFORMED (WSYNC_ERR_INTEGRITY if its checksum fails). For "cuda_ipc" any process
 * of the host may create a sender from the blob (one per trainer GPU, "senders" in all).
 * On success *out is freed with wsync_sender_destroy().
 * Does not block, except for "nccl_broadcast": it joins the group as rank 0 and blocks until
 * every receiver has joined, up to the "timeout_ms" option; then the communicator is aborted
 * and the call fails with WSYNC_ERR_TIMEOUT (or WSYNC_ERR_PEER if NCCL reported an error, e.g.
 * another rank on this GPU, which the message names as the likely cause). A receiver refused at
 * its creation (one on this sender's GPU) never joins, so this call then times out, naming this
 * GPU and that cause. "nccl_broadcast" fails with WSYNC_ERR_MISMATCH, before joining, when the
 * strategy's "device" is another GPU than the one the init info names (since 0.5), and with
 * WSYNC_ERR_INVALID_ARGUMENT when `strategy` did not make the init info or made a sender from it
 * already (since 0.7: its receivers report there). */
WSYNC_API wsync_status_t wsync_sender_create(wsync_strategy_t *strategy, const uint8_t *init,
                                             size_t len, wsync_sender_t **out);

/* Destroys a sender without waiting for receivers' acknowledgements (call wsync_sender_flush()
 * first to know they are done) and releases what it holds; for "shm" the segment's name is
 * removed, so no name is left behind. A version left open is abandoned. NULL is a no-op.
 * Does not block (beyond joining a helper thread that wakes within 100 ms), except:
 *   "cuda_ipc" with "packed" (default): its device buckets are mapped by receivers, and freeing
 *     memory another process still maps is undefined behaviour in CUDA, so it first waits, up
 *     to the "release_timeout_ms" option, until every receiver is destroyed, dropped or dead (as
 *     wsync_sender_wait_released(sender, WSYNC_ALL_VERSIONS, ...)); receivers still mapping the
 *     buckets then leave them allocated until this process exits (the driver frees them then)
 *     rather than freed under their mappings;
 *   "nccl_broadcast": NCCL finalizes the communicator, letting queued broadcasts complete, for
 *     up to the "timeout_ms" option; then the communicator is aborted (receivers still waiting
 *     for a broadcast fail). */
WSYNC_API void wsync_sender_destroy(wsync_sender_t *sender);

/* Starts moving one chunk of the current version and writes its request blob to *request_out
 * (freed with wsync_blob_free()); forward those bytes to every receiver. The tensors' memory is
 * read during the call only (for "shm" it is packed into a bucket); it may be changed once the
 * call returns, except for "cuda_ipc" with "packed": false, whose receivers read the trainer's
 * own memory: those tensors must stay unchanged (and allocated) until wsync_sender_flush()
 * returns. GPU kinds take WSYNC_DEVICE_CUDA tensors, all on one GPU per sender; with
 * "synchronize" (default) the sender first orders itself after the work queued on the legacy
 * default stream (work on other streams the caller synchronises). "cuda_ipc" with
 * "packed": false refuses a tensor whose memory it cannot share with WSYNC_ERR_UNSUPPORTED
 * naming it; after a tensor moved, free its old memory only after
 * wsync_sender_wait_released() (docs/kinds.md, "Sending").
 * Tensor descriptors are validated first: NULL data, zero elements, non-contiguous strides,
 * unknown dtype or device, names that are empty, too long, not UTF-8 or duplicated, shape
 * products that overflow fail with WSYNC_ERR_INVALID_ARGUMENT naming the tensor; nothing is
 * published and the version is not touched (bad input loses nothing).
 * A chunk holds 1..WSYNC_MAX_CHUNK_TENSORS tensors (receivers refuse more; 0 only for an empty
 * closing chunk); another count fails with WSYNC_ERR_INVALID_ARGUMENT before any descriptor is
 * read.
 * A chunk flagged WSYNC_CHUNK_LAST commits the version and the next chunk begins version + 1.
 * "ucx" takes host tensors and WSYNC_DEVICE_CUDA tensors of one GPU per sender, mixed in a
 * chunk (another GPU: WSYNC_ERR_INVALID_ARGUMENT naming the tensor; other device types:
 * WSYNC_ERR_UNSUPPORTED; no usable CUDA driver for device tensors: WSYNC_ERR_UNAVAILABLE, the
 * version abandoned); engines get host memory.
 * Every kind that reads device tensors with a kernel first checks that each lies whole in
 * memory the CUDA driver knows (WSYNC_ERR_INVALID_ARGUMENT naming the tensor and address, before
 * anything is launched or published).
 * Also blocks until the chunk's device tensors are read: "cuda_ipc" and "ucx" return once their
 * pack is complete on the GPU; "nccl_broadcast" once its pack has read the tensors and the
 * broadcast is queued (it moves while the caller prepares the next chunk). A pack or stream not
 * done by "timeout_ms" fails with WSYNC_ERR_TIMEOUT naming the GPU or stream and the chunk (the
 * version is abandoned; the GPU may still read the tensors when the pack runs; on "ucx" later
 * chunks with device tensors fail at once while it has not finished). How each kind packs,
 * stages and pins memory: docs/kinds.md, "Sending".
 * Blocks while every bucket is still being read by some receiver, up to the strategy's
 * "timeout_ms" option; then fails with WSYNC_ERR_TIMEOUT (or WSYNC_ERR_PEER if a receiver died,
 * detached or failed a chunk) naming the receivers, the chunk is not sent and the version is
 * abandoned (see above); wsync_sender_failure() gives each receiver's part as fields.
 * Receivers dropped with wsync_sender_drop_receiver() are not waited for. */
WSYNC_API wsync_status_t wsync_sender_send_chunk(wsync_sender_t *sender,
                                                 const wsync_chunk_t *chunk,
                                                 wsync_blob_t *request_out);

/* wsync_sender_send_chunk() for a chunk that may carry parts of tensors (split tensors, see
 * wsync_part_t): parts is NULL (the same as wsync_sender_send_chunk()) or chunk->count ranges,
 * parts[k] for chunk->tensors[k], {0, 0} for a tensor sent whole. A part's descriptor describes
 * the whole tensor (name, dtype, shape, data at its first element); only bytes
 * [offset, offset + bytes) of it are read and moved, and the request's table marks the entry as
 * that part, with its own checksum. The parts of one tensor must follow each other in one
 * version: offset 0 first, each next part where the previous one ended, the last one ending at
 * the tensor's size, at most one part of a tensor per chunk, and no chunk may commit the
 * version while a tensor's parts are incomplete. A part that breaks these rules (a range outside
 * the tensor or not a multiple of its element size, out of order, a commit too early) fails with
 * WSYNC_ERR_INVALID_ARGUMENT naming the tensor before anything is published; the version stays
 * open. A sender with the "delta" option on ("auto", "on") refuses parts with
 * WSYNC_ERR_UNSUPPORTED (split tensors always go dense: run delta "off" or raise "bucket_bytes");
 * the version stays open. GPU kinds move parts like tensors; a "dtype" cast scales each part's
 * range with the element size. Borrows chunk and parts for the call. Blocks, fails and owns
 * *request_out like wsync_sender_send_chunk(). 0.5. */
WSYNC_API wsync_status_t wsync_sender_send_parts(wsync_sender_t *sender,
                                                 const wsync_chunk_t *chunk,
                                                 const wsync_part_t *parts,
                                                 wsync_blob_t *request_out);

/* Commits the current version without data: the same as an empty chunk flagged
 * WSYNC_CHUNK_LAST. *request_out (freed with wsync_blob_free()) must be forwarded to every
 * receiver like any request; receivers complete the version when they end its iteration (it
 * yields no tensor). Fails with WSYNC_ERR_WRONG_STATE when the version has no chunk yet (there
 * is nothing to commit). Blocks and fails like wsync_sender_send_chunk(); a failure abandons
 * the version. */
WSYNC_API wsync_status_t wsync_sender_commit(wsync_sender_t *sender, wsync_blob_t *request_out);

/* Abandons the current version if it has published a chunk (no-op otherwise): receivers that
 * began it fail it with WSYNC_ERR_ABANDONED, and the next chunk begins a new version number.
 * Use it when the trainer itself gives up on a sync (its own error between chunks). Does not
 * block. */
WSYNC_API wsync_status_t wsync_sender_abandon(wsync_sender_t *sender);

/* Waits until every receiver (but dropped ones) has acknowledged every chunk this sender has
 * sent so far (with several "cuda_ipc" senders, each sender's own chunks only). A chunk of an
 * abandoned version that a receiver had not begun is withdrawn instead and not waited for (a
 * receiver given its request later refuses it and reads nothing of it: WSYNC_ERR_ABANDONED, or
 * WSYNC_ERR_MISMATCH as stale once a later chunk holds the bucket); send_chunk's wait for a
 * free bucket does the same. Receivers' failures of a version this sender abandoned are not
 * reported (the version failed everywhere already), nor are a dropped receiver's. With several "cuda_ipc" senders such
 * a chunk is waited for until the receiver is given a later one. Returns
 * WSYNC_OK, or:
 *   WSYNC_ERR_PEER when a receiver failed a chunk, died or detached owing one; the message
 *     carries that receiver's own status, message, version and chunk ("shm: receiver 1 (pid
 *     42) failed chunk 3 of version 2: WSYNC_ERR_MISMATCH: tensor 'x' ..."). On "shm",
 *     "cuda_ipc" and "ucx" the flush does not return at the first failure: a receiver that
 *     failed is no longer waited for, the others are until each has answered or failed, so one
 *     error names every receiver that failed what was flushed; at the deadline it also names,
 *     as WSYNC_FAILURE_TIMEOUT entries, the receivers that did not answer. On "ucx" a receiver
 *     whose connection failed (DIED) and that re-attached with its index and completed the
 *     version before this flush returned is not reported (it has the version);
 *   WSYNC_ERR_TIMEOUT after timeout_ms (>= 0; 0 polls) naming the receivers that did not
 *     answer (a frozen engine is one), when none failed.
 * Each failure a receiver recorded (a chunk it failed) is reported once by each sender, oldest
 * first. A receiver that died or detached owing a chunk is a state, not an event: it is
 * reported at every flush and send_chunk that would wait for it, until it re-attaches (then
 * once more, naming the new process) or is dropped. After a failure,
 * wsync_sender_failure_count()/wsync_sender_failure() list every receiver's failure as fields;
 * the trainer may then drop the failed receivers (wsync_sender_drop_receiver()) and flush
 * again, or resend the version. A failed flush does not abandon a committed version: receivers
 * that acknowledged it have it.
 * Blocks up to timeout_ms. For "nccl_broadcast" a receiver that died, or whose broadcast is
 * still pending at the deadline, aborts the communicator: every later call on the sender fails
 * with WSYNC_ERR_PEER. */
WSYNC_API wsync_status_t wsync_sender_flush(wsync_sender_t *sender, int64_t timeout_ms);

/* wsync_sender_wait_released(): every version, i.e. no receiver maps anything of the sender. */
#define WSYNC_ALL_VERSIONS UINT64_MAX

/* Waits until the trainer may free or reallocate memory that it shared up to `version` and that
 * `version` does not share any more; with version WSYNC_ALL_VERSIONS, any memory it shared.
 * Only "cuda_ipc" with "packed": false shares the trainer's own memory: each receiver keeps the
 * allocations it imported (cuIpcOpenMemHandle) open while versions use them, closes those that
 * a version it ends no longer uses, and then announces "released through that version" on the
 * acknowledgement board; CUDA makes freeing memory before every importer has closed it
 * undefined behaviour. So after a tensor moved (re-allocated, or the allocator wants to return
 * its segment), sync a version that no longer names the old memory, flush it, call this with
 * that version, and only then free the old memory (e.g. torch.cuda.empty_cache()). Memory the
 * version still uses stays mapped: free it only after a later version that no longer uses it is
 * released, or after WSYNC_ALL_VERSIONS (every receiver destroyed, dropped or dead).
 * Other kinds, and "packed": true, copy the tensors while sending: it returns WSYNC_OK at once.
 * Receivers that are dropped, destroyed or dead, that never attached, or that joined after the
 * version, map nothing of it and are not waited for (a dropped receiver still alive closes its
 * mappings only when it is destroyed: free memory it mapped after WSYNC_ALL_VERSIONS or its end).
 * `version` is a version this sender has finished (1 .. wsync_sender_version() - 1; an
 * abandoned version is released when a later version is) or WSYNC_ALL_VERSIONS.
 * Returns WSYNC_OK, or:
 *   WSYNC_ERR_INVALID_ARGUMENT for timeout_ms < 0 or a version this sender has not finished;
 *   WSYNC_ERR_TIMEOUT after timeout_ms (>= 0; 0 polls) naming the receivers that still map the
 *     memory and the version each has released through (also as wsync_sender_failure() entries,
 *     what WSYNC_FAILURE_TIMEOUT); a receiver releases a version when its caller ends or fails
 *     the version's last chunk, so an engine that stopped receiving is one.
 * Borrows nothing. Blocks up to timeout_ms. Same threading as every sender call (one thread at a
 * time per sender). */
WSYNC_API wsync_status_t wsync_sender_wait_released(wsync_sender_t *sender, uint64_t version,
                                                    int64_t timeout_ms);

/* The sync version the next chunk will belong to: before any chunk is sent, 1, or for a
 * "cuda_ipc" sender of a strategy with one sender ("senders": 1, the default) made on init info
 * that an earlier sender used (a restarted trainer process keeping its engines), the version
 * after the newest that sender began or abandoned, so engines still attached take the new
 * sender's versions as newer ones. Several "cuda_ipc" senders number versions in lockstep from
 * 1: they are made once per init info (a rank made again mid-run starts at 1, and its
 * engines refuse its versions as stale until it passes theirs: make a new init info). */
WSYNC_API wsync_status_t wsync_sender_version(const wsync_sender_t *sender,
                                              uint64_t *version_out);

/* Stops waiting for receiver `index` (a dead, frozen or failing engine), so the others keep
 * syncing. The receiver, if still alive, fails its next call with WSYNC_ERR_PEER saying it was
 * dropped. A receiver dropped while an iteration is open (a slow or frozen loader) is not
 * waited for either: the sender may pack later chunks into the bucket it reads ("shm", also
 * arena tensors the trainer changes; "cuda_ipc" buckets), so its views may show other bytes.
 * Its iteration therefore fails: wsync_recv_next(), wsync_recv_copy(), wsync_recv_patch() and
 * wsync_recv_end() return WSYNC_ERR_PEER saying it was dropped while it read the chunk (also
 * when the overwrite made a checksum fail), and the version is never completed there; its
 * caller must not serve what it loaded ("cuda_ipc" checks once the loader's copies are
 * complete, with "synchronize" on). "ucx" views are the engine's own pulled and verified
 * copy, which the trainer cannot change: its open iteration ends as it would have
 * (wsync_recv_end() may return WSYNC_OK, and a version it completes is bit-exact), and its next
 * call fails with WSYNC_ERR_PEER. The sender does not report a dropped receiver's
 * failures (that one included), so the others' syncs go on undisturbed. A receiver process made
 * afterwards with the same index (a restarted engine) re-attaches and takes part from the next
 * version that begins after it attached, once the dropped receiver is destroyed or its process
 * has ended ("shm", "cuda_ipc": until then the index stays held, and wsync_receiver_create()
 * fails with WSYNC_ERR_WRONG_STATE saying it was dropped and naming the pid). Fails with
 * WSYNC_ERR_INVALID_ARGUMENT for an index out of range, WSYNC_ERR_UNSUPPORTED for kinds without
 * membership ("nccl_broadcast": its group is fixed). Does not block. */
WSYNC_API wsync_status_t wsync_sender_drop_receiver(wsync_sender_t *sender, uint32_t index);

/* The CUDA stream (a CUstream / cudaStream_t, e.g. torch.cuda.current_stream().cuda_stream)
 * that the caller queues its writes to the tensors on. With "synchronize" (default), GPU kinds
 * order their reads of the tensors after the work queued on this stream before each
 * wsync_sender_send_chunk() ("cuda_ipc" polls an event recorded there against "timeout_ms";
 * "nccl_broadcast" makes its pack wait for it on the GPU), instead of after the legacy default
 * stream; work on other streams stays the caller's to order. NULL (the initial setting)
 * restores the legacy default stream. The stream is borrowed: it must stay valid until the next
 * call of this function or the sender's destruction, and belong to the sender's GPU and context.
 * "ucx" orders the packs of its device tensors the same way, always (it has no "synchronize").
 * Kinds that read no GPU memory ("shm") accept and ignore it. Takes effect from the next chunk.
 * Returns WSYNC_OK, or WSYNC_ERR_INVALID_ARGUMENT for a NULL sender. Does not block. 0.3. */
WSYNC_API wsync_status_t wsync_sender_set_stream(wsync_sender_t *sender, void *stream);

/* The sender's arena: host memory inside the shared segment where a trainer may keep its own
 * tensors (its parameters, as torch's share_memory_() would), so that they cross without being
 * packed. "shm" has one when made with the "arena_bytes" option (rounded up to whole pages;
 * reserved and pre-faulted with the segment, zero at first), and since 0.8.0 "ucx" too (private
 * anonymous memory of the trainer's, pre-faulted, zero at first, never registered with UCX;
 * see "ucx" below); other kinds and a sender without the option give *base = NULL and
 * *bytes = 0 and WSYNC_OK.
 * The library never writes the arena; the caller lays out what it keeps there. A tensor passed
 * to wsync_sender_send_chunk() or wsync_sender_send_parts() whose bytes lie wholly in the arena
 * starting at a multiple of 256 bytes from *base is sent in place: the request points the
 * engines at it (with checksums on it is hashed where it lies, one read, no copy); any other
 * tensor is packed into a bucket as usual. Each engine then reads the trainer's memory itself,
 * once, instead of the trainer copying into a bucket and the engine copying out of it.
 * In exchange, a tensor sent in place is borrowed until every receiver has acknowledged its
 * chunk, not only for the call: the caller must not write it until wsync_sender_flush()
 * returns WSYNC_OK for its version (or the version is abandoned and its receivers failed it).
 * A write before then is what the engines read: with checksums on it fails the version on
 * them with WSYNC_ERR_INTEGRITY (nobody loads a torn tensor), with checksums off it may be
 * loaded torn. Receivers map the arena read-only; their views of an in-place tensor point into
 * it and stay valid until their iteration ends, as views into a bucket do.
 * A segment with an arena has layout 4: a receiver of a library without arenas (before 0.5)
 * refuses it with WSYNC_ERR_MISMATCH at wsync_receiver_create().
 * "ucx" sends in place a whole chunk or nothing: a chunk of host tensors that lie in the arena
 * exactly as the sender would pack them (the first at a multiple of 256 bytes from *base, each
 * next one at the first multiple of 256 bytes after the previous one's end, in the order
 * given; a part of a split tensor counts from the part's first byte) is served from where it
 * lies, bytes between the tensors included; any other chunk is packed into staging memory as
 * usual. With checksums on, such a chunk is hashed where it lies at send_chunk when its bytes
 * travel over UCX; over the data stream (since 0.8.0, "data_path" "auto" over tcp) each piece
 * is hashed as it is first sent and the checksums follow the bytes, so a write before the
 * flush fails the version with WSYNC_ERR_INTEGRITY on every engine that reads the bytes after
 * it, while the bytes of a piece no engine has read yet are taken as they are then (every
 * engine loads the same bytes or fails; docs/data-path.md, "Checksums that follow the bytes"). The trainer keeps no staging copy of an in-place chunk (a 1 GiB
 * model: 0.9 GB of trainer memory rather than 2.7 GB, docs/architecture.md). Such a chunk is
 * leased only to receivers that owe its version (a receiver that attached after the version
 * began is refused it with WSYNC_ERR_ABANDONED and gets the next version), and once
 * wsync_sender_flush() returns WSYNC_OK no lease or fetch of any in-place chunk is served
 * again (queued fetches included); only a send already under way then (to a receiver dropped
 * meanwhile) still reads its range until it ends, so with checksums off that receiver may see
 * the next step's bytes. An engine that re-attaches while such a version is open (after a
 * link outage) is a late joiner for it: it is not served the version, and the flush names it
 * as one that died (with staging it could complete it). Receivers see no difference: the wire
 * is the same.
 * *base stays valid while the sender exists; "shm" unmaps the memory when both the sender and
 * the strategy that created it are destroyed, "ucx" when the sender is, so nothing may use it
 * after that.
 * Returns WSYNC_OK, or WSYNC_ERR_INVALID_ARGUMENT for NULL arguments (outputs are zeroed when
 * non-NULL). Does not block. Any thread. 0.5. */
WSYNC_API wsync_status_t wsync_sender_arena(const wsync_sender_t *sender, void **base,
                                            uint64_t *bytes);

/* wsync_failure_t.what */
#define WSYNC_FAILURE_FAILED 1    /* the receiver failed a chunk (its loader, checksum, order) */
#define WSYNC_FAILURE_DIED 2      /* the receiver's process died owing a chunk                 */
#define WSYNC_FAILURE_DETACHED 3  /* the receiver was destroyed owing a chunk                  */
#define WSYNC_FAILURE_TIMEOUT 4   /* the receiver did not answer by the deadline               */
#define WSYNC_FAILURE_DROPPED 5   /* the receiver was dropped by the sender                    */
#define WSYNC_NO_CHUNK UINT32_MAX /* wsync_failure_t.chunk_index when no chunk is known        */

/* One receiver's failure as the sender learnt it: data, not only text. */
typedef struct wsync_failure_t {
    uint32_t struct_size;   /* set by the caller: 0 or sizeof(wsync_failure_t) */
    uint32_t what;          /* WSYNC_FAILURE_* */
    wsync_status_t status;  /* the receiver's own status (e.g. WSYNC_ERR_MISMATCH from its
                               loader); WSYNC_ERR_PEER for a death, WSYNC_ERR_TIMEOUT */
    uint32_t receiver;      /* receiver index */
    uint64_t version;       /* version of the chunk, 0 if unknown (a death, detach or
                               timeout names the chunk owed, on "shm" and "cuda_ipc" since
                               0.5, when this sender published it) */
    uint32_t chunk_index;   /* chunk within that version, or WSYNC_NO_CHUNK */
    int32_t pid;            /* the receiver's pid as it saw itself, 0 if unknown; for messages
                               only (pids mean nothing across PID namespaces) */
    char message[256];      /* the receiver's own message, NUL-terminated, possibly cut */
} wsync_failure_t;

/* How many receiver failures the sender's last failed call (send_chunk, commit or flush)
 * found; 0 after a call that succeeded. Does not block. */
WSYNC_API wsync_status_t wsync_sender_failure_count(const wsync_sender_t *sender,
                                                    size_t *count_out);

/* Failure i (0 .. count-1) of the last failed call, written to *out up to out->struct_size
 * (set it first). WSYNC_ERR_INVALID_ARGUMENT for i out of range. Does not block. */
WSYNC_API wsync_status_t wsync_sender_failure(const wsync_sender_t *sender, size_t i,
                                              wsync_failure_t *out);

/* Merges the partial requests of several senders of one chunk (one per trainer GPU, for kinds
 * with several senders) into one request. n >= 1; parts are borrowed for the call. Every part
 * must be of one kind, sync (for "cuda_ipc", one board: WSYNC_ERR_MISMATCH naming both
 * otherwise), version and chunk; kinds with a single sender ("shm", "nccl_broadcast")
 * accept only n == 1 and return a copy. For "cuda_ipc" the parts' per-GPU entries are
 * concatenated and a GPU UUID in two parts fails with WSYNC_ERR_MISMATCH naming it. *out is
 * freed with wsync_blob_free(). Does not block. */
WSYNC_API wsync_status_t wsync_request_merge(const wsync_blob_t *parts, size_t n,
                                             wsync_blob_t *out);

/* =============================================================================================
 * 5. Receiver and receive iteration (engine side)
 *
 * Rolling back. An engine that loads straight into the weights it serves sees a version fail
 * part-way (a chunk fails its checksum, the trainer abandons the version or dies, the loader
 * fails): wsync_receiver_poll() then reports failed_version == the version it began. Two
 * patterns are safe: load into a staging copy and swap it in only when completed_version
 * reaches the new version; or load in place, stop serving when failed_version names the
 * version being loaded, and serve again once a later version completes (the trainer resends).
 * ===========================================================================================*/

typedef struct wsync_receiver_t wsync_receiver_t;
typedef struct wsync_recv_t wsync_recv_t;

/* Creates receiver number `index` (0 .. receivers-1 as the init info says) from init info
 * (borrowed for the call). An index out of range fails with WSYNC_ERR_INVALID_ARGUMENT, an
 * index held by a live receiver with WSYNC_ERR_WRONG_STATE, a vanished sync (the trainer is
 * gone; on "shm" and "cuda_ipc", since 0.7.0, also when every sender that attached has died or
 * was destroyed) with WSYNC_ERR_UNAVAILABLE. On "shm" and "cuda_ipc" a segment handed over by
 * another process is accepted only from a process of this user that created it, as a regular
 * file of this user, mode 0600; anything else is WSYNC_ERR_UNAVAILABLE naming the process
 * (since 0.7.0). A receiver made for an index that was used before (a restarted engine)
 * re-attaches where the kind's "reattach" capability says so: it takes part from the next
 * version that begins after it attached; requests of the version in flight fail with
 * WSYNC_ERR_MISMATCH saying so. GPU kinds work on the GPU named by the "device" option (an
 * ordinal in this process, after CUDA_VISIBLE_DEVICES).
 * On success *out is freed with wsync_receiver_destroy().
 * Blocks, each up to the "timeout_ms" option, only where the kind must meet its peer:
 *   "shm", "cuda_ipc": not at all, unless the segment's name is already gone (every receiver
 *     had attached): then it asks the live sender for the segment over a local socket;
 *   "nccl_broadcast": joins the group as rank index + 1, like wsync_sender_create():
 *     WSYNC_ERR_TIMEOUT when the group is not complete, WSYNC_ERR_PEER when NCCL fails the
 *     init, WSYNC_ERR_MISMATCH for a trainer on another NCCL major.minor (the communicator
 *     aborted in each case); a receiver on the sender's GPU fails at once with
 *     WSYNC_ERR_UNSUPPORTED naming the GPU and the index (such an engine uses "cuda_ipc");
 *   "ucx": attaches to the trainer (an authenticated hello and its answer): WSYNC_ERR_TIMEOUT
 *     when the trainer does not answer, the trainer's own status (e.g. WSYNC_ERR_WRONG_STATE
 *     for an index it still holds) when it refuses, WSYNC_ERR_PEER when it is unreachable.
 *     Where the trainer offers a data stream (over tcp), it connects to it and proves its
 *     key, up to 2 s more; a stream it cannot make leaves chunk bytes on UCX (slower, not
 *     an error).
 * How each kind claims its index and tells a dead receiver from a slow one: docs/kinds.md,
 * "Receivers". */
WSYNC_API wsync_status_t wsync_receiver_create(wsync_strategy_t *strategy, const uint8_t *init,
                                               size_t len, uint32_t index,
                                               wsync_receiver_t **out);

/* Destroys a receiver. End its open iteration first: if one is open it is ended as failed
 * and freed with the receiver, so its handle must not be used again (not even for
 * wsync_recv_end()); a wrapper that owns both must end the iteration before the receiver.
 * The sender learns that this receiver detached. NULL is a no-op. Does not block, except:
 * "nccl_broadcast" finalizes its communicator for up to "timeout_ms" like
 * wsync_sender_destroy() and aborts it then; "ucx" says goodbye to the trainer and closes its
 * connection, up to the smaller of "timeout_ms" and 2 s, after ending an open iteration as
 * wsync_recv_end() does (a chunk still being pulled in pieces: up to the pull's deadline, 2 s
 * past it at most). */
WSYNC_API void wsync_receiver_destroy(wsync_receiver_t *receiver);

/* Starts receiving the chunk described by a request (len bytes at request, borrowed for the
 * call; the iteration keeps its own copy of what it needs). The request is fully validated
 * before any tensor memory is touched: its envelope checksum first (a changed byte fails with
 * WSYNC_ERR_INTEGRITY), then its fields (WSYNC_ERR_MALFORMED). A request of another kind, a
 * stale, replayed or out-of-order chunk, or a chunk of a version this receiver joined too late
 * for fails with WSYNC_ERR_MISMATCH; a later chunk of a version that already failed here fails
 * with WSYNC_ERR_SKIPPED (since 0.7.0), or WSYNC_ERR_ABANDONED
 * when the sender abandoned it. Such refusals are reported to the sender (its flush fails with
 * WSYNC_ERR_PEER carrying this status and message), except stale and replayed requests, which
 * are not this receiver's to answer, and skipped chunks, whose version's failure was reported
 * once. A chunk of a newer version while a version is open
 * fails the open one: WSYNC_ERR_ABANDONED if the sender abandoned it, else WSYNC_ERR_MISMATCH,
 * reported to the sender (its remaining chunks never reached this receiver). Chunk 0 then
 * begins the new version; a later chunk of a newer version whose chunk 0 did not come first
 * fails that newer version here, so none of its chunks can complete it. A chunk given after
 * chunks this receiver was never given (lost, or of a version the sender abandoned before
 * they were delivered) answers those as missed, so the sender does not wait for them; they are
 * stale if they come later. A dropped receiver
 * fails with WSYNC_ERR_PEER. When the init info says checksums are on, a request without
 * tensor checksums fails with WSYNC_ERR_INTEGRITY.
 * Only one iteration per receiver may be open (WSYNC_ERR_WRONG_STATE otherwise). For
 * "cuda_ipc" the receiver takes the request's part whose GPU UUID equals its own device's;
 * none fails with WSYNC_ERR_MISMATCH naming this GPU and the ones present.
 * On success *out is the iteration; it must be ended with wsync_recv_end() or wsync_recv_fail().
 * Blocks, up to the "timeout_ms" option, where the bytes are not in place when the request
 * exists:
 *   "shm", "cuda_ipc": does not block;
 *   "nccl_broadcast": posts its side of the broadcast and blocks until it arrives (then
 *     WSYNC_ERR_TIMEOUT and the communicator is aborted); with "synchronize" it first waits,
 *     within the same deadline, for the loader's work queued on the legacy default stream
 *     before the previous chunk's wsync_recv_end() (WSYNC_ERR_TIMEOUT naming that stream);
 *   "ucx": asks the trainer for the chunk and pulls its bytes (WSYNC_ERR_TIMEOUT naming the
 *     chunk, WSYNC_ERR_PEER when the trainer is unreachable, the trainer's status when it
 *     refuses a fetch, WSYNC_ERR_TIMEOUT at once while the loader's earlier work on its stream
 *     has still not finished). Since 0.8.0 a whole chunk of more than 4 MiB is pulled in pieces
 *     on the receiver's own thread while the loader reads it: this call returns once the
 *     trainer has leased the chunk and every piece is asked for, and the first read of each
 *     tensor (wsync_recv_next(), wsync_recv_copy(), wsync_recv_apply(), wsync_recv_patch())
 *     waits for its bytes, within the same deadline, which runs from this call; a failure
 *     found then (the same statuses and messages as above) fails that read and the iteration,
 *     and wsync_recv_end() returns it. wsync_recv_end() also waits for the rest of the chunk
 *     before it answers the trainer. A selection's chunk ("select") is pulled whole here.
 * docs/kinds.md, "Receivers", says how each kind holds the bytes and its IPC handles. */
WSYNC_API wsync_status_t wsync_receiver_receive(wsync_receiver_t *receiver,
                                                const uint8_t *request, size_t len,
                                                wsync_recv_t **out);

/* The newest committed version whose every chunk this receiver has received, verified and
 * ended successfully and whose manifest matched (0 if none). A version with a failed,
 * missing or abandoned chunk never becomes complete, so an engine can keep serving its old
 * weights. */
WSYNC_API wsync_status_t wsync_receiver_completed_version(const wsync_receiver_t *receiver,
                                                          uint64_t *version_out);

/* wsync_receiver_state_t.flags */
#define WSYNC_RECEIVER_DROPPED 1u     /* the sender dropped this receiver                      */
#define WSYNC_RECEIVER_SENDER_GONE 2u /* the trainer's process is gone ("shm", "cuda_ipc")     */
/* This receiver acknowledges a chunk, and completes a version, only once the loader's work
 * queued on its stream (wsync_receiver_set_stream(), else the legacy default stream) before
 * wsync_recv_end() has run: a loader that copies out of the views on that stream need not wait
 * for its copies itself ("cuda_ipc" with "synchronize" on, its default; "ucx" with the receiver
 * option "device"). Fixed for the receiver's life. Since 0.5. */
#define WSYNC_RECEIVER_ORDERS_LOADER_WORK 4u

/* Where a receiver stands: the rollback hook (see the top of this section). */
typedef struct wsync_receiver_state_t {
    uint32_t struct_size;         /* set by the caller: 0 or sizeof(wsync_receiver_state_t) */
    uint32_t flags;               /* WSYNC_RECEIVER_* */
    uint64_t completed_version;   /* as wsync_receiver_completed_version() */
    uint64_t open_version;        /* version begun here and neither committed nor failed, or 0 */
    uint64_t failed_version;      /* newest version that failed here (begun and failed or
                                     abandoned, or skipped whole: none of its chunks arrived
                                     before a later version's, since 0.7.0), or 0 */
    wsync_status_t failed_status; /* why failed_version failed (WSYNC_ERR_ABANDONED, the
                                     loader's status, WSYNC_ERR_INTEGRITY, WSYNC_ERR_PEER when
                                     the trainer died, WSYNC_ERR_MISMATCH when skipped);
                                     WSYNC_OK when failed_version is 0 */
    uint32_t reserved_;           /* written 0 */
} wsync_receiver_state_t;

/* Brings the receiver's view up to date without a request and writes it to *out (up to
 * out->struct_size): a version the sender abandoned or a trainer that died fails the open
 * version here (failed_status WSYNC_ERR_ABANDONED or WSYNC_ERR_PEER). Call it when requests stop
 * coming, or after a failed chunk, to decide whether to roll back. Not while an iteration is
 * open (WSYNC_ERR_WRONG_STATE). Does not block. */
WSYNC_API wsync_status_t wsync_receiver_poll(wsync_receiver_t *receiver,
                                             wsync_receiver_state_t *out);

/* The CUDA stream the loader queues its copies out of the views on (e.g.
 * torch.cuda.current_stream().cuda_stream). With "synchronize" (default), GPU kinds release a
 * chunk's memory to the sender only after the work queued on this stream when the iteration
 * ended ("cuda_ipc": wsync_recv_end() polls an event recorded there; "nccl_broadcast": the next
 * receive does), instead of after the legacy default stream. NULL (the initial setting)
 * restores the legacy default stream. The stream is borrowed: it must stay valid until the next
 * call of this function or the receiver's destruction, and belong to the receiver's GPU and
 * context. "ucx" with the receiver option "device" (it has no "synchronize") always uses it:
 * its wsync_recv_copy() into device memory queues there, and wsync_recv_end() waits for it.
 * Other kinds whose views are host memory ("shm", "ucx" without "device") accept and ignore
 * it. Returns WSYNC_OK, or
 * WSYNC_ERR_INVALID_ARGUMENT for a NULL receiver, WSYNC_ERR_WRONG_STATE while an iteration is
 * open. Does not block. 0.3. */
WSYNC_API wsync_status_t wsync_receiver_set_stream(wsync_receiver_t *receiver, void *stream);

/* What an iteration carries. */
typedef struct wsync_recv_info_t {
    uint32_t struct_size;     /* set by the caller: 0 or sizeof(wsync_recv_info_t) */
    uint32_t flags;           /* WSYNC_CHUNK_LAST if this chunk commits the version */
    uint64_t version;         /* sync version of this chunk */
    uint64_t bytes;           /* payload bytes of all tensors */
    uint64_t count;           /* number of tensors (0 for a commit without data) */
    uint32_t chunk_index;     /* 0-based position of the chunk within its version */
    uint32_t version_chunks;  /* with WSYNC_CHUNK_LAST: chunks in the version (manifest), else 0 */
    uint64_t version_tensors; /* with WSYNC_CHUNK_LAST: tensors in the version, else 0 */
    uint64_t version_bytes;   /* with WSYNC_CHUNK_LAST: payload bytes of the version, else 0 */
} wsync_recv_info_t;

/* Writes the iteration's summary to *info, up to info->struct_size (set it first). Does not
 * touch tensor memory. */
WSYNC_API wsync_status_t wsync_recv_info(const wsync_recv_t *it, wsync_recv_info_t *info);

/* Dry run: describes tensor i (0 .. count-1) without touching its bytes, so a loader can check
 * names, dtypes and shapes against its parameters before any byte moves. view->data is NULL;
 * view->flags is WSYNC_TENSOR_PATCH for an entry that crossed as a patch (since 0.5), else 0.
 * The name and shape pointers stay valid until the iteration ends. */
WSYNC_API wsync_status_t wsync_recv_peek(const wsync_recv_t *it, size_t i, wsync_tensor_t *view);

/* Yields the next tensor: *has_view is true and *view describes it, or *has_view is false at
 * the end; tensors that wsync_recv_copy() already took are skipped. Views are zero-copy where the kind allows ("shm": read-only shared memory; the GPU
 * kinds: device memory of the receiver's GPU, view->device CUDA; all flagged
 * WSYNC_TENSOR_READ_ONLY); copy the bytes into your parameters (for host memory,
 * wsync_recv_copy() does that copy and the verification in one pass; for "cuda_ipc" it queues
 * the device copy itself). A view's data, name and
 * shape stay valid until the iteration ends. With checksums on, a tensor is verified (unless a
 * wsync_recv_copy() verified it already) before it is yielded and a mismatch fails with WSYNC_ERR_INTEGRITY naming the tensor; the iteration is then
 * failed (later calls return the same error). A tensor carried as a patch (a trainer with the
 * "delta" option) has no view: yielding it fails with WSYNC_ERR_UNSUPPORTED naming it and fails
 * the iteration; take patches first, with wsync_recv_copy() into memory that holds the base, or
 * with wsync_recv_patch() as indices and values (wsync_recv_peek() flags them
 * WSYNC_TENSOR_PATCH). With the receiver option "delta_mirror" (0.5, docs/delta.md) every
 * tensor has a view, patched or not: the receiver keeps its own copy of each tensor it loads
 * (dense bytes copied in and verified, patches applied onto it and the result verified, with
 * the failures wsync_recv_copy() lists for patches, "this receiver's mirror does not hold
 * version N"), and the view shows that copy, flagged WSYNC_TENSOR_READ_ONLY: writing through
 * it makes the next patch of that tensor fail with WSYNC_ERR_MISMATCH. A part of a split tensor (see "Split tensors" below) fails the
 * same way, WSYNC_ERR_UNSUPPORTED naming it: take parts with wsync_recv_copy() or
 * wsync_recv_next_part(). Does not block, except on "ucx" for a chunk pulled in pieces: it
 * waits, within the receiver's deadline, for the tensor's bytes (wsync_receiver_receive()). */
WSYNC_API wsync_status_t wsync_recv_next(wsync_recv_t *it, wsync_tensor_t *view, bool *has_view);

/* Split tensors (wsync_part_t). An entry of a chunk may be a *part* of a tensor: its name,
 * dtype and shape (peek, views) are the whole tensor's, and only a byte range of it is in this
 * chunk; the other parts come in the neighbouring chunks of the same version, in order, and the
 * receiver refuses a version whose parts do not follow each other or do not cover the tensor
 * (WSYNC_ERR_MISMATCH, the version fails). wsync_recv_part() says which range an entry carries.
 * wsync_recv_copy() loads parts transparently: its offset and len count bytes of the whole
 * tensor, and dst holds byte `offset` of the whole tensor at dst[0]; of that range, the bytes in
 * this part are written at their place in dst and the others are left alone. So a loader that
 * copies every entry whole (offset 0, len = the tensor's size) into its parameter fills the
 * parameter part by part, each chunk writing its own range. Views: wsync_recv_next() refuses a
 * part (WSYNC_ERR_UNSUPPORTED naming it, the iteration fails: a loader unaware of parts would
 * read the whole tensor's size from a part's bytes); wsync_recv_next_part() yields one view per
 * part. Checksums are per part. 0.5. */

/* Writes the byte range that entry i (0 .. count-1) carries to *out: {offset, bytes} within the
 * whole tensor, or {0, the tensor's size} for an entry that is a whole tensor. Touches no tensor
 * bytes. Returns WSYNC_OK, or WSYNC_ERR_INVALID_ARGUMENT for NULL arguments or i >= count.
 * Does not block. 0.5. */
WSYNC_API wsync_status_t wsync_recv_part(const wsync_recv_t *it, size_t i, wsync_part_t *out);

/* wsync_recv_next() that also yields parts of split tensors: *view describes the whole tensor
 * (name, dtype, shape) but view->data points at the part's first byte, i.e. byte part->offset of
 * the whole tensor, and only part->bytes bytes are readable there; *part is the range ({0, the
 * tensor's size} for a whole tensor). Otherwise the same as wsync_recv_next() (skips tensors
 * already copied, verifies, validity, failures, patches refused). part may not be NULL. Does not
 * block. 0.5. */
WSYNC_API wsync_status_t wsync_recv_next_part(wsync_recv_t *it, wsync_tensor_t *view,
                                              wsync_part_t *part, bool *has_view);

/* Copies bytes [offset, offset + len) of tensor i (0 .. count-1, the order wsync_recv_peek()
 * and wsync_recv_next() use) into dst, the caller's own host memory, with the library's copy
 * loop: stores aligned to the destination whatever the relative alignment of dst and the
 * received bytes, non-temporal stores for copies larger than the cache, and, for unverified
 * copies of at least 8 MiB (and verification, below), the receiver's copy threads
 * ("copy_threads" option; made once per receiver, never per call). offset = 0 and len = the tensor's byte size (element size
 * times the product of its shape, as peek reports) copies the whole tensor; a smaller range
 * suits a loader that keeps a shard of it.
 * Verification. With checksums on (the "checksum" and "verify" options), the first copy taken
 * from a tensor (and a wsync_recv_next() that yields it first) reads all of the tensor's bytes
 * once: it hashes them in the same pass that copies the range, so the bytes cross the memory bus
 * once for both. The hash is the one the request names: the tree hash ("shm" and "ucx" senders,
 * format 5: independent 64 KiB pieces, so the whole of a tensor of 8 MiB or more is verified, and
 * the range copied, by the copy threads together, however small the range) or one XXH3-64 stream
 * (docs/wire-format.md), verified by the calling thread. A mismatch fails with WSYNC_ERR_INTEGRITY naming the
 * tensor and fails the iteration (as wsync_recv_next() does); what dst then holds is
 * unspecified. Later copies and views of a verified tensor are not hashed again.
 * Composition. The call takes any tensor in any order, as often as wanted (ranges of one tensor
 * from several calls), before or after wsync_recv_next() yielded it; views already taken stay
 * valid. A tensor is *taken* once it was yielded or copied (len > 0): wsync_recv_next() skips
 * tensors already taken by a copy, so a loader can copy the tensors it keeps in host memory
 * (found with wsync_recv_peek()) and then take the rest as views, each tensor once; one that
 * copies every tensor needs no wsync_recv_next() at all. wsync_recv_end() requires every tensor
 * taken.
 * Borrows it and dst for the call; keeps nothing. dst must be writable host memory of len bytes
 * that does not overlap the received tensor; it needs no particular alignment.
 * Device memory ("cuda_ipc", "nccl_broadcast", since 0.5). dst is device memory of the
 * receiver's GPU, len bytes of one allocation (checked with the driver before anything is
 * queued). The call queues one device copy on the loader's stream (wsync_receiver_set_stream(),
 * else the legacy default stream, PyTorch's default) and returns without waiting for it: dst
 * holds the bytes once that stream has run the copy. With the "synchronize" option on (the
 * default) the library orders it like a loader's own copies out of the views (see
 * wsync_recv_end(): "cuda_ipc" acknowledges the chunk only after it, "nccl_broadcast" fences it
 * before the next broadcast); with it off the caller waits for its stream before ending. It
 * reads the chunk's memory as a view does; the GPU kinds carry no checksums. Where a loader
 * keeps parameters in device memory this is the cheap path: one call and one driver copy per
 * tensor, no view.
 * "ucx" with the receiver option "device" (an engine with a GPU): dst may be host memory (as
 * above) or device memory of that GPU (checked as for the GPU kinds). Into device memory, the
 * tensor is first verified on the host (its checksum, once: WSYNC_ERR_INTEGRITY fails the
 * iteration with nothing queued), then one copy from the chunk's pinned buffer is queued on the
 * loader's stream; wsync_recv_end() waits for that stream (bounded by "timeout_ms": past it
 * WSYNC_ERR_TIMEOUT naming the stream and the chunk) before acknowledging the chunk, so the
 * copies, and the loader's own copies out of the views on that stream, are complete when it
 * returns (WSYNC_RECEIVER_ORDERS_LOADER_WORK). A patch (delta sync) into device memory is
 * WSYNC_ERR_UNSUPPORTED naming "delta_mirror" (the CPU applies patches; the iteration goes on):
 * with "delta_mirror" the verified tensor is copied from the receiver's mirror into device
 * memory instead. Without "device", "ucx" takes host memory only.
 * Returns WSYNC_OK, or:
 *   WSYNC_ERR_INVALID_ARGUMENT for it or dst NULL, i >= count, offset + len beyond the tensor
 *     (offset > size or len > size - offset), or a dst overlapping the tensor's received bytes;
 *     nothing is read or written and the iteration is unchanged (it can go on);
 *   WSYNC_ERR_INTEGRITY as above (the iteration is failed);
 *   the iteration's own error once it has failed (a checksum, an abandoned version), as
 *     wsync_recv_next() returns it; nothing is copied;
 *   WSYNC_ERR_INVALID_ARGUMENT for the GPU kinds when dst is not device memory, is memory of
 *     another GPU, or [dst, dst + len) does not fit in its allocation (the message names the
 *     tensor and why); nothing is queued and the iteration goes on;
 *   a driver error's status if queuing the copy fails (the message names the tensor).
 * Patches (a trainer with the "delta" option; docs/delta.md). A tensor the request carries as a
 * patch is applied onto dst, which must hold that tensor as of the patch's base version (the
 * version this receiver completed last): offset must be 0 and len the tensor's size, once.
 * The patch applies only if this receiver's completed version is its base version (else
 * WSYNC_ERR_MISMATCH naming both versions), and is kept only if the patched dst hashes to the
 * request's XXH3-64 of the tensor: dst then holds the trainer's tensor, bit for bit (also when
 * dst differed from the base only in elements the patch writes). Otherwise dst is put
 * back exactly as it was, the iteration is failed, and the call returns WSYNC_ERR_MISMATCH,
 * "does not hold version N", when dst does not hash to the base's XXH3-64, else
 * WSYNC_ERR_INTEGRITY; the sender's flush reports it and its next version is dense.
 * A patch is refused with WSYNC_ERR_INVALID_ARGUMENT (iteration unchanged) for another offset or
 * len, or when it was taken already (applied, or handed out by wsync_recv_patch()). The call
 * then reads dst once and the patch, writes only the changed elements, and on a failure reads
 * dst once more (to name the cause).
 * For the GPU kinds ("cuda_ipc", "nccl_broadcast") the same holds with dst in device memory of
 * the receiver's GPU (checked as for a dense copy), with one difference in when failures are
 * told: the call queues the library's kernels on the loader's stream, after the work queued
 * there before (check the patch, tree-hash dst, write the changed elements, tree-hash the
 * result, put dst back if it differs), and returns without waiting for them, as a dense device
 * copy does; the loader's later work on that stream sees dst final. wsync_recv_end() waits
 * once for all of the chunk's patches (bounded by the receiver's "timeout_ms":
 * WSYNC_ERR_TIMEOUT; a failed kernel is WSYNC_ERR_SYSTEM) and returns the first one's failure:
 * WSYNC_ERR_MISMATCH (dst does not hold the base; untouched), WSYNC_ERR_INTEGRITY (put back),
 * WSYNC_ERR_MALFORMED naming the tensor and the first bad index (untouched); the other patches
 * of the chunk are applied, and the failed iteration means the version is not complete on
 * this engine. The messages say "tree hash" where the host's say XXH3. At the call itself: a
 * patch whose length no patch of the tensor has, or of elements other than 1, 2, 4 or 8 bytes,
 * is WSYNC_ERR_MALFORMED (iteration failed, nothing queued); a dst not aligned to the tensor's
 * elements is WSYNC_ERR_INVALID_ARGUMENT (iteration unchanged). dst must stay allocated until
 * wsync_recv_end(), and after a WSYNC_ERR_TIMEOUT there until the loader's stream has run the
 * queued work (it still writes dst, or puts it back, whenever the stream moves; the receiver
 * keeps the chunk's memory for it: "cuda_ipc" closes no mapping, "nccl_broadcast" receives no
 * chunk, until then, each bounded by "timeout_ms"). Every kind reports such a failure to the
 * trainer ("nccl_broadcast" over its control channel since 0.7).
 * With the receiver option "delta_mirror" none of this applies to dst: the patch is applied
 * onto the receiver's own copy of the tensor (checked the same way; the failures name "this
 * receiver's mirror"), and any range of the result is copied out, as for a dense tensor; every
 * tensor, dense ones too, is then copied whole into that mirror when first taken (one more
 * copy of each dense tensor, and the model's size in host memory on the engine).
 * len = 0 copies nothing, verifies nothing and does not take the tensor (arguments are still
 * checked). Does not block on peers (it takes CPU time proportional to the bytes read), except
 * on "ucx" for a chunk pulled in pieces, where it first waits for the tensor's bytes
 * (wsync_receiver_receive()). Same
 * threading as the iteration: one thread at a time; the copy threads are the library's and are
 * finished with dst when the call returns. */
WSYNC_API wsync_status_t wsync_recv_copy(wsync_recv_t *it, size_t i, uint64_t offset, void *dst,
                                         uint64_t len);

/* Delta sync for engines that cannot apply a patch with wsync_recv_copy() (loaders that do not
 * own the tensor as contiguous host memory holding the base, such as vLLM's load_weights path,
 * which shards and fuses checkpoint tensors). wsync_recv_patch() hands out a patch as flat
 * element indices and new values, in the form vLLM's sparse weight patches take (int32 flat
 * indices + values per checkpoint tensor), for the engine to apply itself. 0.5. */

/* What wsync_recv_patch() writes: one patch, read-only. Pointers stay valid until the iteration
 * ends (wsync_recv_end() or wsync_recv_fail()). 0.5. */
typedef struct wsync_patch_t {
    uint32_t struct_size;  /* set by the caller: 0 or sizeof(wsync_patch_t) */
    uint32_t index_bits;   /* 32: indices are int32_t (the tensor has at most 2^31 elements, so
                              every flat index fits); 64: int64_t (larger tensors) */
    uint64_t base_version; /* the version the patch applies to: this receiver's completed one */
    uint64_t count;        /* changed elements: entries of indices and of values (>= 0) */
    uint64_t elements;     /* the tensor's element count (the product of its shape) */
    const void *indices;   /* count flat row-major element indices, native byte order, strictly
                              increasing, each < elements; aligned to index_bits / 8 */
    const void *values;    /* count elements of the tensor's dtype in index order: the new
                              bytes, bit for bit (a NaN payload or -0.0 is kept); aligned to 8
                              bytes (elements of up to 8 bytes are naturally aligned) */
    uint64_t base_xxh3;    /* XXH3-64 (seed 0) of the whole tensor's row-major bytes at
                              base_version */
    uint64_t result_xxh3;  /* the same of the tensor once patched: the engine's check */
} wsync_patch_t;

/* Entry i (0 .. count-1) of the iteration, which crossed as a patch (wsync_recv_peek() flags it
 * WSYNC_TENSOR_PATCH), as flat indices and values, written to *out (up to out->struct_size).
 * Checks first what can be checked without the base: that this receiver's completed version is
 * the patch's base version, the tensor checksum of the patch bytes (with checksums on, as for
 * any tensor), and the patch's own structure (magic, coding, index width, element size and
 * count against the tensor, exact length, every index strictly increasing and inside the
 * tensor). The entry is then taken (wsync_recv_next() skips it, wsync_recv_end() counts it) and
 * the engine owns the rest: writing values[k] at element indices[k] of the tensor as of
 * base_version gives the tensor of this chunk's version, and nothing else changes. The library
 * cannot check the result without the base (it does not hold the tensor): an engine that holds
 * the whole tensor can compare its XXH3-64 with result_xxh3; one that cannot apply the patch
 * must fail the chunk (wsync_recv_fail()) so that the version does not complete here and the
 * sender sends the next version dense. With the receiver option "delta_mirror" the library
 * does hold the tensor: this call first applies the patch onto the receiver's mirror and
 * verifies the result (WSYNC_ERR_MISMATCH or WSYNC_ERR_INTEGRITY, the iteration failed, as for
 * wsync_recv_copy()), so the indices and values it hands out are known to give result_xxh3.
 * Borrows it and out for the call. *out's pointers are into the received bytes (read-only
 * shared memory for "shm") where they already are flat indices in the native integer of
 * index_bits, else into memory the iteration owns; either way valid until the iteration ends,
 * and the same pointers on every call for the same entry. Repeated calls and a call after
 * wsync_recv_copy() applied the patch are allowed (they take nothing again); wsync_recv_copy()
 * refuses a patch this call took.
 * Returns WSYNC_OK, or (on failure *out is zeroed but for struct_size, when it could be written):
 *   WSYNC_ERR_INVALID_ARGUMENT for it or out NULL, out->struct_size nonzero but smaller than
 *     sizeof(wsync_patch_t), i >= count, or an entry that is not a patch (it crossed dense:
 *     the message names the tensor and says to take it with wsync_recv_next() or
 *     wsync_recv_copy()); the iteration is unchanged (it can go on);
 *   WSYNC_ERR_MISMATCH when this receiver's completed version differs from the patch's base
 *     version, naming both (the same rule as wsync_recv_copy()): the iteration is failed;
 *   WSYNC_ERR_INTEGRITY when the patch bytes fail their checksum, WSYNC_ERR_MALFORMED naming
 *     the tensor when they do not parse or an index is out of order or outside the tensor:
 *     the iteration is failed;
 *   the iteration's own error once it has failed;
 *   WSYNC_ERR_UNSUPPORTED for a patch in device memory (a GPU kind's: apply it with
 *     wsync_recv_copy() into device memory).
 * A failed iteration is acknowledged as failed at wsync_recv_end(): the sender's flush reports
 * it and its next version is dense. Does not block (it reads the patch once: O(count)), except
 * on "ucx" for a chunk pulled in pieces (first waits for the patch's bytes, as
 * wsync_recv_copy() does). Same
 * threading as the iteration. 0.5. */
WSYNC_API wsync_status_t wsync_recv_patch(wsync_recv_t *it, size_t i, wsync_patch_t *out);

/* Destination tables: a whole chunk loaded by one call (0.6).
 *
 * An engine that keeps its weights in fixed memory declares, once, where each wire tensor goes
 * (wsync_dest_table_create()), and then loads each chunk with one wsync_recv_apply() instead of
 * one wsync_recv_copy() per tensor. For the GPU kinds the call queues ONE kernel launch per chunk
 * on the loader's stream (a scatter of every tensor of the chunk from the sender's memory into
 * the declared destinations); for host memory it runs the copy loop of wsync_recv_copy() over
 * the chunk, with its fused verification. Either way it is wsync_recv_copy() of every matched
 * tensor, with the same rules (verification, acknowledgement, split tensors, patches), done in C.
 *
 * A destination says which wire tensor it takes (name, dtype, shape: checked against the
 * request before any byte moves), where its bytes land, and which bytes of it it takes
 * (src_offset, bytes: as wsync_recv_copy()'s offset and len, so a loader that keeps a shard of a
 * tensor, or a wire tensor that lands inside a fused parameter such as q, k and v in one qkv
 * weight, point data at the right place). Several destinations may name one wire tensor (a
 * tied weight the engine keeps twice); every destination of a name is written. */

/* One destination; an input of wsync_dest_table_create(), borrowed for that call. */
typedef struct wsync_dest_t {
    const char *name;      /* the wire tensor's name as the request carries it (1..
                              WSYNC_MAX_NAME_BYTES bytes, NUL-terminated) */
    void *data;            /* where byte src_offset of the wire tensor lands: host memory the
                              caller owns, or device memory of the receiver's GPU */
    const int64_t *shape;  /* ndim extents the wire tensor must have */
    int32_t ndim;          /* 0..WSYNC_MAX_NDIM */
    wsync_dtype_t dtype;   /* the dtype the wire tensor must have (no cast is made) */
    uint64_t src_offset;   /* first byte of the wire tensor taken; a multiple of the element size */
    uint64_t bytes;        /* bytes taken from src_offset; 0: the rest of the tensor */
    uint32_t flags;        /* must be 0 */
    uint32_t struct_size;  /* 0 or sizeof(wsync_dest_t); see "Structs" above */
} wsync_dest_t;

typedef struct wsync_dest_table_t wsync_dest_table_t;

/* Makes a destination table for `receiver` from n >= 1 destinations (borrowed for the call; the
 * table keeps copies of names and shapes, not of the memory). Checks each destination now:
 * name, dtype, shape (as for a sent tensor), src_offset + bytes within the tensor and aligned to
 * its elements, data not NULL. For a receiver with a GPU ("cuda_ipc", "nccl_broadcast", "ucx"
 * with "device"), memory the driver knows as device memory must be of the receiver's GPU and
 * hold [data, data + bytes) in one allocation or in a contiguous run of mapped allocations
 * (PyTorch's expandable segments and other virtual-memory mappings map a tensor over several
 * physical handles); the driver's identity of each is kept, so memory freed or remapped later
 * is refused by wsync_recv_apply() instead of written. Other memory is host memory and must stay
 * writable by the CPU. Two destinations of one name that overlap are refused.
 * Returns WSYNC_OK and *out (free it with wsync_dest_table_destroy(), before or after the
 * receiver), or WSYNC_ERR_INVALID_ARGUMENT naming the destination (index and name) and why,
 * WSYNC_ERR_NO_MEMORY. Does not block; one or two driver calls per destination (more for a
 * destination that spans allocations). Not while another thread uses the receiver. */
WSYNC_API wsync_status_t wsync_dest_table_create(wsync_receiver_t *receiver,
                                                 const wsync_dest_t *dests, size_t n,
                                                 wsync_dest_table_t **out);

/* Frees a table. NULL is a no-op. Work a wsync_recv_apply() queued keeps no reference to it. */
WSYNC_API void wsync_dest_table_destroy(wsync_dest_table_t *table);

/* wsync_recv_apply() flags */
#define WSYNC_APPLY_PARTIAL 1u  /* tensors of the chunk without a destination are left for the
                                   caller (views, wsync_recv_copy()) instead of refused */
#define WSYNC_APPLY_COMPLETE 2u /* on the chunk that commits a version (WSYNC_CHUNK_LAST):
                                   refuse unless every destination of the table was written by
                                   this version's applies (this chunk's included), so a version
                                   that misses a tensor the engine holds never commits here */

/* What wsync_recv_apply() did. */
typedef struct wsync_apply_result_t {
    uint32_t struct_size;  /* set by the caller: 0 or sizeof(wsync_apply_result_t) */
    uint32_t launches;     /* device kernel launches queued (0 or 1 for the GPU kinds: the
                              small copies and every cast of the chunk) */
    uint64_t tensors;      /* entries of the chunk taken */
    uint64_t writes;       /* destinations written (several per tied tensor) */
    uint64_t unmatched;    /* entries without a destination (left, WSYNC_APPLY_PARTIAL) */
    uint64_t bytes;        /* bytes written into destinations */
    /* 0.6.1: the driver's device copies queued (cuMemcpyDtoDAsync on the loader's stream, one
     * per destination of WSYNC_APPLY_DRIVER_COPY_MIN bytes or more: faster than the kernel
     * for large tensors). A caller built against 0.6.0 passes the smaller struct_size and
     * does not get it. */
    uint64_t device_copies;
} wsync_apply_result_t;
/* The 0.6.0 layout's size (every field before device_copies): what a caller built then passes. */
#define WSYNC_APPLY_RESULT_SIZE_0_6_0 40u

/* The smallest device destination wsync_recv_apply() gives to the driver's own copy rather
 * than to its kernel launch (4 MiB; see wsync_apply_result_t.device_copies). */
#define WSYNC_APPLY_DRIVER_COPY_MIN (4u << 20)

/* Loads the chunk of `it` into the destinations of `table` (made for the iteration's
 * receiver): every entry of the chunk whose name has destinations is copied into each of them,
 * as wsync_recv_copy(it, i, dest.src_offset, dest.data, dest.bytes) would (a part of a split
 * tensor writes its share of the range; a patch is applied onto its destination). Before any
 * byte moves, every entry is checked: a name without a destination (unless
 * WSYNC_APPLY_PARTIAL), a dtype or shape other than its destination's, and with
 * WSYNC_APPLY_COMPLETE on a committing chunk a destination this version never wrote, are
 * WSYNC_ERR_MISMATCH naming the tensor (or up to 8 destinations) and the version; device memory
 * of a destination that was freed or remapped since the table was made is
 * WSYNC_ERR_INVALID_ARGUMENT naming it; the iteration is then unchanged (the caller may fall
 * back to other calls, or wsync_recv_fail() it). After the checks it behaves as that sequence
 * of wsync_recv_copy() calls: a checksum mismatch fails the iteration (WSYNC_ERR_INTEGRITY) and
 * leaves the destinations of the tensors before it written. GPU kinds: the dense entries are
 * queued as one kernel launch on the loader's stream (wsync_receiver_set_stream(), else the
 * legacy default stream), and the call returns without waiting: the destinations hold the bytes
 * once that stream ran it; the chunk is acknowledged (with "synchronize") once it did, as for
 * wsync_recv_copy(). Entries a wsync_recv_copy() or a view took already are not taken again.
 * An entry that crossed as a patch (delta sync) applies onto one destination: a patch whose
 * name has several is WSYNC_ERR_UNSUPPORTED naming it, before anything moves.
 * flags: WSYNC_APPLY_*; other bits are WSYNC_ERR_INVALID_ARGUMENT. out may be NULL.
 * Returns WSYNC_OK or the statuses above, WSYNC_ERR_INVALID_ARGUMENT for NULL it or table or a
 * table of another receiver, the iteration's own error once it failed, or a driver error's
 * status if queuing fails (naming the chunk). Does not block on peers, except on "ucx" for a
 * chunk pulled in pieces (each entry's bytes are waited for first, as wsync_recv_copy() does);
 * host copies take CPU time proportional to the bytes. Same threading as the iteration. 0.6. */
WSYNC_API wsync_status_t wsync_recv_apply(wsync_recv_t *it, const wsync_dest_table_t *table,
                                          uint32_t flags, wsync_apply_result_t *out);

/* Landing (since 0.8.0): receiving a chunk's bytes straight into the destinations.
 *
 * A "ucx" receiver without "device" lands chunks of more than 4 MiB, pulled over the data
 * stream (docs/kinds.md, "The data stream over tcp"), in the engine's own memory: each dense
 * tensor whose name has exactly one destination in the table, with its dtype and shape, that
 * holds all the bytes the chunk carries of it, is read from the socket straight into that
 * destination while wsync_receiver_receive()'s pull runs, and its checksum is computed piece by
 * piece as it lands, while the bytes are still in the CPU's cache (with the receiver's "verify"
 * on and the request's tree checksums, which ucx requests carry). wsync_recv_apply() with the
 * same table (or wsync_recv_copy() onto the same bytes) then verifies it and copies nothing; a
 * copy elsewhere copies from the destination; a view of it (wsync_recv_next()) is the
 * destination itself. Every other tensor of the chunk (a tied weight with two destinations, a
 * destination that shares memory with another name's, a shard that keeps part of a tensor, a
 * patch, a tensor without a destination or whose dtype or shape differ) arrives in the receive
 * buffer and loads as before. Over UCX's own path (no data stream, "data_path" "ucx", a chunk of 4 MiB or less, a
 * selection's chunk) nothing lands. What it saves is the engine's copy out of the receive
 * buffer: docs/data-path.md, "Landing", and the figures in docs/architecture.md.
 *
 * What the engine agrees to: a landed tensor's destination is written while the chunk is
 * pulled, before the loader asks for it, and holds unverified bytes until its verification
 * (the first wsync_recv_apply(), wsync_recv_copy() or wsync_recv_next() that takes it). A chunk
 * that fails (the trainer unreachable, a checksum mismatch, the deadline) may leave its landed
 * destinations partly written, exactly as a wsync_recv_apply() that fails part way does: the
 * version does not complete (wsync_receiver_completed_version()) and the trainer's flush
 * reports it, so an engine serves only after a completed version, as it must anyway while it
 * loads into the memory it serves from. No byte lands after the iteration's wsync_recv_end() or
 * wsync_recv_fail() returns (or after wsync_receiver_destroy()). */

/* Makes the receiver land the host destinations of `table` (made for this receiver by
 * wsync_dest_table_create(), borrowed for the call: the receiver keeps its own copy of what it
 * needs, and the table may be destroyed afterwards) from the next chunk on; NULL stops landing.
 * Destinations in device memory are not landed. The memory every host destination names must
 * stay allocated and writable by the receiver until landing is stopped, replaced by another
 * call, or the receiver is destroyed.
 * Returns WSYNC_OK; WSYNC_ERR_INVALID_ARGUMENT for a NULL receiver or a table of another
 * receiver; WSYNC_ERR_WRONG_STATE while an iteration is open (nothing changes);
 * WSYNC_ERR_UNSUPPORTED for a kind that does not land bytes ("shm" and "cuda_ipc" map the
 * trainer's memory, "nccl_broadcast" receives into device memory), a "ucx" receiver with
 * "device" and a receiver with "delta_mirror" (its loads come from its own copy); a NULL table
 * is then WSYNC_OK. Does not block. Not while another thread uses the receiver. */
WSYNC_API wsync_status_t wsync_receiver_land(wsync_receiver_t *receiver, const wsync_dest_table_t *table);

/* Ends an iteration, acknowledges the chunk to the sender and frees the iteration (always, even
 * on failure; `it` is invalid afterwards). Returns WSYNC_OK only if every tensor was taken (yielded by
 * wsync_recv_next(), copied by wsync_recv_copy() or handed out by wsync_recv_patch()) and verified and, for the chunk that commits a version, the version's manifest matched what this
 * receiver received (else WSYNC_ERR_MISMATCH naming the difference). An iteration ended early
 * or after a failure is acknowledged as failed, so the sender's flush reports it and the
 * version is not completed, and the call returns WSYNC_ERR_WRONG_STATE (ended early) or the
 * iteration's error. With "synchronize" (default) copies the loader queued out of the views
 * complete before that memory is reused, as far as they were queued on the receiver's legacy
 * default stream (e.g. PyTorch's default stream; synchronise other streams before ending):
 *   "cuda_ipc", for the chunk that ends a version (WSYNC_CHUNK_LAST) and for a failed chunk,
 *     waits here, up to the receiver's "timeout_ms" option, polling an event, for this chunk's
 *     work and every earlier chunk's; that wait decides the outcome on both sides: if it fails
 *     (a faulted copy) or times out, or an earlier chunk's work failed, this call returns that
 *     status (WSYNC_ERR_SYSTEM or WSYNC_ERR_TIMEOUT, naming the receiver, GPU and chunk), the
 *     version does not complete, and the sender's flush reports the failure. Any other chunk
 *     returns without waiting (since 0.5): an event is recorded on the stream and a thread of
 *     the receiver's acknowledges the chunk once it completes (or reports it failed if the
 *     work fails or outlives "timeout_ms"), so the sender hears of the chunk, and may reuse
 *     its memory, only after the copies, while the engine already takes the next chunk;
  *   "nccl_broadcast" does not wait here but records an event on that stream, which the next
 *     wsync_receiver_receive() waits for with its deadline;
 *   "ucx" with the receiver option "device" waits here for every chunk, up to "timeout_ms",
 *     for the work queued on the receiver's stream (its wsync_recv_copy() into device memory
 *     and the loader's copies out of the views): past it the call returns WSYNC_ERR_TIMEOUT
 *     naming the stream and the chunk, the sender's flush reports it, and while that work has
 *     still not run the next chunk's wsync_receiver_receive() fails at once with
 *     WSYNC_ERR_TIMEOUT (the buffer it would land in may still be read).
 * Patches wsync_recv_copy() queued into device memory (the GPU kinds with "delta") are waited
 * for here first, once, up to the receiver's "timeout_ms", whatever "synchronize" says and
 * also after a failure (their kernels read the chunk's memory); a patch that did not apply
 * fails the chunk with its status (see wsync_recv_copy()), which the call returns and the
 * sender's flush reports ("cuda_ipc").
 * "ucx" with a chunk pulled in pieces (more than 4 MiB, see wsync_receiver_receive()) waits
 *   first for the rest of the pull, whatever the loader read, up to the pull's deadline (2 s
 *   past it at most, when the endpoint must be closed): the trainer is answered only once no
 *   piece can still land; a pull that failed fails the chunk with its status here.
 * NULL is a no-op returning WSYNC_OK. Does not block otherwise ("ucx" with chunks of 4 MiB or
 * less and without "device", "shm", and the cases above that return without waiting). */
WSYNC_API wsync_status_t wsync_recv_end(wsync_recv_t *it);

/* Fails an iteration at any point, also after its last view (a loader that found a tensor it
 * cannot load, or failed once every view was taken): the chunk is acknowledged as failed with
 * `status` (any error status, not WSYNC_OK) and `message` (NUL-terminated UTF-8, may be NULL;
 * borrowed; cut to 255 bytes), which reach the sender's flush as its error text and as
 * wsync_failure_t fields; the version is not completed here. Frees the iteration (always; `it`
 * is invalid afterwards) and returns WSYNC_OK, or WSYNC_ERR_INVALID_ARGUMENT for WSYNC_OK as
 * status (the iteration is then still failed, with WSYNC_ERR_INVALID_ARGUMENT). NULL is a no-op
 * returning WSYNC_OK. Does not block, except for the waits wsync_recv_end() makes for a failed
 * chunk, each bounded by the receiver's "timeout_ms" (patches wsync_recv_copy() queued into
 * device memory, whose kernels read the chunk's memory; "cuda_ipc" with "synchronize": the
 * loader's copies out of the views; "ucx": the rest of a chunk being pulled in pieces). */
WSYNC_API wsync_status_t wsync_recv_fail(wsync_recv_t *it, wsync_status_t status,
                                         const char *message);

/* =============================================================================================
 * 6. Planner: tensors -> chunks
 * ===========================================================================================*/

typedef struct wsync_plan_t wsync_plan_t;

/* Groups n tensor descriptors (name, dtype, shape; data ignored) into chunks: consecutive
 * tensors of one module (the name without its last `group_depth` dotted parts, so
 * "layers.0.attn.q.weight" and "layers.0.attn.k.weight" share "layers.0.attn" at depth 2)
 * stay in one chunk so an engine can fuse them; whole groups are batched in order while a chunk
 * stays within "chunk_bytes"; a group larger than the threshold is split between tensors, and a
 * single tensor larger than the threshold gets a chunk of its own. Deterministic: the same input
 * gives the same plan. Options (JSON, NULL for defaults): "chunk_bytes" (default 256 MiB),
 * "group_depth" (default 2; 0 disables grouping), "split" (default false; 0.5): a tensor larger
 * than "chunk_bytes" is split into parts (wsync_part_t) of at most "chunk_bytes" each (cut at
 * multiples of 4096 bytes and of its element size), each part in a chunk of its own (the
 * last one may share its chunk with the rest of its module group); a tensor that cannot be cut
 * into such parts ("chunk_bytes" below one part) stays whole in a chunk of its own, as without
 * "split", so the option never fails a plan that succeeds without it.
 * wsync_plan_chunk_parts() says which range of each tensor a chunk holds, and the chunk is sent
 * with wsync_sender_send_parts(). Borrows metas for the call (names are
 * copied). *out is freed with wsync_plan_destroy(). Does not block. */
WSYNC_API wsync_status_t wsync_plan_create(const wsync_tensor_t *metas, size_t n,
                                           const char *options_json, wsync_plan_t **out);

/* NULL is a no-op. */
WSYNC_API void wsync_plan_destroy(wsync_plan_t *plan);

/* Number of chunks (>= 1 for a plan of n >= 1 tensors). */
WSYNC_API wsync_status_t wsync_plan_chunk_count(const wsync_plan_t *plan, size_t *count_out);

/* Chunk i: *indices_out points at *count_out ascending indices into the metas array given to
 * wsync_plan_create(), owned by the plan (valid until wsync_plan_destroy()); *bytes_out (may be
 * NULL) is the chunk's payload size. */
WSYNC_API wsync_status_t wsync_plan_chunk(const wsync_plan_t *plan, size_t i,
                                          const size_t **indices_out, size_t *count_out,
                                          uint64_t *bytes_out);

/* Chunk i's ranges: *parts_out points at as many wsync_part_t as wsync_plan_chunk() gives
 * indices, parts[k] the range of tensor indices[k] that chunk i holds ({0, 0}: the whole tensor;
 * every range is {0, 0} in a plan made without "split"). Owned by the plan (valid until
 * wsync_plan_destroy()); pass it to wsync_sender_send_parts() with the chunk's descriptors.
 * WSYNC_ERR_INVALID_ARGUMENT for NULL arguments or i out of range. Does not block. 0.5. */
WSYNC_API wsync_status_t wsync_plan_chunk_parts(const wsync_plan_t *plan, size_t i,
                                                const wsync_part_t **parts_out);

/* =============================================================================================
 * 7. Blobs and introspection
 * ===========================================================================================*/

/* Renders any blob (init info or request, any kind) as JSON for logs and tools: {"magic":
 * "wsync", "format": 5, "type": "request", "kind": "shm", "body": {...}}. The blob is parsed
 * with the same bounded parser receivers use; malformed input fails with WSYNC_ERR_MALFORMED
 * saying where. An init info's secrets (the ucx key, nccl_broadcast's control key: whoever
 * holds one may attach as an engine) appear as their length only, "(secret, 32 bytes, not
 * shown)" (0.7.0 showed their bytes). *json_out is freed with wsync_string_free().
 * Does not block. */
WSYNC_API wsync_status_t wsync_blob_describe(const uint8_t *blob, size_t len, char **json_out);

/* Sizes and field offsets of this header's structs as the library was compiled, as JSON
 * {"wsync_tensor_t": {"size": 56, "align": 8, "fields": {"name": 0, ...}}, ...}, so bindings
 * can test their declarations. *json_out is freed with wsync_string_free(). */
WSYNC_API wsync_status_t wsync_abi_layout(char **json_out);

/* Initialisers for the sized structs (since 0.7.0): struct_size set to this header's size,
 * every other field 0 (NULL pointers), e.g. `wsync_recv_info_t info = WSYNC_RECV_INFO_INIT;`.
 * In C each is a compound literal (C99), in C++ a value-initialised object. */
#ifdef __cplusplus
#define WSYNC_STRUCT_INIT_(T) \
    ([]() noexcept { T v_ = T(); v_.struct_size = static_cast<uint32_t>(sizeof(T)); return v_; }())
#else
#define WSYNC_STRUCT_INIT_(T) ((T){.struct_size = (uint32_t)sizeof(T)})
#endif
#define WSYNC_TENSOR_INIT WSYNC_STRUCT_INIT_(wsync_tensor_t)
#define WSYNC_CHUNK_INIT WSYNC_STRUCT_INIT_(wsync_chunk_t)
#define WSYNC_FAILURE_INIT WSYNC_STRUCT_INIT_(wsync_failure_t)
#define WSYNC_RECEIVER_STATE_INIT WSYNC_STRUCT_INIT_(wsync_receiver_state_t)
#define WSYNC_RECV_INFO_INIT WSYNC_STRUCT_INIT_(wsync_recv_info_t)
#define WSYNC_PATCH_INIT WSYNC_STRUCT_INIT_(wsync_patch_t)
#define WSYNC_DEST_INIT WSYNC_STRUCT_INIT_(wsync_dest_t)
#define WSYNC_APPLY_RESULT_INIT WSYNC_STRUCT_INIT_(wsync_apply_result_t)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WSYNC_H */
