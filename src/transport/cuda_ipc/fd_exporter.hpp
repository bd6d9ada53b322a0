// Descriptors handed out by key to processes of the same user, over an abstract Unix socket:
// how a cuda_ipc sender gives engines the POSIX file descriptors of the virtual-memory
// allocations it shares (cuMemExportToShareableHandle), which, unlike cuIpcGetMemHandle's
// 64-byte handles, cannot travel inside a request blob.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sys.hpp"

namespace wsync::sys {

// The protocol, one SOCK_SEQPACKET connection for any number of requests: the client sends an
// 8-byte key (host byte order: both ends are on one machine); the server answers one byte, 'W'
// with the key's descriptor attached (SCM_RIGHTS) or 'N' for a key it does not hold. The
// server answers only a peer of its own user (SO_PEERCRED), as the file system would a 0600
// file, and the client talks only to a server of its own user. A helper thread serves one
// connection at a time, each for at most kFdExporterConnectionMs, and wakes at least every
// 100 ms to see whether it must stop.
constexpr int kFdExporterConnectionMs = 2000;

class FdExporter {
public:
    // `name`: the abstract socket's name without the leading NUL. Throws WSYNC_ERR_SYSTEM
    // naming `who` if the socket cannot be made (the name taken, no sockets).
    FdExporter(const std::string &name, const std::string &who);
    // Stops the thread (within 100 ms) and closes every descriptor held.
    ~FdExporter();
    FdExporter(const FdExporter &) = delete;
    FdExporter &operator=(const FdExporter &) = delete;

    const std::string &name() const { return name_; }
    // Takes `fd` (closed by remove() or the destructor) and serves it under `key`.
    void add(uint64_t key, int fd);
    // Stops serving `key` and closes its descriptor. No-op for an unknown key.
    void remove(uint64_t key) noexcept;

private:
    void run();
    void serve(int c);
    std::string name_;
    int listen_fd_ = -1;
    int stop_fd_ = -1;
    std::mutex mu_;
    std::map<uint64_t, int> fds_;
    std::thread thread_;
};

// The descriptors of `keys` from the FdExporter `name`, in order, over one connection, within
// the deadline; each is this process's own (close it). No server (or one of another user):
// WSYNC_ERR_UNAVAILABLE, `gone` saying why; a key the server does not hold:
// WSYNC_ERR_UNAVAILABLE naming it; no answer in time: WSYNC_ERR_TIMEOUT. On failure no
// descriptor stays open.
std::vector<int> fetch_fds(const std::string &name, const std::vector<uint64_t> &keys,
                           const Deadline &deadline, const std::string &who, const std::string &gone);

}  // namespace wsync::sys
