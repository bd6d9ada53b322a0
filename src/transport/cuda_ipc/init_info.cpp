#include "transport/cuda_ipc/init_info.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "transport/local/board.hpp"
#include "error.hpp"
#include "gpu/pack.hpp"
#include "wire.hpp"

namespace wsync::cuda_ipc {

std::string host_boot_id() {
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "unknown";
    char buf[64] = {};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    std::string s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s.empty() ? "unknown" : s;
}

InitInfo parse_init_info(const json &body) {
    const std::string w = "cuda_ipc init info";
    InitInfo info;
    info.segment = wire::string_field(body, "segment", w, 255);
    if (info.segment.size() < 2 || info.segment[0] != '/' ||
        info.segment.find('/', 1) != std::string::npos)
        wire::malformed(w + ": segment name '" + info.segment + "' is not a POSIX shm name");
    info.rendezvous = wire::string_field(body, "rendezvous", w, 64);
    if (info.rendezvous.empty() || info.rendezvous.find('\0') != std::string::npos)
        wire::malformed(w + ": rendezvous is not a socket name");
    info.host = wire::string_field(body, "host", w, 64);
    info.senders = static_cast<uint32_t>(wire::uint_field(body, "senders", w, board::kMaxReceivers));
    info.receivers =
        static_cast<uint32_t>(wire::uint_field(body, "receivers", w, board::kMaxReceivers));
    info.buckets = static_cast<uint32_t>(wire::uint_field(body, "buckets", w, board::kMaxSlots));
    info.bucket_bytes = wire::uint_field(body, "bucket_bytes", w, uint64_t(1) << 40);
    info.packed = wire::bool_field(body, "packed", w);
    info.dtype = wire::string_field(body, "dtype", w, 16);
    if (info.senders == 0 || info.receivers == 0 || info.buckets == 0 || info.bucket_bytes == 0)
        wire::malformed(w + ": senders, receivers, buckets or bucket_bytes is 0");
    if (!gpu::is_cast_name(info.dtype))
        wire::malformed(w + ": dtype '" + info.dtype + "' is not one libwsync casts to");
    if (!info.packed && !info.dtype.empty())
        wire::malformed(w + ": a dtype cast needs packed=true");
    if (info.host != host_boot_id())
        fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": init info comes from another host (boot id " +
                                     info.host + ", this host's is " + host_boot_id() +
                                     "); CUDA IPC works only between processes of one machine");
    return info;
}

}  // namespace wsync::cuda_ipc
