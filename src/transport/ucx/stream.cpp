#include "transport/ucx/stream.hpp"

#include <arpa/inet.h>
#include <cstring>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <net/if.h>
#include <unistd.h>

namespace wsync::ucx {

Mac stream_proof(const Key &connection_key, const Nonce &nonce, uint32_t index, uint64_t token) {
    static const char label[] = "wsync-ucx-stream";
    std::vector<uint8_t> d(label, label + sizeof label - 1);
    d.insert(d.end(), nonce.begin(), nonce.end());
    for (int i = 0; i < 4; ++i) d.push_back(static_cast<uint8_t>(index >> (8 * i)));
    for (int i = 0; i < 8; ++i) d.push_back(static_cast<uint8_t>(token >> (8 * i)));
    return hmac(connection_key.data(), connection_key.size(), d.data(), d.size());
}

std::string encode_stream_address(const sockaddr_storage &a) { return kStreamOffer + address_text(a); }

bool decode_stream_address(const std::string &text, sockaddr_storage *out, socklen_t *len) {
    std::memset(out, 0, sizeof *out);
    const std::string offer(kStreamOffer);
    if (text.compare(0, offer.size(), offer) != 0) return false;
    std::string host = text.substr(offer.size());
    const std::size_t colon = host.rfind(':');
    if (colon == std::string::npos || colon + 1 >= host.size() || host.size() - colon > 6) return false;
    const std::string port_text = host.substr(colon + 1);
    host.resize(colon);
    unsigned port = 0;
    for (char c : port_text) {
        if (c < '0' || c > '9') return false;
        port = port * 10 + static_cast<unsigned>(c - '0');
    }
    if (port == 0 || port > 65535) return false;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
        auto &in = reinterpret_cast<sockaddr_in6 &>(*out);
        in.sin6_family = AF_INET6;
        in.sin6_port = htons(static_cast<uint16_t>(port));
        *len = sizeof in;
        return inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &in.sin6_addr) == 1;
    }
    auto &in = reinterpret_cast<sockaddr_in &>(*out);
    in.sin_family = AF_INET;
    in.sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof in;
    return inet_pton(AF_INET, host.c_str(), &in.sin_addr) == 1;
}

bool device_stream_address(const std::string &devices, sockaddr_storage *out, socklen_t *len) {
    struct ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return false;
    bool found = false;
    for (std::size_t at = 0; !found && at < devices.size();) {
        std::size_t comma = devices.find(',', at);
        if (comma == std::string::npos) comma = devices.size();
        std::string dev = devices.substr(at, comma - at);
        at = comma + 1;
        if (auto colon = dev.find(':'); colon != std::string::npos) dev.resize(colon);  // "mlx5_0:1"
        for (int family : {AF_INET, AF_INET6}) {
            for (struct ifaddrs *i = list; i && !found; i = i->ifa_next) {
                if (!i->ifa_addr || i->ifa_addr->sa_family != family || dev != i->ifa_name) continue;
                if (!(i->ifa_flags & IFF_UP)) continue;
                std::memset(out, 0, sizeof *out);
                if (family == AF_INET) {
                    std::memcpy(out, i->ifa_addr, sizeof(sockaddr_in));
                    *len = sizeof(sockaddr_in);
                } else {
                    const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(i->ifa_addr);
                    if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;  // needs a scope the peer lacks
                    std::memcpy(out, i->ifa_addr, sizeof(sockaddr_in6));
                    *len = sizeof(sockaddr_in6);
                }
                found = true;
            }
            if (found) break;
        }
    }
    freeifaddrs(list);
    return found;
}

std::string address_text(const sockaddr_storage &a) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (a.ss_family == AF_INET) {
        const auto &in = reinterpret_cast<const sockaddr_in &>(a);
        inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
        return std::string(buf) + ":" + std::to_string(ntohs(in.sin_port));
    }
    const auto &in = reinterpret_cast<const sockaddr_in6 &>(a);
    inet_ntop(AF_INET6, &in.sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in.sin6_port));
}

Stream::~Stream() {
    if (fd >= 0) ::close(fd);
}

}  // namespace wsync::ucx
