// wsync_request_merge (several senders' partial requests for one chunk) and
// wsync_blob_describe: the request-level operations that need no sender or receiver.
#include "core.hpp"
#include "error.hpp"

namespace wsync {

namespace {
constexpr const char *kReq = "request";
}  // namespace

std::vector<uint8_t> merge_requests(
    const std::vector<std::pair<const uint8_t *, std::size_t>> &parts) {
    if (parts.empty()) fail(WSYNC_ERR_INVALID_ARGUMENT, "merge: no parts (n is 0)");
    std::vector<wire::Envelope> envs;
    envs.reserve(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
        try {
            envs.push_back(wire::decode(parts[i].first, parts[i].second));
        } catch (const Error &e) {
            fail(e.status(), "merge: part " + std::to_string(i) + ": " + e.what());
        }
        if (envs.back().type != wire::BlobType::Request)
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) + " is not a request");
        if (envs.back().kind != envs.front().kind)
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) + " is for strategy '" +
                                         envs.back().kind + "', part 0 for '" +
                                         envs.front().kind + "'");
    }
    const KindInfo &kind = find_kind(envs.front().kind);
    if (!kind.merge_transports) {
        if (parts.size() != 1)
            fail(WSYNC_ERR_UNSUPPORTED, std::string("merge: strategy '") + kind.name +
                                            "' has a single sender; got " +
                                            std::to_string(parts.size()) + " parts");
        return std::vector<uint8_t>(parts[0].first, parts[0].first + parts[0].second);
    }
    ChunkHeader h0 = decode_header(envs[0].body);
    std::vector<const json *> transports;
    for (std::size_t i = 0; i < envs.size(); ++i) {
        ChunkHeader h = decode_header(envs[i].body);
        if (h.version != h0.version || h.chunk_index != h0.chunk_index || h.last != h0.last)
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) + " is " +
                                         chunk_label(h) + ", part 0 is " + chunk_label(h0));
        if (envs[i].body.at("tensors") != envs[0].body.at("tensors"))
            fail(WSYNC_ERR_MISMATCH, "merge: part " + std::to_string(i) +
                                         " describes other tensors than part 0");
        transports.push_back(&wire::object_field(envs[i].body, "transport", kReq));
    }
    json body = envs[0].body;
    body["transport"] = kind.merge_transports(transports);
    return wire::encode(wire::BlobType::Request, kind.name, std::move(body));
}

namespace {

// Secrets an init info carries (ucx's "key", nccl_broadcast's control "key": whoever holds one
// may attach as an engine, docs/failure-model.md) are shown by their length only, so a
// description pasted into a log or an issue gives nothing away. Any byte string under a member
// named "key", at any depth, is such a secret.
void redact_secrets(json &j) {
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (it.key() == "key" && it.value().is_binary())
                it.value() = "(secret, " + std::to_string(it.value().get_binary().size()) + " bytes, not shown)";
            else
                redact_secrets(it.value());
        }
    } else if (j.is_array()) {
        for (json &e : j) redact_secrets(e);
    }
}

}  // namespace

std::string describe_blob(const uint8_t *data, std::size_t size) {
    wire::Envelope env = wire::decode(data, size);
    redact_secrets(env.body);
    json out = {{"magic", "wsync"},
                {"format", wire::kFormatVersion},
                {"type", wire::blob_type_name(env.type)},
                {"kind", env.kind},
                {"body", std::move(env.body)}};
    // Strings inside a hostile blob need not be UTF-8: replace rather than throw.
    return out.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace wsync
