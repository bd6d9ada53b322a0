#include "options.hpp"

#include "error.hpp"
#include "wire.hpp"

namespace wsync {

namespace {
const char *type_name(OptionSpec::Type t) {
    switch (t) {
    case OptionSpec::Type::Bool: return "bool";
    case OptionSpec::Type::UInt: return "uint";
    case OptionSpec::Type::Json: return "json";
    default: return "string";
    }
}

// A given value or key for a message: JSON of at most about 64 bytes, so a hostile option text
// cannot flood the message (the parse depth is bounded, so dump() cannot recurse far).
std::string quote(const json &v) {
    std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
    return s.size() <= 64 ? s : s.substr(0, 64) + "...";
}

std::string quote_key(const std::string &key) { return "'" + wire::printable(key, 64) + "'"; }

bool in_choices(const std::string &v, const char *choices) {
    std::string list(choices);
    std::size_t start = 0;
    for (;;) {
        std::size_t bar = list.find('|', start);
        if (list.compare(start, bar == std::string::npos ? std::string::npos : bar - start, v) == 0)
            return true;
        if (bar == std::string::npos) return false;
        start = bar + 1;
    }
}
}  // namespace

Options::Options(std::string owner, const std::vector<OptionSpec> &specs, const char *text)
    : owner_(std::move(owner)), values_(json::object()) {
    for (const auto &s : specs) {
        if (s.type == OptionSpec::Type::Bool) values_[s.key] = s.default_value != 0;
        else if (s.type == OptionSpec::Type::String) values_[s.key] = s.default_text ? s.default_text : "";
        else if (s.type == OptionSpec::Type::Json || s.unset_by_default) values_[s.key] = nullptr;
        else values_[s.key] = s.default_value;
    }
    if (!text || !*text) return;
    json given;
    wire::TextError err;
    if (!wire::parse_json_text(text, wire::kMaxDepth, given, err)) {
        if (!err.too_deep)
            fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": options are not valid JSON (" + err.what + ")");
        std::string levels = std::to_string(wire::kMaxDepth) + " levels";
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             err.key.empty() ? owner_ + ": options nest deeper than " + levels
                             : owner_ + ": option " + quote_key(err.key) + " nests deeper than " + levels);
    }
    if (!given.is_object())
        fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": options must be a JSON object");
    for (auto it = given.begin(); it != given.end(); ++it) {
        const OptionSpec *spec = nullptr;
        for (const auto &s : specs)
            if (it.key() == s.key) spec = &s;
        if (!spec) {
            std::string known;
            for (const auto &s : specs) known += (known.empty() ? "" : ", ") + std::string(s.key);
            fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": unknown option " + quote_key(it.key()) +
                                                 " (known: " + known + ")");
        }
        const json &v = it.value();
        if (spec->type == OptionSpec::Type::Bool) {
            if (!v.is_boolean())
                fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": option '" + it.key() +
                                                     "' must be true or false, got " + quote(v));
            values_[spec->key] = v.get<bool>();
            continue;
        }
        if (spec->type == OptionSpec::Type::Json) {
            if (!v.is_array() && !v.is_object())
                fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": option '" + it.key() +
                                                     "' must be a JSON array or object, got " + quote(v));
            values_[spec->key] = v;
            continue;
        }
        if (spec->type == OptionSpec::Type::String) {
            if (!v.is_string())
                fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": option '" + it.key() +
                                                     "' must be a string, got " + quote(v));
            const std::string &x = v.get_ref<const std::string &>();
            if (spec->choices ? !in_choices(x, spec->choices)
                              : (x.empty() || x.size() > 4096 || x.find('\0') != std::string::npos))
                fail(WSYNC_ERR_INVALID_ARGUMENT,
                     owner_ + ": option '" + it.key() + "' = " + quote(v) + " is not accepted" +
                         (spec->choices ? std::string(" (one of: '") + spec->choices + "')"
                                        : std::string(" (1..4096 bytes, no NUL)")));
            values_[spec->key] = x;
            continue;
        }
        if (!v.is_number_unsigned())
            fail(WSYNC_ERR_INVALID_ARGUMENT, owner_ + ": option '" + it.key() +
                                                 "' must be a non-negative integer, got " +
                                                 quote(v));
        uint64_t x = v.get<uint64_t>();
        if (x < spec->min || x > spec->max)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 owner_ + ": option '" + it.key() + "' = " + std::to_string(x) +
                     " is out of range [" + std::to_string(spec->min) + ", " +
                     std::to_string(spec->max) + "]");
        values_[spec->key] = x;
    }
}

