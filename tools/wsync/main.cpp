// wsync: the command-line tool. A real consumer of the library: it uses only include/wsync.h.
//
//   wsync demo     trainer + N engine processes syncing a synthetic Llama-shaped model, verified
//   wsync bench    the same figures as JSON, plus metadata and checksum costs; with
//                  --strategy cuda_ipc, GPU to GPU through CUDA IPC against a device copy
//   wsync inspect  a blob as JSON
//   wsync clean    segments in /dev/shm that no process uses any more
//   wsync kinds | options KIND | --version | help
//
// Process layout of demo/bench: the parent is the controller and the trainer; it forks the
// engines before any library handle exists (handles do not survive fork). Controller and
// engines talk over pipes in length-prefixed frames that carry only bytes: the init blob, each
//
// Files: cli.hpp (what the subcommands share), args.cpp, model.cpp (the synthetic model and the
// frames), shm_sync.cpp (demo, bench), bench_cuda_ipc.cpp, bench_copy.cpp (the receiver copy
// loop against memcpy), clean.cpp, main.cpp (dispatch, inspect, kinds, options, help).
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "cli.hpp"

namespace wsync_cli {

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "wsync: %s\n", what.c_str());
    std::exit(1);
}
// Bad command lines exit 2, like the other usage errors.
[[noreturn]] void usage_error(const std::string &what) {
    std::fprintf(stderr, "wsync: %s\n", what.c_str());
    std::exit(2);
}
void check(wsync_status_t st, const char *what) {
    if (st != WSYNC_OK)
        die(std::string(what) + ": " + wsync_status_string(st) + ": " + wsync_last_error());
}

