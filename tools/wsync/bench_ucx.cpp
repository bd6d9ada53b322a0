// wsync bench --strategy ucx: the synthetic model synced to forked engines through the ucx kind
// (every step verified), against UCX's own one-sided GET bandwidth in the same run: Debian's
// ucx_perftest (ucx-utils), "ucp_get" with messages of the chunk size, between two processes
// over the same transports and devices. Steady sync time counts everything a sync costs (the
// trainer's pack and checksum, leases, GETs, verification, the engine's load, acknowledgements);
// the baseline is GETs alone, so the ratio is what the library keeps of the wire. The gloo row
// (bench_gloo.cpp) is what a CPU user would use instead: torch.distributed broadcasting the same
// bytes between two processes over the same device.
#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <ifaddrs.h>
#include <sched.h>
#include <signal.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.hpp"

namespace wsync_cli {

void enter_netns(const std::string &name) {
    const std::string path = "/run/netns/" + name;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
        die("cannot enter network namespace '" + name + "' (" + path + "): " + std::strerror(errno));
    close(fd);
}

namespace {

// The IPv4 address of `device` in this process's network namespace ("" if none).
std::string device_address(const std::string &device) {
    struct ifaddrs *list = nullptr;
    std::string out;
    if (getifaddrs(&list) != 0) return out;
    for (struct ifaddrs *i = list; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && device == i->ifa_name) {
            char buf[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr, buf, sizeof buf);
            out = buf;
            break;
        }
    freeifaddrs(list);
    return out;
}

// Runs ucx_perftest as server and client; returns bytes/s of the client's "Final:" line (its
// overall bandwidth column, MB/s of 2^20 bytes), or 0 with *why set.
double raw_get_bandwidth(const Args &a, uint64_t msg_bytes, uint64_t total, std::string *why) {
    setenv("UCX_TLS", a.transports.c_str(), 1);
    setenv("UCX_NET_DEVICES", a.net_devices.c_str(), 1);
    const std::string port = std::to_string(20000 + getpid() % 20000);
    const uint64_t iters = std::max<uint64_t>(4, total / msg_bytes * 2);
    pid_t server = fork();
    if (server == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("ucx_perftest", "ucx_perftest", "-p", port.c_str(), (char *)nullptr);
        _exit(127);
    }
    usleep(500000);
    const std::string host = a.engine_netns.empty() ? "127.0.0.1" : device_address(a.net_devices);
    const std::string cmd = (a.engine_netns.empty() ? "" : "ip netns exec " + a.engine_netns + " ") +
                            "ucx_perftest " + host + " -p " + port + " -t ucp_get -s " +
                            std::to_string(msg_bytes) + " -n " + std::to_string(iters) + " -w 1 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    double mbps = 0;
    char line[512];
    while (p && fgets(line, sizeof line, p)) {
        double f[8];
        if (std::strncmp(line, "Final:", 6) == 0 &&
            std::sscanf(line + 6, "%lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]) == 6)
            mbps = f[5];
    }
    const int rc = p ? pclose(p) : -1;
    kill(server, SIGKILL);
    waitpid(server, nullptr, 0);
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
    if (mbps <= 0) *why = "ucx_perftest gave no figure (exit " + std::to_string(rc) + "; is ucx-utils installed?)";
    return mbps * 1048576.0;
}

// This process's peak resident memory (VmHWM), bytes; 0 if unknown.
uint64_t peak_rss_bytes() {
    FILE *f = std::fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) == 1) break;
    if (f) std::fclose(f);
    return kb * 1024;
}

}  // namespace

int cmd_bench_ucx(const Args &given) {
    // Engines load as a host engine should: one wsync_recv_apply per chunk into a destination
    // table that the receiver also lands chunks in (--load land), unless --load says otherwise.
    Args a = given;
    if (!a.load_set && !a.gpu) a.load_table = a.load_land = true;
    RunResult r = run_sync(a, a.checksum, !a.json, Baselines::None);
    // The trainer's peak resident memory: the model, and staging (keep_versions 1: up to two
    // versions of chunk buffers), none of which an arena run needs.
    const uint64_t trainer_peak = peak_rss_bytes();
    const uint64_t chunk = a.chunk_mb << 20;
    std::string why;
    const double raw = raw_get_bandwidth(a, chunk, r.bytes, &why);
    const std::string host = a.engine_netns.empty() ? "127.0.0.1" : device_address(a.net_devices);
    const GlooRow gloo = gloo_broadcast(a, r.bytes, host);
    const double steady = r.steady_s();
    const double sync_bps = r.bytes / steady;
    const double gloo_bps = gloo.steady_s > 0 ? r.bytes / gloo.steady_s : 0;
    auto error = [](const char *key, const std::string &text) {
        return text.empty() ? std::string() : ", \"" + std::string(key) + "\": \"" + text + "\"";
    };
    // ratio_to_gloo: the sync's rate over gloo's; the target is >= 1/1.1 (0.909).
    std::printf("{\"strategy\": \"ucx\", \"gpu\": %s, \"engine_netns\": \"%s\", \"transports\": \"%s\", \"net_devices\": \"%s\", "
                "\"bytes\": %" PRIu64 ", \"tensors\": %zu, \"chunks\": %zu, \"receivers\": %u, "
                "\"checksum\": %s, \"load\": \"%s\", \"arena\": %s, \"trainer_peak_rss_mb\": %.0f, \"first_sync_s\": %.6f, \"steady_sync_s\": %.6f, "
                "\"steady_gbps\": %.3f, \"raw_get_gbps\": %.3f, \"raw_get_message_bytes\": %" PRIu64
                ", \"ratio_to_raw_get\": %.3f, \"gloo_steady_s\": %.6f, \"gloo_gbps\": %.3f, \"ratio_to_gloo\": %.3f, "
                "\"gloo_python\": \"%s\", \"steps_s\": %s%s%s}\n",
                a.gpu ? "true" : "false", a.engine_netns.c_str(), a.transports.c_str(), a.net_devices.c_str(), r.bytes, r.tensors, r.chunks, a.receivers,
                a.checksum ? "true" : "false",
                a.load_land ? "land" : a.load_table ? "apply" : a.gpu || a.load_copy ? "copy" : "memcpy",
                a.arena ? "true" : "false", trainer_peak / 1048576.0, r.step_s[0], steady, sync_bps / 1e9, raw / 1e9, chunk,
                raw > 0 ? sync_bps / raw : 0.0, gloo.steady_s, gloo_bps / 1e9, gloo_bps > 0 ? sync_bps / gloo_bps : 0.0,
                gloo.python.c_str(), json_list(r.step_s).c_str(), error("raw_get_error", why).c_str(),
                error("gloo_error", gloo.why).c_str());
    return 0;
}

}  // namespace wsync_cli