bool Options::given(const char *key) const {
    auto it = values_.find(key);
    return it != values_.end() && !it->is_null();
}

uint64_t Options::uint(const char *key) const {
    auto it = values_.find(key);
    if (it == values_.end() || !it->is_number_unsigned())
        fail(WSYNC_ERR_INTERNAL, owner_ + ": option '" + key + "' is not a declared uint");
    return it->get<uint64_t>();
}

bool Options::boolean(const char *key) const {
    auto it = values_.find(key);
    if (it == values_.end() || !it->is_boolean())
        fail(WSYNC_ERR_INTERNAL, owner_ + ": option '" + key + "' is not a declared bool");
    return it->get<bool>();
}

const std::string &Options::text(const char *key) const {
    auto it = values_.find(key);
    if (it == values_.end() || !it->is_string())
        fail(WSYNC_ERR_INTERNAL, owner_ + ": option '" + key + "' is not a declared string");
    return it->get_ref<const std::string &>();
}

const json &Options::value(const char *key) const {
    auto it = values_.find(key);
    if (it == values_.end())
        fail(WSYNC_ERR_INTERNAL, owner_ + ": option '" + key + "' is not declared");
    return *it;
}

std::vector<OptionSpec> experimental(std::vector<OptionSpec> specs) {
    for (OptionSpec &s : specs) s.experimental = true;
    return specs;
}

namespace option {

OptionSpec receivers(uint64_t max, const char *doc) {
    return {"receivers", OptionSpec::Type::UInt, 1, 1, max, "sender", doc};
}

OptionSpec timeout_ms(uint64_t min, const char *side, const char *doc) {
    return {"timeout_ms", OptionSpec::Type::UInt, 60000, min, uint64_t(1) << 40, side, doc};
}

OptionSpec device(const char *side, const char *doc) {
    return {"device", OptionSpec::Type::UInt, 0, 0, 4095, side, doc};
}

OptionSpec synchronize(const char *doc) {
    return {"synchronize", OptionSpec::Type::Bool, 1, 0, 1, "both", doc};
}

OptionSpec checksum() {
    return {"checksum", OptionSpec::Type::Bool, 1, 0, 1, "sender",
            "carry a checksum of every tensor (shm, ucx: its tree hash, verified by the engines' "
            "copy threads)"};
}

OptionSpec verify() {
    return {"verify", OptionSpec::Type::Bool, 1, 0, 1, "receiver",
            "verify carried checksums before yielding each tensor"};
}

OptionSpec copy_threads() {
    return {"copy_threads", OptionSpec::Type::UInt, 0, 0, 64, "both",
            "threads one copy of 8 MiB or more is split between, the caller's included (made "
            "once, on first use): the trainer's packing and checksumming of a large tensor, an "
            "engine's wsync_recv_copy and its checksum verification; 0: one per CPU this "
            "process may use, at most 8"};
}

}  // namespace option

json describe_options(const std::vector<OptionSpec> &specs) {
    json out = json::object();
    for (const auto &s : specs) {
        json d = {{"type", type_name(s.type)}, {"side", s.side}, {"doc", s.doc},
                  {"stability", s.experimental ? "experimental" : "stable"}};
        if (s.type == OptionSpec::Type::Bool) {
            d["default"] = s.default_value != 0;
        } else if (s.type == OptionSpec::Type::String) {
            d["default"] = s.default_text ? s.default_text : "";
            if (s.choices) d["choices"] = s.choices;
        } else if (s.type == OptionSpec::Type::Json) {
            d["default"] = nullptr;
        } else {
            d["default"] = s.unset_by_default ? json(nullptr) : json(s.default_value);
            d["min"] = s.min;
            d["max"] = s.max;
        }
        out[s.key] = std::move(d);
    }
    return out;
}

}  // namespace wsync
