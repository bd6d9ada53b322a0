// wsync: the command-line tool. A real consumer of the library: it uses only include/wsync.h.
//
//   wsync demo     trainer + N engine processes syncing a synthetic Llama-shaped model, verified
//   wsync bench    the same figures as JSON, plus metadata and checksum costs; with
//                  --strategy cuda_ipc, GPU to GPU through CUDA IPC against a device copy
//   wsync inspect  a blob as JSON
//   wsync kinds | options KIND | --version | help
//
// Process layout of demo/bench: the parent is the controller and the trainer; it forks the
// engines before any library handle exists (handles do not survive fork). Controller and
// engines talk over pipes in length-prefixed frames that carry only bytes: the init blob, each
//
// Files: cli.hpp (what the subcommands share), args.cpp, model.cpp (the synthetic model and the
// frames), shm_sync.cpp (demo, bench), bench_cuda_ipc.cpp, bench_copy.cpp (the receiver copy
// loop against memcpy), main.cpp (dispatch, inspect, kinds, options, help).
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

int cmd_inspect(int argc, char **argv) {
    if (argc != 3) usage_error("usage: wsync inspect FILE   (FILE may be - for standard input)");
    FILE *f = std::strcmp(argv[2], "-") == 0 ? stdin : std::fopen(argv[2], "rb");
    if (!f) usage_error(std::string("cannot open '") + argv[2] + "': " + std::strerror(errno));
    std::vector<uint8_t> buf;
    uint8_t tmp[65536];
    size_t got;
    while ((got = std::fread(tmp, 1, sizeof tmp, f)) > 0) buf.insert(buf.end(), tmp, tmp + got);
    if (f != stdin) std::fclose(f);
    char *json = nullptr;
    wsync_status_t st = wsync_blob_describe(buf.data(), buf.size(), &json);
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "wsync inspect: %s: %s\n", wsync_status_string(st), wsync_last_error());
        return 2;
    }
    std::printf("%s\n", json);
    wsync_string_free(json);
    return 0;
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
        "              [--no-checksum-compare] [--no-arena-compare]\n"
        "              [--dst-offset N=64] [--load copy|memcpy] [--split on|off] [--no-copy-bench]\n"
        "      The same run printed as JSON, with checksums off and on, engines' parameters N bytes\n"
        "      past a page (64: as PyTorch allocates) and page-aligned, and the model in the\n"
        "      sender's arena (off and on); the receiver copy loop (wsync_recv_copy) against glibc\n"
        "      memcpy at both alignments, in one process; and the metadata cost (plan + encode +\n"
        "      decode) per tensor over 10,000 tensors.\n"
        "  wsync bench --strategy cuda_ipc [--packed true|false] [--dtype bfloat16|float16]\n"
        "              [--size-gb N=16 | --size-mb N] [--steps N=5] [--bucket-mb N=1024] [--json]\n"
        "      GPU 0 to GPU 0 between two processes through CUDA IPC, against one device copy of\n"
        "      the same bytes. Opens the driver at run time (WSYNC_CUDA_LIBRARY, else libcuda.so.1).\n"
        "  wsync bench --strategy ucx [--transports tcp] [--net-devices lo] [--size-mb N=2048]\n"
        "              [--chunk-mb N=64] [--steps N] [--engine-netns NAME] [--gpu] [--json]\n"
        "      The ucx kind to forked engines, against UCX's own GET bandwidth (ucx_perftest\n"
        "      ucp_get, chunk-sized messages) over the same transports in the same run. --gpu: the\n"
        "      model on GPU 0 on both sides (the trainer's GPU packs into pinned staging memory,\n"
        "      engines with \"device\": 0 copy into device memory; WSYNC_CUDA_LIBRARY as above).\n"
        "  wsync bench --delta-fraction F[,F...] [--delta auto|on] [--size-mb N=2048] [--steps N=4]\n"
        "              [--strategy shm|ucx|cuda_ipc] [--delta-base-memory device|pinned_host]\n"
        "              [--delta-threads N] [--mirror] [--json]\n"
        "      Delta sync against dense in one run (docs/delta.md): per fraction F of elements\n"
        "      changed each step, bytes moved, send, apply and sync time, and ratios. shm by\n"
        "      default; ucx: the engine pulls over UCX (--transports tcp --net-devices lo);\n"
        "      cuda_ipc: GPU 0 to GPU 0 between two processes, compared and applied on\n"
        "      the GPU; --delta-base-memory pinned_host keeps the trainer's bases in pinned host\n"
        "      memory; --delta-threads N (shm): the trainer's compare threads (\"delta_threads\").\n"
        "      --mirror (shm): engines keep a mirror (\"delta_mirror\") and load from\n"
        "      views; adds the dense row of such engines.\n"
        "  wsync inspect FILE|-     print an init-info or request blob as JSON (exit 2 if malformed)\n"
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
    if (cmd == "kinds") {
        check(wsync_strategy_kinds(&json), "kinds");
    } else if (cmd == "options" && argc == 3) {
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
