// Errors inside libwsync: every failure is a wsync::Error carrying a status and a message that
// names the cause. The ABI layer (abi.cpp) turns it into a status plus the per-thread message.
#pragma once

#include <stdexcept>
#include <string>

#include "wsync.h"

namespace wsync {

class Error : public std::runtime_error {
public:
    Error(wsync_status_t status, std::string message)
        : std::runtime_error(std::move(message)), status_(status) {}
    wsync_status_t status() const noexcept { return status_; }

private:
    wsync_status_t status_;
};

// Throws Error(status, message). Kept out of line so call sites stay small.
[[noreturn]] void fail(wsync_status_t status, const std::string &message);

// Throws WSYNC_ERR_SYSTEM with "<what>: <strerror(errno)> (errno N)".
[[noreturn]] void fail_errno(const std::string &what, int err);

// Static name of a status ("WSYNC_ERR_TIMEOUT").
const char *status_name(wsync_status_t status) noexcept;

// The per-thread message slot read by wsync_last_error().
void set_last_error(const char *message) noexcept;
const char *last_error() noexcept;

}  // namespace wsync
