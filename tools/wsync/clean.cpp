// wsync clean: removes the shared-memory segments a trainer left in /dev/shm.
//
// A trainer stopped by a signal it does not handle before every engine attached leaves its
// segment behind (docs/failure-model.md, "What is left behind"): /dev/shm/wsync-<32 hex>
// ("shm") or /dev/shm/wsync-ipc-<32 hex> ("cuda_ipc"). Nothing in a segment says whether its
// trainer lives, so the rule is the kernel's: a segment that no process has open or mapped is
// used by nobody, and nobody can reach it but by its name, which only trainers and engines of
// the init info that names it know, and only while its trainer lives. A segment is held open
// from the moment it is created (shm_open by the strategy that made the init info) until its
// last user closes it, so there is no window in which a live one looks unused.
//
// Order: the candidates are listed first and the processes scanned after, so a segment made
// meanwhile is not a candidate. Only the caller's own segments are looked at (they are 0600).
// A process of this user whose descriptors cannot be read (not dumpable: setcap or setgid
// programs, prctl(PR_SET_DUMPABLE, 0), some sandboxes) could hold any of them, so then
// nothing is removed (review: such a trainer's live segment was removed as "used by no
// process"); --force removes anyway. Processes of other users cannot open a 0600 segment of
// this user unless they run as root; processes in another PID namespace sharing /dev/shm are
// not in this /proc at all, so run it where trainers and engines are visible (the host's PID
// namespace, or theirs).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "cli.hpp"

namespace wsync_cli {
namespace {

const char *const kShmDir = "/dev/shm";

bool is_segment_name(const std::string &name) {
    static const std::regex re("wsync-(ipc-)?[0-9a-f]{32}");
    return std::regex_match(name, re);
}

// "/dev/shm/NAME" or "/dev/shm/NAME (deleted)" -> NAME when NAME is a segment's.
std::string segment_in(const std::string &path) {
    const std::string prefix = std::string(kShmDir) + "/";
    if (path.compare(0, prefix.size(), prefix) != 0) return std::string();
    std::string name = path.substr(prefix.size());
    const std::string deleted = " (deleted)";
    if (name.size() > deleted.size() &&
        name.compare(name.size() - deleted.size(), deleted.size(), deleted) == 0)
        name.resize(name.size() - deleted.size());
    return is_segment_name(name) ? name : std::string();
}

std::vector<std::string> numeric_entries(const std::string &dir) {
    std::vector<std::string> out;
    DIR *d = opendir(dir.c_str());
    if (!d) return out;
    while (dirent *e = readdir(d)) {
        const char *n = e->d_name;
        if (*n && std::strspn(n, "0123456789") == std::strlen(n)) out.emplace_back(n);
    }
    closedir(d);
    return out;
}

// Every segment some process has open (a descriptor) or mapped, with one such pid; in
// `unseen`, this user's processes whose descriptors could not be read.
std::map<std::string, std::string> segments_in_use(std::vector<std::string> &unseen) {
    std::map<std::string, std::string> used;
    const uid_t self = getuid();
    for (const std::string &pid : numeric_entries("/proc")) {
        const std::string base = "/proc/" + pid;
        struct stat st;
        if (stat(base.c_str(), &st) != 0) continue;  // gone meanwhile
        const bool mine = self == 0 || st.st_uid == self;
        // Every process that uses a segment through libwsync holds a descriptor of it (its
        // liveness lock lives on it), so the descriptors are what must be readable; mappings
        // are looked at where they can be (a container's init may hide them even from root).
        DIR *fds = opendir((base + "/fd").c_str());
        if (!fds) {
            const bool gone = errno == ENOENT || stat(base.c_str(), &st) != 0;
            if (mine && !gone) unseen.push_back(pid);
            continue;
        }
        closedir(fds);
        std::ifstream maps(base + "/maps");
        for (const std::string &fd : numeric_entries(base + "/fd")) {
            char target[4096];
            const ssize_t n = readlink((base + "/fd/" + fd).c_str(), target, sizeof target - 1);
            if (n <= 0) continue;
            target[n] = '\0';
            const std::string name = segment_in(target);
            if (!name.empty()) used.emplace(name, pid);
        }
        std::string line;
        while (std::getline(maps, line)) {
            const std::size_t at = line.find(std::string(kShmDir) + "/");
            if (at == std::string::npos) continue;
            const std::string name = segment_in(line.substr(at));
            if (!name.empty()) used.emplace(name, pid);
        }
    }
    return used;
}

}  // namespace

int cmd_clean(int argc, char **argv) {
    bool dry_run = false, force = false;
    for (int i = 2; i < argc; ++i) {
        if (std::strcmp(argv[i], "--dry-run") == 0) dry_run = true;
        else if (std::strcmp(argv[i], "--force") == 0) force = true;
        else usage_error(std::string("clean: unknown option '") + argv[i] + "' (see: wsync help)");
    }
    // Candidates first, users after (see the top of this file).
    std::vector<std::pair<std::string, long long>> candidates;
    DIR *d = opendir(kShmDir);
    if (!d) die(std::string("clean: cannot list ") + kShmDir + ": " + std::strerror(errno));
    const uid_t self = getuid();
    while (dirent *e = readdir(d)) {
        const std::string name = e->d_name;
        if (!is_segment_name(name)) continue;
        struct stat st;
        if (lstat((std::string(kShmDir) + "/" + name).c_str(), &st) != 0) continue;  // gone
        if (!S_ISREG(st.st_mode) || st.st_uid != self) continue;  // not a segment of this user
        candidates.emplace_back(name, static_cast<long long>(st.st_size));
    }
    closedir(d);
    std::vector<std::string> unseen;
    const std::map<std::string, std::string> used = segments_in_use(unseen);
    std::string blind;  // why nothing unused can be told apart from in use, or empty
    if (!unseen.empty() && !force) {
        blind = "pid " + unseen.front();
        if (unseen.size() > 1) blind += " and " + std::to_string(unseen.size() - 1) + " more";
        blind += " of this user cannot be inspected (not dumpable?) and may use it";
    }
    int removed = 0, kept = 0;
    for (const auto &[name, bytes] : candidates) {
        const auto user = used.find(name);
        if (user != used.end() || !blind.empty()) {
            if (user != used.end())
                std::printf("kept %s: in use (pid %s)\n", name.c_str(), user->second.c_str());
            else
                std::printf("kept %s: %s (--force removes it)\n", name.c_str(), blind.c_str());
            ++kept;
            continue;
        }
        if (dry_run) {
            std::printf("would remove %s (%lld bytes, used by no process)\n", name.c_str(), bytes);
            ++removed;
            continue;
        }
        if (unlink((std::string(kShmDir) + "/" + name).c_str()) != 0) {
            if (errno == ENOENT) continue;  // its trainer or an engine removed it meanwhile
            die("clean: cannot remove " + std::string(kShmDir) + "/" + name + ": " +
                std::strerror(errno));
        }
        std::printf("removed %s (%lld bytes, used by no process)\n", name.c_str(), bytes);
        ++removed;
    }
    std::printf("%d segment(s) %s, %d kept\n", removed, dry_run ? "to remove" : "removed", kept);
    return 0;
}

}  // namespace wsync_cli
