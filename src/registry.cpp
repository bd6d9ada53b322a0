#include "delta/delta.hpp"
#include "error.hpp"
#include "strategy.hpp"

namespace wsync {

const std::vector<const KindInfo *> &registered_kinds() {
    static const std::vector<const KindInfo *> kinds = {&kShmKind, &kCudaIpcKind, &kNcclBroadcastKind
#ifdef WSYNC_HAVE_UCX
                                                        , &kUcxKind
#endif
    };
    return kinds;
}

const std::vector<OptionSpec> &option_specs(const KindInfo &kind) {
    return delta::with_delta_options(kind.options);
}

const KindInfo &find_kind(const std::string &name) {
    std::string known;
    for (const KindInfo *k : registered_kinds()) {
        if (name == k->name) return *k;
        known += (known.empty() ? "" : ", ") + std::string(k->name);
    }
    fail(WSYNC_ERR_UNSUPPORTED, "unknown strategy kind '" + name + "' (known: " + known + ")");
}

}  // namespace wsync
