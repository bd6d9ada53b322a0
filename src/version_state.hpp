// A receiver's version transaction (issue 36 item 3): which version's chunks arrive now and
// where it stands here, as one explicit state instead of flags. Receiver (core.cpp) decides
// *when* a transition happens from the requests and the board; this class owns *what* each
// transition changes, so no path can make a completed version failed or serve a mix.
//
//   phase       version()   meaning
//   kNone       0           no version begun since this receiver was made
//   kOpen       v           v's chunks arrive in order; expect() is the next chunk index
//   kFailed     v           v failed here (status(), why()); its later chunks are skipped
//   kCompleted  v           v committed here with a matching manifest (completed() == v)
//
//   from                 event                       to            also
//   any                  begin(w), w > version()     kOpen(w)      tally and reason cleared
//   kOpen(v)             fail(s)                     kFailed(v)    failed_version = v, status s
//   kOpen(v)             complete()                  kCompleted(v) completed = v
//   kNone/kFailed/kCompleted  fail(s)                unchanged     (a completed version stays so)
//   any                  skipped(w, s)               unchanged     failed_version = max(.., w)
//
// docs/architecture.md has the same table with the requests that trigger each event.
#pragma once

#include <cstdint>
#include <string>

#include "strategy.hpp"
#include "wsync.h"

namespace wsync {

class VersionState {
public:
    enum class Phase : uint8_t { kNone, kOpen, kFailed, kCompleted };

    Phase phase() const { return phase_; }
    uint64_t version() const { return version_; }  // 0 while kNone
    bool open() const { return phase_ == Phase::kOpen; }
    bool failed() const { return phase_ == Phase::kFailed; }
    wsync_status_t status() const { return status_; }  // kFailed: why it failed
    const std::string &why() const { return why_; }

    // The next chunk index of version() expected in order (UINT32_MAX once completed: every
    // later chunk of it is a replay).
    uint32_t expect() const { return expect_; }
    void expect_after(uint32_t chunk_index) { expect_ = chunk_index + 1; }
    Manifest &tally() { return tally_; }  // of version()'s chunks ended successfully
    const Manifest &tally() const { return tally_; }

    uint64_t completed() const { return completed_; }
    uint64_t failed_version() const { return failed_version_; }
    wsync_status_t failed_status() const { return failed_version_ ? failed_status_ : WSYNC_OK; }
    // The version a poll reports open: version() in kOpen, else 0.
    uint64_t open_version() const { return open() ? version_ : 0; }

    void begin(uint64_t version) {
        version_ = version;
        phase_ = Phase::kOpen;
        status_ = WSYNC_OK;
        why_.clear();
        tally_ = Manifest{};
    }
    // kOpen -> kFailed with `status`; true if it changed. Nothing else fails.
    bool fail(wsync_status_t status) {
        if (phase_ != Phase::kOpen) return false;
        phase_ = Phase::kFailed;
        status_ = status;
        failed_version_ = version_;
        failed_status_ = status;
        return true;
    }
    // The reason given for the failure: `explain` keeps the first one, `set_why` replaces it.
    void explain(const std::string &why) {
        if (why_.empty()) why_ = why;
    }
    void set_why(std::string why) { why_ = std::move(why); }
    // kOpen -> kCompleted (the caller checked the manifest).
    void complete() {
        if (phase_ != Phase::kOpen) return;
        phase_ = Phase::kCompleted;
        completed_ = version_;
        expect_ = UINT32_MAX;
    }
    // Versions up to `newest` that never began here failed as `status` (skipped whole).
    void skipped(uint64_t newest, wsync_status_t status) {
        if (newest > failed_version_) {
            failed_version_ = newest;
            failed_status_ = status;
        }
    }

private:
    Phase phase_ = Phase::kNone;
    uint64_t version_ = 0;
    wsync_status_t status_ = WSYNC_OK;
    std::string why_;
    uint32_t expect_ = 0;
    Manifest tally_;
    uint64_t completed_ = 0;
    uint64_t failed_version_ = 0;
    wsync_status_t failed_status_ = WSYNC_OK;
};

}  // namespace wsync
