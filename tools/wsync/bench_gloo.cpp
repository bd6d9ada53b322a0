// The gloo row of `wsync bench --strategy ucx` (issue 37 item 6): torch.distributed's gloo
// backend broadcasting the same number of bytes between two processes over the same device, in
// the same run, as what a CPU user would pick instead of the ucx kind. Rank 0 (the "trainer")
// runs here, rank 1 (the "engine") in --engine-netns when one is named, both bound to
// --net-devices (GLOO_SOCKET_IFNAME; between namespaces both ends of the veth carry that name,
// as for the ucx_perftest row). The Python script is embedded so an installed tool needs no
// data file. The interpreter: $WSYNC_BENCH_PYTHON, else the vLLM stage's venv
// ($WSYNC_VLLM_VENV, default /tmp/wsync-vllm-venv, scripts/test-vllm.sh), else /usr/bin/python3
// (Debian's python3-torch, which scripts/install-deps.sh installs), else python3 on PATH:
// the first that imports torch.distributed with gloo. None: the row says so.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <signal.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "cli.hpp"

namespace wsync_cli {
namespace {

// argv: rank, address, port, bytes, timed broadcasts. Rank 1 checks the bytes it received
// after the last broadcast and prints the median time of the timed ones (a first, untimed
// broadcast makes gloo's connections). A barrier before each broadcast starts both ranks together.
const char kScript[] = R"PY(
import statistics, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
rank, addr, port, nbytes, iters = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
dist.init_process_group("gloo", init_method="tcp://%s:%s" % (addr, port), rank=rank, world_size=2,
                        timeout=timedelta(seconds=120))
x = torch.empty(nbytes, dtype=torch.uint8)
x.fill_(0x5A if rank == 0 else 0)
times = []
for i in range(iters + 1):
    dist.barrier()
    t = time.perf_counter()
    dist.broadcast(x, 0)
    times.append(time.perf_counter() - t)
if rank == 1:
    ok = bool((x == 0x5A).all())
    print("gloo_steady_s %.6f %s" % (statistics.median(times[1:]), "ok" if ok else "corrupt"), flush=True)
dist.destroy_process_group()
)PY";

bool has_gloo(const std::string &python) {
    const std::string cmd = "'" + python +
                            "' -c 'import torch.distributed as d, sys; sys.exit(not d.is_gloo_available())' "
                            ">/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
}

std::string find_python() {
    std::vector<std::string> tries;
    if (const char *p = std::getenv("WSYNC_BENCH_PYTHON")) tries.push_back(p);
    const char *venv = std::getenv("WSYNC_VLLM_VENV");
    tries.push_back(std::string(venv ? venv : "/tmp/wsync-vllm-venv") + "/bin/python");
    tries.push_back("/usr/bin/python3");  // Debian's python3-torch (scripts/install-deps.sh)
    tries.push_back("python3");
    for (const std::string &p : tries)
        if (has_gloo(p)) return p;
    return "";
}

}  // namespace

GlooRow gloo_broadcast(const Args &a, uint64_t bytes, const std::string &trainer_address) {
    GlooRow row;
    row.python = find_python();
    if (row.python.empty()) {
        row.why = "torch with gloo is not importable (tried $WSYNC_BENCH_PYTHON, the vLLM venv, /usr/bin/python3, python3)";
        return row;
    }
    const std::string port = std::to_string(40000 + getpid() % 20000);
    const std::string iters = std::to_string(std::max<uint32_t>(a.steps, 2));
    const std::string n = std::to_string(bytes);
    setenv("GLOO_SOCKET_IFNAME", a.net_devices.c_str(), 1);
    pid_t trainer = fork();
    if (trainer == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("timeout", "timeout", "300", row.python.c_str(), "-c", kScript, "0", trainer_address.c_str(),
               port.c_str(), n.c_str(), iters.c_str(), (char *)nullptr);
        _exit(127);
    }
    // Rank 1 through a shell (ip netns exec), the script in a file so the command line stays short.
    char path[] = "/tmp/wsync-gloo-XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) {
        (void)!write(fd, kScript, sizeof kScript - 1);
        close(fd);
    }
    const std::string cmd = std::string("timeout 300 ") +
                            (a.engine_netns.empty() ? "" : "ip netns exec " + a.engine_netns + " ") + "'" +
                            row.python + "' " + path + " 1 " + trainer_address + " " + port + " " + n + " " +
                            iters + " 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    char line[512], verdict[16] = "";
    std::string tail;
    while (p && fgets(line, sizeof line, p)) {
        double s = 0;
        if (std::sscanf(line, "gloo_steady_s %lf %15s", &s, verdict) == 2) row.steady_s = s;
        else tail = line;
    }
    const int rc = p ? pclose(p) : -1;
    kill(trainer, SIGKILL);
    waitpid(trainer, nullptr, 0);
    unlink(path);
    unsetenv("GLOO_SOCKET_IFNAME");
    if (row.steady_s > 0 && std::strcmp(verdict, "ok") != 0) {
        row.why = "gloo's broadcast delivered other bytes than rank 0 sent";
        row.steady_s = 0;
    } else if (row.steady_s <= 0) {
        while (!tail.empty() && (tail.back() == '\n' || tail.back() == '"' || tail.back() == '\\')) tail.pop_back();
        for (char &c : tail)
            if (c == '"' || c == '\\') c = '\'';
        row.why = "the gloo broadcast gave no figure (exit " + std::to_string(rc) + "): " + tail;
    }
    return row;
}

}  // namespace wsync_cli