namespace {

// The most bytes a blob may have: the library refuses larger ones (docs/wire-format.md), so
// inspect stops reading one byte past it instead of reading all of its input first (/dev/zero,
// a pipe that never ends, a stray model file).
constexpr size_t kMaxBlobBytes = WSYNC_MAX_BLOB_BYTES;  // the library's limit

// A subcommand's bad command line or input: "wsync CMD: what", exit 2 like the other usage
// errors (inspect: no blob to describe, like a malformed one).
[[noreturn]] void usage_error_of(const char *cmd, const std::string &what) {
    std::fprintf(stderr, "wsync %s: %s\n", cmd, what.c_str());
    std::exit(2);
}

// DLPack code/bits/lanes as the library names them in its messages: "bfloat16", "float32",
// "uint8", "float8_e4m3fn", "int64x4" (lanes); "dtype(code=99,bits=8,lanes=1)" for a triple
// the library does not move. wsync.h has the codes but no name function, hence this table.
std::string dtype_name(uint64_t code, uint64_t bits, uint64_t lanes) {
    struct Code {
        uint64_t code;
        const char *name;
        unsigned bits;  // bits a lane must have; 0: 8, 16, 32 or 64 (float, complex: see below)
    };
    static const Code kCodes[] = {
        {WSYNC_DTYPE_INT, "int", 0},
        {WSYNC_DTYPE_UINT, "uint", 0},
        {WSYNC_DTYPE_FLOAT, "float", 0},
        {WSYNC_DTYPE_BFLOAT, "bfloat", 16},
        {WSYNC_DTYPE_COMPLEX, "complex", 0},
        {WSYNC_DTYPE_BOOL, "bool", 8},
        {WSYNC_DTYPE_FLOAT8_E3M4, "float8_e3m4", 8},
        {WSYNC_DTYPE_FLOAT8_E4M3, "float8_e4m3", 8},
        {WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ, "float8_e4m3b11fnuz", 8},
        {WSYNC_DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn", 8},
        {WSYNC_DTYPE_FLOAT8_E4M3FNUZ, "float8_e4m3fnuz", 8},
        {WSYNC_DTYPE_FLOAT8_E5M2, "float8_e5m2", 8},
        {WSYNC_DTYPE_FLOAT8_E5M2FNUZ, "float8_e5m2fnuz", 8},
        {WSYNC_DTYPE_FLOAT8_E8M0FNU, "float8_e8m0fnu", 8},
        {WSYNC_DTYPE_FLOAT6_E2M3FN, "float6_e2m3fn", 6},
        {WSYNC_DTYPE_FLOAT6_E3M2FN, "float6_e3m2fn", 6},
        {WSYNC_DTYPE_FLOAT4_E2M1FN, "float4_e2m1fn", 4},
    };
    const Code *c = nullptr;
    for (const Code &k : kCodes)
        if (k.code == code) c = &k;
    bool ok = c && lanes >= 1 && lanes <= 0xffff && (bits * lanes) % 8 == 0;
    if (ok && c->bits) ok = bits == c->bits;
    else if (ok && code == WSYNC_DTYPE_FLOAT) ok = bits == 16 || bits == 32 || bits == 64;
    else if (ok && code == WSYNC_DTYPE_COMPLEX) ok = bits == 32 || bits == 64 || bits == 128;
    else if (ok) ok = bits == 8 || bits == 16 || bits == 32 || bits == 64;
    if (!ok)
        return "dtype(code=" + std::to_string(code) + ",bits=" + std::to_string(bits) +
               ",lanes=" + std::to_string(lanes) + ")";
    std::string s = c->name;
    if (c->bits == 0 || code == WSYNC_DTYPE_BFLOAT) s += std::to_string(bits);
    if (lanes != 1) s += "x" + std::to_string(lanes);
    return s;
}

// A request's tensor table carries dtypes as flattened DLPack triples ([2, 32, 1, ...]); add
// "dtype_names" beside them, one per tensor, so a reader need not decode the codes. Nothing
// else changes: the library's JSON keeps its keys, order and layout.
std::string with_dtype_names(const char *described) {
    nlohmann::json doc = nlohmann::json::parse(described, nullptr, false);
    if (doc.is_discarded() || !doc.is_object()) return described;
    auto body = doc.find("body");
    if (body == doc.end() || !body->is_object()) return described;
    auto tensors = body->find("tensors");
    if (tensors == body->end() || !tensors->is_object()) return described;
    auto dtypes = tensors->find("dtypes");
    if (dtypes == tensors->end() || !dtypes->is_array() || dtypes->size() % 3 != 0)
        return described;
    nlohmann::json names = nlohmann::json::array();
    for (size_t i = 0; i < dtypes->size(); i += 3) {
        const auto &c = (*dtypes)[i], &b = (*dtypes)[i + 1], &l = (*dtypes)[i + 2];
        if (!c.is_number_unsigned() || !b.is_number_unsigned() || !l.is_number_unsigned())
            return described;
        names.push_back(dtype_name(c.get<uint64_t>(), b.get<uint64_t>(), l.get<uint64_t>()));
    }
    (*tensors)["dtype_names"] = std::move(names);
    // The library's own layout (wsync_blob_describe): two-space indent, bad UTF-8 replaced.
    return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

int cmd_inspect(int argc, char **argv) {
    if (argc != 3) usage_error("usage: wsync inspect FILE   (FILE may be - for standard input)");
    const bool from_stdin = std::strcmp(argv[2], "-") == 0;
    const std::string what =
        from_stdin ? std::string("standard input") : "'" + std::string(argv[2]) + "'";
    FILE *f = from_stdin ? stdin : std::fopen(argv[2], "rb");
    if (!f) usage_error_of("inspect", "cannot open " + what + ": " + std::strerror(errno));
    // fopen() opens a directory for reading on Linux; only the first read fails (EISDIR).
    struct stat sb;
    const bool known = fstat(fileno(f), &sb) == 0;
    if (known && S_ISDIR(sb.st_mode))
        usage_error_of("inspect", what + " is a directory, not a blob file");
    // A regular file's size is known up front: refuse a big one without reading it.
    const std::string limit =
        "over the limit of " + std::to_string(kMaxBlobBytes) + " bytes (256 MiB) of a blob";
    if (known && S_ISREG(sb.st_mode) && uint64_t(sb.st_size) > kMaxBlobBytes)
        usage_error_of("inspect", what + ": " + std::to_string(sb.st_size) + " bytes, " + limit);
    // Other inputs (pipes, devices such as /dev/zero): read up to the limit, then one byte more
    // to learn whether the input goes past it.
    std::vector<uint8_t> buf;
    uint8_t tmp[65536];
    size_t got;
    while (buf.size() < kMaxBlobBytes &&
           (got = std::fread(tmp, 1, std::min(sizeof tmp, kMaxBlobBytes - buf.size()), f)) > 0)
        buf.insert(buf.end(), tmp, tmp + got);
    const bool over = buf.size() == kMaxBlobBytes && std::fgetc(f) != EOF;
    if (std::ferror(f))
        usage_error_of("inspect", "cannot read " + what + ": " + std::strerror(errno));
    if (f != stdin) std::fclose(f);
    if (over)
        usage_error_of("inspect", what + ": " + limit + " (stopped reading at " +
                                      std::to_string(kMaxBlobBytes + 1) + " bytes)");
    if (buf.empty()) usage_error_of("inspect", what + " is empty, not a blob");
    char *json = nullptr;
    wsync_status_t st = wsync_blob_describe(buf.data(), buf.size(), &json);
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "wsync inspect: %s: %s\n", wsync_status_string(st), wsync_last_error());
        return 2;
    }
    std::printf("%s\n", with_dtype_names(json).c_str());
    wsync_string_free(json);
    return 0;
}

// The kinds `wsync kinds` lists (wsync_strategy_kinds), as "shm, cuda_ipc, ...": what
// `options` takes, this build's own list rather than a copy that could go stale.
std::string kind_names() {
    char *json = nullptr;
    check(wsync_strategy_kinds(&json), "kinds");
    nlohmann::json kinds = nlohmann::json::parse(json, nullptr, false);
    wsync_string_free(json);
    std::string out;
    if (kinds.is_array())
        for (const auto &k : kinds)
            if (k.is_object() && k.contains("kind") && k["kind"].is_string())
                out += (out.empty() ? "" : ", ") + k["kind"].get<std::string>();
    return out.empty() ? "see: wsync kinds" : out;
}

void usage(FILE *out) {
    std::fprintf(out,
        "wsync %s: move model weights from trainers to inference engines\n\n"
        "usage:\n"
        "  wsync demo  [--size-mb N=1024] [--receivers N=2] [--steps N=5] [--no-checksum]\n"
        "              [--chunk-mb N=64] [--bucket-mb N] [--buckets N=3] [--timeout-ms N=60000]\n"
        "              [--dst-offset N=64] [--load copy|memcpy] [--split on|off] [--arena]\n"
        "              [--copy-threads N]\n"
        "      A trainer and N engine processes sync a synthetic Llama-shaped bf16 model for N\n"
        "      steps over shared memory; every engine verifies every tensor after every step.\n"
        "      --split on (default): a tensor larger than --chunk-mb crosses in parts (engines\n"
        "      load each part at its place); off: chunks and buckets grow to the largest tensor.\n"
        "      --arena: the trainer keeps the model in the sender's arena (\"arena_bytes\"), so\n"
        "      tensors cross in place: engines copy from the trainer's memory, nothing is packed.\n"
        "      --copy-threads N: the \"copy_threads\" option of trainer and engines (threads that\n"
        "      pack, copy and checksum one large tensor; 0: one per CPU, the default).\n"

        "  wsync bench [same flags; --size-mb 2048 --receivers 1 by default] [--json]\n"
        "              [--no-checksum-compare] [--no-arena-compare] [--rounds N=3]\n"
        "              [--dst-offset N=64] [--load copy|memcpy] [--split on|off] [--no-copy-bench]\n"
        "      The same run printed as JSON, with checksums off and on, engines' parameters N bytes\n"
        "      past a page (64: as PyTorch allocates) and page-aligned, and the model in the\n"
        "      sender's arena (off and on); the receiver copy loop (wsync_recv_copy) against glibc\n"
        "      memcpy at both alignments, in one process; and the metadata cost (plan + encode +\n"
        "      decode) per tensor over 10,000 tensors. Every mode runs once per round, in turn;\n"
        "      ratios are taken within a round (median and range over rounds), beside one-core\n"
        "      memcpy and two threads of memcpy at once (what a second core adds on this host).\n"
        "  wsync bench --strategy cuda_ipc [--packed true|false] [--dtype bfloat16|float16]\n"
        "              [--size-gb N=16 | --size-mb N] [--steps N=5] [--bucket-mb N=1024] [--json]\n"
        "              [--load apply|views]\n"
        "      GPU 0 to GPU 0 between two processes through CUDA IPC, against one device copy of\n"
        "      the same bytes. Opens the driver at run time (WSYNC_CUDA_LIBRARY, else libcuda.so.1).\n"
        "      --load apply (default): the engine loads each chunk with one wsync_recv_apply into\n"
        "      a destination table (one kernel launch); views: a device copy out of each view.\n"
        "  wsync bench --strategy ucx [--transports tcp] [--net-devices lo] [--size-mb N=2048]\n"
        "              [--chunk-mb N=64] [--steps N] [--engine-netns NAME] [--gpu | --arena] [--json]\n"
        "              [--load land|apply|copy|memcpy]\n"
        "      The ucx kind to forked engines, against UCX's own GET bandwidth (ucx_perftest\n"
        "      ucp_get, chunk-sized messages) and torch.distributed gloo broadcasting the same bytes\n"
        "      over the same device (python: $WSYNC_BENCH_PYTHON, the vLLM venv, python3) in the\n"
        "      same run. --gpu: the\n"
        "      model on GPU 0 on both sides (the trainer's GPU packs into pinned staging memory,\n"
        "      engines with \"device\": 0 copy into device memory; WSYNC_CUDA_LIBRARY as above).\n"
        "      --arena: the trainer keeps the model in the sender's arena, laid out as chunks are\n"
        "      packed, so chunks are sent from there (hashed, not copied).\n"
        "      --load land (default without --gpu): engines land chunks straight in their\n"
        "      parameters (wsync_receiver_land) and load each with one wsync_recv_apply; apply:\n"
        "      the same without landing; copy: wsync_recv_copy per tensor; memcpy: out of views.\n"
        "  wsync bench --delta-fraction F[,F...] [--delta auto|on|size[,...]] [--size-mb N=2048]\n"
        "              [--steps N=4]\n"
        "              [--strategy shm|ucx|cuda_ipc] [--delta-base-memory device|pinned_host]\n"
        "              [--delta-threads N] [--mirror] [--paired] [--json]\n"
        "      Delta sync against dense in one run (docs/delta.md): per fraction F of elements\n"
        "      changed each step, bytes moved, send, apply and sync time, and ratios. shm by\n"
        "      default; ucx: the engine pulls over UCX (--transports tcp --net-devices lo);\n"
        "      cuda_ipc: GPU 0 to GPU 0 between two processes, compared and applied on\n"
        "      the GPU; --delta-base-memory pinned_host keeps the trainer's bases in pinned host\n"
        "      memory; --delta-threads N (shm): the trainer's compare threads (\"delta_threads\").\n"
        "      --mirror (shm): engines keep a mirror (\"delta_mirror\") and load from\n"
        "      views; adds the dense row of such engines. --delta: auto (by cost, default),\n"
        "      size (auto comparing every version), on; several comma-separated run each.\n"
        "      The last column says which way each version went (P patches, D dense).\n"
        "      --paired (shm, ucx): each row runs beside a dense configuration of its own,\n"
        "      alternating versions, and its ratios are to that one (printed above it); dense\n"
        "      also runs again at the end (\"dense2\": the baseline's spread within the run).\n"
        "  wsync inspect FILE|-     print an init-info or request blob as JSON (exit 2 if malformed,\n"
        "                           empty or over 256 MiB); a request's tensor table gains\n"
        "                           \"dtype_names\" beside its DLPack \"dtypes\"\n"
        "  wsync clean [--dry-run] [--force]\n"
        "                           remove this user's segments in /dev/shm (wsync-<hex>,\n"
        "                           wsync-ipc-<hex>) that no process has open or mapped: what a\n"
        "                           trainer killed before its engines attached leaves behind.\n"
        "                           Removes nothing while a process of this user cannot be\n"
        "                           inspected (--force: anyway); run it where trainers' and\n"
        "                           engines' processes are visible (their PID namespace)\n"
        "  wsync kinds              the strategies this build knows\n"
        "  wsync options KIND       a strategy's options\n"
        "  wsync --version | help\n",
        wsync_version_string());
}


}  // namespace
}  // namespace wsync_cli

