// Errors inside libwsync: every failure is a wsync::Error carrying a status and a message that
// names the cause. The ABI layer (abi.cpp) turns it into a status plus the per-thread message.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "wsync.h"

namespace wsync {

// One receiver's failure as a sender learnt it (wsync_failure_t without the ABI framing).
struct Failure {
    uint32_t what = 0;               // WSYNC_FAILURE_*
    wsync_status_t status = WSYNC_OK;
    uint32_t receiver = 0;
    uint64_t version = 0;
    uint32_t chunk_index = WSYNC_NO_CHUNK;
    int32_t pid = 0;
    std::string message;
};

class Error : public std::runtime_error {
public:
    Error(wsync_status_t status, std::string message, std::vector<Failure> failures = {})
        : std::runtime_error(std::move(message)), status_(status), failures_(std::move(failures)) {}
    wsync_status_t status() const noexcept { return status_; }
    // Receivers' failures behind a sender's error, as data (empty for other errors).
    const std::vector<Failure> &failures() const noexcept { return failures_; }

private:
    wsync_status_t status_;
    std::vector<Failure> failures_;
};

// Throws Error(status, message). Kept out of line so call sites stay small.
[[noreturn]] void fail(wsync_status_t status, const std::string &message);

// printf-style, for protocol code whose messages name several numbers: the same as
// fail(status, strf(format, ...)). Use PRIu64 for uint64_t. Checked by the compiler.
[[noreturn]] void failf(wsync_status_t status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));
// The formatted text (any length).
std::string strf(const char *format, ...) __attribute__((format(printf, 1, 2)));

// Throws WSYNC_ERR_SYSTEM with "<what>: <strerror(errno)> (errno N)".
[[noreturn]] void fail_errno(const std::string &what, int err);

// Static name of a status ("WSYNC_ERR_TIMEOUT").
const char *status_name(wsync_status_t status) noexcept;

// The per-thread message slot read by wsync_last_error().
void set_last_error(const char *message) noexcept;
const char *last_error() noexcept;

}  // namespace wsync
