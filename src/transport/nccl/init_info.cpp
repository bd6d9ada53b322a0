#include "transport/nccl/init_info.hpp"

#include <arpa/inet.h>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "gpu/pack.hpp"
#include "wire.hpp"

namespace wsync::nccl {

InitInfo parse_init_info(const json &body) {
    const std::string w = "nccl_broadcast init info";
    InitInfo info{};
    const json &id = wire::field(body, "unique_id", w);
    if (!id.is_binary() || id.get_binary().size() != sizeof(gpu::ncclUniqueId))
        wire::malformed(w + ": unique_id is not a 128-byte NCCL unique id");
    std::memcpy(info.id.internal, id.get_binary().data(), sizeof info.id.internal);
    info.nranks = static_cast<uint32_t>(wire::uint_field(body, "nranks", w, kMaxReceivers + 1));
    if (info.nranks < 2) wire::malformed(w + ": nranks must be at least 2 (a sender and a receiver)");
    info.bucket_bytes = wire::uint_field(body, "bucket_bytes", w, uint64_t(1) << 40);
    if (info.bucket_bytes == 0) wire::malformed(w + ": bucket_bytes is 0");
    info.dtype = wire::string_field(body, "dtype", w, 16);
    if (!gpu::is_cast_name(info.dtype))
        wire::malformed(w + ": dtype '" + info.dtype + "' is not one libwsync casts to");
    info.nccl_version = static_cast<int>(wire::uint_field(body, "nccl_version", w, INT32_MAX));
    if (body.contains("sender_gpu")) {  // optional: an older trainer's init info has none
        const std::string &text = wire::string_field(body, "sender_gpu", w, 64);
        if (!gpu::parse_uuid(text, &info.sender_gpu))
            wire::malformed(w + ": sender_gpu '" + wire::printable(text) + "' is not a GPU UUID");
        info.has_sender_gpu = true;
    }
    if (body.contains("control")) {  // optional: an older trainer's init info has none
        const json &c = wire::object_field(body, "control", w);
        info.control.port = static_cast<uint16_t>(wire::uint_field(c, "port", w + " control", 65535));
        for (const json &h : wire::array_field(c, "hosts", w + " control", 8)) {
            in_addr a{};
            if (!h.is_string() || h.get_ref<const std::string &>().size() > 15 ||
                inet_pton(AF_INET, h.get_ref<const std::string &>().c_str(), &a) != 1)
                wire::malformed(w + ": control hosts holds something other than an IPv4 address");
            info.control.hosts.push_back(h.get<std::string>());
        }
        const json &key = wire::field(c, "key", w + " control");
        if (!key.is_binary() || key.get_binary().size() != info.control.key.size())
            wire::malformed(w + ": control key is not 32 bytes");
        std::memcpy(info.control.key.data(), key.get_binary().data(), info.control.key.size());
        if (info.control.port == 0 || info.control.hosts.empty())
            wire::malformed(w + ": control names no port or no host");
        info.has_control = true;
    }
    info.group = XXH3_64bits(info.id.internal, sizeof info.id.internal);
    return info;
}

}  // namespace wsync::nccl
