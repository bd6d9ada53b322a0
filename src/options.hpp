// One strictly validated options mechanism for every strategy and the planner: a JSON object
// checked against a table of OptionSpec. Unknown keys, wrong types and out-of-range values fail
// with WSYNC_ERR_INVALID_ARGUMENT naming the key, and so does nesting deeper than
// wire::kMaxDepth, refused while parsing; what a message quotes of the text is cut short.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace wsync {

using json = nlohmann::json;

struct OptionSpec {
    // Json: any JSON array or object (default null), validated by the kind that reads it.
    enum class Type { Bool, UInt, String, Json };
    const char *key;
    Type type;
    uint64_t default_value;  // Bool: 0 or 1
    uint64_t min;
    uint64_t max;
    const char *side;  // "sender", "receiver", "both", "planner"
    const char *doc;
    // String options: the default, and the accepted values separated by '|' ("" is one of them
    // when the list starts with '|'); nullptr accepts any text of 1..4096 bytes without NUL.
    const char *default_text = nullptr;
    const char *choices = nullptr;
    // Experimental options may change or go in any minor version (docs/abi-policy.md);
    // wsync_strategy_describe_options says "stability": "experimental".
    bool experimental = false;
    // UInt options only: no default; the value is null until given (Options::given()).
    bool unset_by_default = false;
};

// The specs, each marked experimental.
std::vector<OptionSpec> experimental(std::vector<OptionSpec> specs);

class Options {
public:
    Options(std::string owner, const std::vector<OptionSpec> &specs, const char *text);
    uint64_t uint(const char *key) const;
    bool boolean(const char *key) const;
    const std::string &text(const char *key) const;
    // A Json option's value: null when not given.
    const json &value(const char *key) const;
    const json &values() const { return values_; }
    // Whether an option declared unset_by_default was given.
    bool given(const char *key) const;

private:
    std::string owner_;
    json values_;  // every key of the specs, filled with defaults
};

// The options several kinds share, one definition each (each kind words its own doc, because
// what a key covers differs: whose deadline, which stream). Ranges and defaults live here.
namespace option {
OptionSpec receivers(uint64_t max, const char *doc);                 // 1..max, default 1
OptionSpec timeout_ms(uint64_t min, const char *side, const char *doc);  // default 60000
OptionSpec device(const char *side, const char *doc);               // GPU ordinal 0..4095
OptionSpec synchronize(const char *doc);                            // bool, default true
OptionSpec checksum();      // sender: carry XXH3-64 per tensor (host kinds)
OptionSpec verify();        // receiver: verify carried checksums
OptionSpec copy_threads();  // receiver: wsync_recv_copy's threads
}  // namespace option

// {"key": {"type", "default", "min", "max", "side", "doc"}} for wsync_strategy_describe_options.
json describe_options(const std::vector<OptionSpec> &specs);

}  // namespace wsync