using namespace wsync_cli;

int main(int argc, char **argv) {
    if (wsync_version_number() / 10000 != WSYNC_VERSION_MAJOR)
        die("libwsync major version differs from the one wsync was built with");
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    std::string cmd = argv[1];
    char *json = nullptr;
    if (cmd == "demo") return cmd_demo(parse_args(argc, argv, 2, false));
    if (cmd == "bench") {
        for (int i = 2; i < argc; ++i)
            if (std::strcmp(argv[i], "--delta-fraction") == 0) return cmd_bench_delta(argc, argv, 2);
        return cmd_bench(parse_args(argc, argv, 2, true));
    }
    if (cmd == "inspect") return cmd_inspect(argc, argv);
    if (cmd == "clean") return cmd_clean(argc, argv);
    if (cmd == "kinds") {
        check(wsync_strategy_kinds(&json), "kinds");
    } else if (cmd == "options") {
        if (argc != 3)
            usage_error_of("options", (argc < 3 ? std::string("missing KIND")
                                                : "takes one KIND, got " + std::to_string(argc - 2)) +
                                          " (one of: " + kind_names() + ")");
        wsync_status_t st = wsync_strategy_describe_options(argv[2], &json);
        if (st != WSYNC_OK) {
            std::fprintf(stderr, "wsync: %s\n", wsync_last_error());
            return 2;
        }
    } else if (cmd == "--version" || cmd == "version") {
        std::printf("wsync %s\n", wsync_version_string());
        return 0;
    } else if (cmd == "help" || cmd == "--help" || cmd == "-h") {
        usage(stdout);
        return 0;
    } else {
        std::fprintf(stderr, "wsync: unknown command '%s'\n\n", cmd.c_str());
        usage(stderr);
        return 2;
    }
    std::printf("%s\n", json);
    wsync_string_free(json);
    return 0;
}
