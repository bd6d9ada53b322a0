#include "error.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace wsync {

[[noreturn]] void fail(wsync_status_t status, const std::string &message) {
    throw Error(status, message);
}

namespace {
std::string vformat(const char *format, va_list ap) {
    va_list again;
    va_copy(again, ap);
    char small[256];
    const int n = std::vsnprintf(small, sizeof small, format, ap);
    std::string out;
    if (n < 0) {
        out = format;  // an encoding error: the format itself still names the place
    } else if (static_cast<std::size_t>(n) < sizeof small) {
        out.assign(small, static_cast<std::size_t>(n));
    } else {
        out.resize(static_cast<std::size_t>(n));
        std::vsnprintf(&out[0], out.size() + 1, format, again);
    }
    va_end(again);
    return out;
}
}  // namespace

std::string strf(const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    std::string s = vformat(format, ap);
    va_end(ap);
    return s;
}

[[noreturn]] void failf(wsync_status_t status, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    std::string s = vformat(format, ap);
    va_end(ap);
    throw Error(status, std::move(s));
}

[[noreturn]] void fail_errno(const std::string &what, int err) {
    throw Error(WSYNC_ERR_SYSTEM,
                what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
}

const char *status_name(wsync_status_t status) noexcept {
    switch (status) {
    case WSYNC_OK: return "WSYNC_OK";
    case WSYNC_ERR_INVALID_ARGUMENT: return "WSYNC_ERR_INVALID_ARGUMENT";
    case WSYNC_ERR_UNSUPPORTED: return "WSYNC_ERR_UNSUPPORTED";
    case WSYNC_ERR_UNAVAILABLE: return "WSYNC_ERR_UNAVAILABLE";
    case WSYNC_ERR_MALFORMED: return "WSYNC_ERR_MALFORMED";
    case WSYNC_ERR_MISMATCH: return "WSYNC_ERR_MISMATCH";
    case WSYNC_ERR_TIMEOUT: return "WSYNC_ERR_TIMEOUT";
    case WSYNC_ERR_PEER: return "WSYNC_ERR_PEER";
    case WSYNC_ERR_NO_MEMORY: return "WSYNC_ERR_NO_MEMORY";
    case WSYNC_ERR_WRONG_STATE: return "WSYNC_ERR_WRONG_STATE";
    case WSYNC_ERR_SYSTEM: return "WSYNC_ERR_SYSTEM";
    case WSYNC_ERR_INTERNAL: return "WSYNC_ERR_INTERNAL";
    case WSYNC_ERR_INTEGRITY: return "WSYNC_ERR_INTEGRITY";
    case WSYNC_ERR_ABANDONED: return "WSYNC_ERR_ABANDONED";
    case WSYNC_ERR_SKIPPED: return "WSYNC_ERR_SKIPPED";
    default: return "WSYNC_ERR_UNKNOWN";
    }
}

namespace {
// std::string would allocate in a thread_local destructor path; a fixed buffer cannot fail.
thread_local char t_message[2048] = "";
}  // namespace

void set_last_error(const char *message) noexcept {
    std::size_t n = std::strlen(message);
    if (n >= sizeof t_message) n = sizeof t_message - 1;
    std::memcpy(t_message, message, n);
    t_message[n] = '\0';
}

const char *last_error() noexcept { return t_message; }

}  // namespace wsync
