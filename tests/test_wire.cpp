// The wire format, specified: what a blob looks like, that it round-trips, and that every kind of
// hostile or foreign blob is refused with a named error before anything is touched — after which
// the receiver still works. Blobs are crafted with nlohmann::json (the same codec the library
// uses), so each case states its mutation in one line.
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#define XXH_INLINE_ALL
#include <xxhash.h>

extern "C" {
#include "testutil.h"
}

using json = nlohmann::json;
using bytes = std::vector<uint8_t>;

namespace {

struct Live {
    wsync_strategy_t *strategy = nullptr;
    wsync_blob_t init{};
    wsync_sender_t *sender = nullptr;
    wsync_strategy_t *rstrategy = nullptr;
    wsync_receiver_t *receiver = nullptr;
    bytes request;  // a valid request for chunk 0 of version 1
    float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t shape[2] = {2, 4};

    Live() {
        OK(wsync_strategy_create("shm", "{\"bucket_bytes\": 8192}", &strategy));
        OK(wsync_strategy_create_init_info(strategy, &init));
        OK(wsync_sender_create(strategy, init.data, init.size, &sender));
        OK(wsync_strategy_create("shm", nullptr, &rstrategy));
        OK(wsync_receiver_create(rstrategy, init.data, init.size, 0, &receiver));
        wsync_tensor_t t = tu_tensor("layer.weight", data, shape, 2, WSYNC_DTYPE_FLOAT, 32);
        wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(sender, &c, &req));
        request.assign(req.data, req.data + req.size);
        wsync_blob_free(&req);
    }
    ~Live() {
        wsync_receiver_destroy(receiver);
        wsync_strategy_destroy(rstrategy);
        wsync_sender_destroy(sender);
        wsync_strategy_destroy(strategy);
        wsync_blob_free(&init);
    }
    bytes init_bytes() const { return bytes(init.data, init.data + init.size); }

    // Receives `req` and, if accepted, drains and ends it; returns the receive status.
    wsync_status_t receive(const bytes &req) {
        wsync_recv_t *it = nullptr;
        wsync_status_t st = wsync_receiver_receive(receiver, req.data(), req.size(), &it);
        if (st != WSYNC_OK) {
            assert_null(it);
            return st;
        }
        wsync_tensor_t v;
        bool has = true;
        while (has) OK(wsync_recv_next(it, &v, &has));
        OK(wsync_recv_end(it));
        return st;
    }
};

json decode(const bytes &b) { return json::from_cbor(b); }

// Appends the format-2 seal (CBOR uint64 of the XXH3-64 of every byte before it).
bytes seal_raw(bytes b) {
    uint64_t h = XXH3_64bits(b.data(), b.size());
    b.push_back(0x1b);
    for (int i = 7; i >= 0; --i) b.push_back(static_cast<uint8_t>(h >> (8 * i)));
    return b;
}
// Re-encodes a decoded blob (an array whose last element is its old seal) with a fresh seal, as
// a sender producing hostile content would: the seal then holds, and the content is judged.
bytes encode(const json &j) {
    if (!j.is_array() || j.empty()) return json::to_cbor(j);
    json prefix = j;
    prefix.erase(prefix.size() - 1);
    bytes b = json::to_cbor(prefix);
    if (prefix.size() + 1 < 24) b[0] = static_cast<uint8_t>(0x80 | (prefix.size() + 1));
    return seal_raw(b);
}

struct Case {
    const char *what;
    std::function<void(json &)> mutate;
    wsync_status_t status;
    const char *needle;
};

void expect_receive(Live &live, const bytes &blob, wsync_status_t status, const char *needle,
                    const char *what) {
    wsync_status_t st = live.receive(blob);
    if (st != status)
        fail_msg("%s: got %s, want %s (%s)", what, wsync_status_string(st),
                 wsync_status_string(status), wsync_last_error());
    if (!strstr(wsync_last_error(), needle))
        fail_msg("%s: message \"%s\" lacks \"%s\"", what, wsync_last_error(), needle);
}

}  // namespace

static void blobs_are_a_cbor_array_with_magic_version_type_and_kind(void **state) {
    (void)state;
    Live live;
    json init = decode(live.init_bytes());
    assert_true(init.is_array());
    assert_int_equal(init.size(), 6);
    assert_true(init[0] == "wsync");
    assert_true(init[1] == 5);
    assert_true(init[5].is_number_unsigned());  // the seal
    assert_true(init[2] == "init");
    assert_true(init[3] == "shm");
    const uint8_t magic[] = {0x86, 0x65, 'w', 's', 'y', 'n', 'c'};
    assert_memory_equal(live.init.data, magic, sizeof magic);
    json req = decode(live.request);
    assert_true(req[2] == "request");
    const json &body = req[4];
    assert_true(body["version"] == 1 && body["chunk"] == 0 && body["last"] == true);
    assert_true(body["tensors"]["names"] == json::array({"layer.weight"}));
    assert_true(body["tensors"]["dtypes"] == json::array({2, 32, 1}));
    assert_true(body["tensors"]["shapes"] == json::array({2, 4}));
    assert_true(body["transport"].contains("segment"));
}

static void blobs_round_trip_through_the_codec_and_describe(void **state) {
    (void)state;
    Live live;
    assert_true(encode(decode(live.request)) == live.request);  // canonical encoding
    char *text;
    OK(wsync_blob_describe(live.request.data(), live.request.size(), &text));
    json described = json::parse(text);
    wsync_string_free(text);
    assert_true(described["body"] == decode(live.request)[4]);
    assert_true(described["kind"] == "shm" && described["type"] == "request");
    assert_int_equal(live.receive(encode(decode(live.request))), WSYNC_OK);
}

static void hostile_requests_are_refused_by_name_and_the_receiver_still_works(void **state) {
    (void)state;
    Live live;
    const Case cases[] = {
        {"version 0", [](json &r) { r[4]["version"] = 0; }, WSYNC_ERR_MALFORMED, "request.version is 0"},
        {"version negative", [](json &r) { r[4]["version"] = -1; }, WSYNC_ERR_MALFORMED, "request.version is not an unsigned"},
        {"chunk missing", [](json &r) { r[4].erase("chunk"); }, WSYNC_ERR_MALFORMED, "missing field 'chunk'"},
        {"last not bool", [](json &r) { r[4]["last"] = 1; }, WSYNC_ERR_MALFORMED, "request.last is not a boolean"},
        {"tensors missing", [](json &r) { r[4].erase("tensors"); }, WSYNC_ERR_MALFORMED, "missing field 'tensors'"},
        {"transport not map", [](json &r) { r[4]["transport"] = json::array(); }, WSYNC_ERR_MALFORMED, "request.transport is not a map"},
        {"names empty", [](json &r) { r[4]["tensors"]["names"] = json::array(); }, WSYNC_ERR_MALFORMED, "more than 0"},
        {"name not string", [](json &r) { r[4]["tensors"]["names"][0] = 7; }, WSYNC_ERR_MALFORMED, "name of tensor 0 is not a string"},
        {"name has NUL", [](json &r) { r[4]["tensors"]["names"][0] = std::string("a\0b", 3); }, WSYNC_ERR_MALFORMED, "contains NUL"},
        {"name too long", [](json &r) { r[4]["tensors"]["names"][0] = std::string(2000, 'x'); }, WSYNC_ERR_MALFORMED, "too long"},
        {"columns disagree", [](json &r) { r[4]["tensors"]["offsets"].push_back(0); }, WSYNC_ERR_MALFORMED, "offsets has 2 entries, more than 1"},
        {"dtype opaque", [](json &r) { r[4]["tensors"]["dtypes"][0] = 3; }, WSYNC_ERR_MALFORMED, "unsupported: dtype(code=3"},
        {"dtype bits", [](json &r) { r[4]["tensors"]["dtypes"][1] = 12; }, WSYNC_ERR_MALFORMED, "dtype of tensor 0 is unsupported"},
        {"dtype over u8", [](json &r) { r[4]["tensors"]["dtypes"][0] = 300; }, WSYNC_ERR_MALFORMED, "exceeds 255"},
        {"ndim 17", [](json &r) { r[4]["tensors"]["ndims"][0] = 17; }, WSYNC_ERR_MALFORMED, "ndim of tensor 0 = 17 exceeds 16"},
        {"zero extent", [](json &r) { r[4]["tensors"]["shapes"][0] = 0; }, WSYNC_ERR_MALFORMED, "zero extent"},
        {"shape overflow", [](json &r) { r[4]["tensors"]["shapes"] = json::array({uint64_t(1) << 40, uint64_t(1) << 40}); }, WSYNC_ERR_MALFORMED, "overflows"},
        {"extent over int64", [](json &r) { r[4]["tensors"]["shapes"][0] = UINT64_MAX; }, WSYNC_ERR_MALFORMED, "exceeds"},
        {"shapes short", [](json &r) { r[4]["tensors"]["shapes"] = json::array({2}); }, WSYNC_ERR_MALFORMED, "'shapes' is too short"},
        {"shapes long", [](json &r) { r[4]["tensors"]["shapes"].push_back(3); }, WSYNC_ERR_MALFORMED, "ndims add up to 2"},
        {"tree length", [](json &r) { r[4]["tensors"]["tree"].push_back(1); }, WSYNC_ERR_MALFORMED, "tree has 2 entries, more than 1"},
        {"xxh3 length", [](json &r) {
             auto &t = r[4]["tensors"];
             t["xxh3"] = t["tree"]; t.erase("tree"); t["xxh3"].push_back(1);
         }, WSYNC_ERR_MALFORMED, "xxh3 has 2 entries, more than 1"},
        {"both checksum kinds", [](json &r) { auto &t = r[4]["tensors"]; t["xxh3"] = t["tree"]; }, WSYNC_ERR_MALFORMED, "both 'xxh3' and 'tree' checksums"},
        {"duplicate names", [](json &r) {
             auto &t = r[4]["tensors"];
             t["names"].push_back(t["names"][0]);
             for (int i = 0; i < 3; ++i) t["dtypes"].push_back(t["dtypes"][i]);
             t["ndims"].push_back(2); t["shapes"].push_back(2); t["shapes"].push_back(4);
             t["offsets"].push_back(256); t["tree"].push_back(t["tree"][0]);
         }, WSYNC_ERR_MALFORMED, "duplicate tensor name 'layer.weight'"},
        {"offset past bucket", [](json &r) { r[4]["tensors"]["offsets"][0] = 8192; }, WSYNC_ERR_MALFORMED, "outside the 8192-byte bucket"},
        {"offset wraps", [](json &r) { r[4]["tensors"]["offsets"][0] = UINT64_MAX - 255; }, WSYNC_ERR_MALFORMED, "outside"},
        {"offset misaligned", [](json &r) { r[4]["tensors"]["offsets"][0] = 8; }, WSYNC_ERR_MALFORMED, "misaligned"},
        {"tensor bigger than bucket", [](json &r) { r[4]["tensors"]["shapes"] = json::array({2048, 4}); }, WSYNC_ERR_MALFORMED, "outside"},
        {"bucket out of range", [](json &r) { r[4]["transport"]["bucket"] = 2; }, WSYNC_ERR_MALFORMED, "request.bucket = 2 exceeds 1"},
        {"seq zero", [](json &r) { r[4]["transport"]["seq"] = 0; }, WSYNC_ERR_MALFORMED, "seq 0 does not belong"},
        {"seq in wrong bucket", [](json &r) { r[4]["transport"]["seq"] = 2; }, WSYNC_ERR_MALFORMED, "seq 2 does not belong in bucket 0"},
        {"future seq", [](json &r) { r[4]["transport"]["seq"] = 3; }, WSYNC_ERR_MISMATCH, "stale or replayed"},
        {"other segment", [](json &r) { r[4]["transport"]["segment"] = "/wsync-0000"; }, WSYNC_ERR_MISMATCH, "request is for segment '/wsync-0000'"},
        {"other kind", [](json &r) { r[3] = "nccl_broadcast"; }, WSYNC_ERR_MISMATCH, "blob is for strategy 'nccl_broadcast', not 'shm'"},
        {"init type", [](json &r) { r[2] = "init"; }, WSYNC_ERR_MISMATCH, "expected a request blob"},
        {"unknown type", [](json &r) { r[2] = "reply"; }, WSYNC_ERR_MALFORMED, "unknown blob type"},
        {"format 6", [](json &r) { r[1] = 6; }, WSYNC_ERR_MALFORMED, "format version 6 is not supported (this library reads version 5"},
        {"format 4 (0.5 before tree hashes)", [](json &r) { r[1] = 4; }, WSYNC_ERR_MALFORMED, "format version 4 is not supported (this library reads version 5; trainer and engines run libwsync 0.5 builds of different request formats: format 5 (0.5 builds from 2026-11-27) carries tree-hash tensor checksums"},
        {"format 3 (0.4)", [](json &r) { r[1] = 3; }, WSYNC_ERR_MALFORMED, "format version 3 is not supported (this library reads version 5; trainer and engines run different libwsync minor versions: format 4 (libwsync 0.5) added split tensors' parts)"},
        {"format 2 (0.3)", [](json &r) { r[1] = 2; }, WSYNC_ERR_MALFORMED, "format version 2 is not supported (this library reads version 5; trainer and engines run different libwsync minor versions: format 3 (libwsync 0.4) added delta patches)"},
        {"patches not a map", [](json &r) { r[4]["tensors"]["patches"] = 1; }, WSYNC_ERR_MALFORMED, "patches"},
        {"patch of a missing tensor", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {5}}, {"bytes", {40}}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}}; }, WSYNC_ERR_MALFORMED, "patches entry 0 tensor"},
        {"patch columns disagree", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", json::array()}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}}; }, WSYNC_ERR_MALFORMED, "'bytes' disagrees with 'tensor' on the entry count"},
        {"patch of zero bytes", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", {0}}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}}; }, WSYNC_ERR_MALFORMED, "at least its header"},
        {"patch base 0", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", {40}}, {"base", {0}}, {"base_xxh3", {0}}, {"xxh3", {0}}}; }, WSYNC_ERR_MALFORMED, "base version 0"},
        {"patch checksum kind unknown", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", {40}}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}, {"sums", {2}}}; }, WSYNC_ERR_MALFORMED, "patches entry 0 sums (0: XXH3-64, 1: tree hash)"},
        {"patch checksum kinds short", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", {40}}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}, {"sums", json::array()}}; }, WSYNC_ERR_MALFORMED, "\"sums\" has 0 entries for 1 patches"},
        {"patch checksum kinds not a list", [](json &r) { r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", {40}}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}, {"sums", 1}}; }, WSYNC_ERR_MALFORMED, "sums"},
        {"part not whole elements", [](json &r) { r[4]["tensors"]["parts"] = {{"tensor", {0}}, {"offset", {0}}, {"bytes", {3}}}; }, WSYNC_ERR_MALFORMED, "not whole elements"},
        {"part past the tensor", [](json &r) { r[4]["tensors"]["parts"] = {{"tensor", {0}}, {"offset", {4000}}, {"bytes", {4}}}; }, WSYNC_ERR_MALFORMED, "parts entry 0 offset"},
        {"part columns disagree", [](json &r) { r[4]["tensors"]["parts"] = {{"tensor", {0}}, {"offset", json::array()}, {"bytes", {4}}}; }, WSYNC_ERR_MALFORMED, "'offset' disagrees with 'tensor'"},
        {"part and patch", [](json &r) {
             r[4]["tensors"]["parts"] = {{"tensor", {0}}, {"offset", {0}}, {"bytes", {4}}};
             r[4]["tensors"]["patches"] = {{"tensor", {0}}, {"bytes", {40}}, {"base", {1}}, {"base_xxh3", {0}}, {"xxh3", {0}}};
         }, WSYNC_ERR_MALFORMED, "both a part and a patch"},
        {"wrong magic", [](json &r) { r[0] = "wsynk"; }, WSYNC_ERR_MALFORMED, "magic"},
        {"body not map", [](json &r) { r[4] = 5; }, WSYNC_ERR_MALFORMED, "body is not a map"},
        {"seven elements", [](json &r) { r.push_back(0); }, WSYNC_ERR_MALFORMED, "not a sealed wsync blob"},
    };
    for (const Case &c : cases) {
        json r = decode(live.request);
        c.mutate(r);
        expect_receive(live, encode(r), c.status, c.needle, c.what);
    }
    // Nothing above consumed or damaged anything: the genuine request is still accepted.
    assert_int_equal(live.receive(live.request), WSYNC_OK);
}

// The table says which checksum it carries: "tree" (what shm and ucx senders write: the tree
// hash, which engines verify on several threads) or "xxh3" (one XXH3-64 stream, as senders of
// format 4 wrote). A receiver verifies by the kind the table names: a value of the other kind,
// either way round, fails the tensor with INTEGRITY, so a table is never read under the wrong
// rule. (Tensors of many pieces: test_shm, a_byte_changed_anywhere_in_a_large_tensor_...)
static void the_table_names_its_checksum_kind_and_is_verified_by_it(void **state) {
    (void)state;
    Live live;
    json r = decode(live.request);
    auto &t = r[4]["tensors"];
    assert_true(t.contains("tree"));
    assert_false(t.contains("xxh3"));
    const uint64_t piece = XXH3_64bits(live.data, sizeof live.data);  // one piece
    const uint64_t tree = XXH3_64bits(&piece, 8);                    // x86: little-endian already
    assert_true(t["tree"][0].get<uint64_t>() == tree);
    OK(live.receive(encode(r)));

    // The next versions of the same tensor, their tables rewritten as a sender could write them.
    auto next_request = [&] {
        wsync_tensor_t tensor = tu_tensor("layer.weight", live.data, live.shape, 2, WSYNC_DTYPE_FLOAT, 32);
        wsync_chunk_t c = tu_chunk(&tensor, 1, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        // After a version the engine failed, the trainer's next send hears of it (PEER) and
        // abandons that version; the send after it begins the next one.
        wsync_status_t st = wsync_sender_send_chunk(live.sender, &c, &req);
        if (st == WSYNC_ERR_PEER) st = wsync_sender_send_chunk(live.sender, &c, &req);
        OK(st);
        json j = decode(bytes(req.data, req.data + req.size));
        wsync_blob_free(&req);
        j[4]["tensors"].erase("tree");
        return j;
    };
    json as_xxh3 = next_request();  // the same tensor under the one-stream rule
    as_xxh3[4]["tensors"]["xxh3"] = json::array({XXH3_64bits(live.data, sizeof live.data)});
    OK(live.receive(encode(as_xxh3)));

    auto refused = [&](const json &request) {
        bytes blob = encode(request);
        wsync_recv_t *it = nullptr;
        OK(wsync_receiver_receive(live.receiver, blob.data(), blob.size(), &it));
        wsync_tensor_t v;
        bool has = false;
        assert_int_equal(wsync_recv_next(it, &v, &has), WSYNC_ERR_INTEGRITY);
        assert_non_null(strstr(wsync_last_error(), "layer.weight"));
        assert_non_null(strstr(wsync_last_error(), "checksum mismatch"));
        wsync_recv_end(it);
    };
    json mislabelled = next_request();  // a tree hash labelled as XXH3-64
    mislabelled[4]["tensors"]["xxh3"] = json::array({tree});
    refused(mislabelled);
    json as_tree = next_request();  // an XXH3-64 labelled as a tree hash
    as_tree[4]["tensors"]["tree"] = json::array({XXH3_64bits(live.data, sizeof live.data)});
    refused(as_tree);
}

// A well-formed, sealed request whose parts do not follow each other from byte 0, or whose
// committing chunk leaves a split tensor incomplete, is refused before any byte is read; the
// version does not complete and the trainer's flush hears why.
static void receiver_refuses_parts_out_of_order_or_incomplete_at_commit(void **state) {
    (void)state;
    struct Case {
        uint64_t offset, bytes;
        const char *needle;
    } cases[] = {{16, 16, "its next part must start at 0"},
                 {0, 16, "only its first 16 bytes arrived before the version's commit"}};
    for (const Case &c : cases) {
        Live live;
        json r = decode(live.request);
        r[4]["tensors"]["parts"] = {{"tensor", {0}}, {"offset", {c.offset}}, {"bytes", {c.bytes}}};
        expect_receive(live, encode(r), WSYNC_ERR_MISMATCH, c.needle, c.needle);
        uint64_t done = 1;
        OK(wsync_receiver_completed_version(live.receiver, &done));
        assert_int_equal(done, 0);
        EXPECT_ERR(wsync_sender_flush(live.sender, 2000), WSYNC_ERR_PEER, c.needle);
    }
}

static void garbage_truncated_and_oversized_bytes_are_malformed(void **state) {
    (void)state;
    Live live;
    const bytes garbage = {0xde, 0xad, 0xbe, 0xef, 0x00, 0x11};
    expect_receive(live, garbage, WSYNC_ERR_MALFORMED, "not a sealed wsync blob", "garbage");
    expect_receive(live, json::to_cbor(json::object()), WSYNC_ERR_MALFORMED, "not a sealed", "a map");
    bytes trailing = live.request;
    trailing.push_back(0);
    // A trailing byte shifts the seal: the blob then ends in no seal (malformed), unless the
    // seal's first hash byte happens to be 0x1b (1 in 256 requests, whose nonce is random), in
    // which case it reads as a seal that does not match (integrity). Both are refusals.
    if (trailing[trailing.size() - 9] == 0x1b)
        expect_receive(live, trailing, WSYNC_ERR_INTEGRITY, "seal mismatch", "trailing byte");
    else
        expect_receive(live, trailing, WSYNC_ERR_MALFORMED, "not a sealed", "trailing byte");
    // A 0.1 blob (unsealed format 1) is named as such.
    json old = decode(live.request);
    old.erase(old.size() - 1);
    old[1] = 1;
    expect_receive(live, json::to_cbor(old), WSYNC_ERR_MALFORMED, "unsealed (format 1", "format 1");
    // Every proper prefix of a valid request is refused (and none crashes).
    for (size_t n = 1; n < live.request.size(); ++n) {
        bytes cut(live.request.begin(), live.request.begin() + n);
        wsync_status_t st = live.receive(cut);
        if (st != WSYNC_ERR_MALFORMED && st != WSYNC_ERR_INTEGRITY)
            fail_msg("prefix of %zu bytes: %s", n, wsync_status_string(st));
    }
    // Sealed garbage reaches the parser, which stays bounded. A declared length of 2^64-1
    // elements must not drive an allocation.
    const bytes huge_array = seal_raw({0x86, 0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00});
    expect_receive(live, huge_array, WSYNC_ERR_MALFORMED, "not valid CBOR", "huge array");
    const bytes huge_string = seal_raw({0x86, 0x7b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'a'});
    expect_receive(live, huge_string, WSYNC_ERR_MALFORMED, "not valid CBOR", "huge string");
    // Deep nesting is refused before it can exhaust the stack.
    bytes deep(200000, 0x81);
    deep[0] = 0x86;
    deep.push_back(0x00);
    expect_receive(live, seal_raw(deep), WSYNC_ERR_MALFORMED, "nesting deeper than 16", "deep nesting");
    // Tags are not part of the format.
    const bytes tagged = seal_raw({0x86, 0xc0, 0x61, 'x'});
    expect_receive(live, tagged, WSYNC_ERR_MALFORMED, "not valid CBOR", "tag");
    // Oversized blobs are refused by size before parsing (the buffer is never read).
    std::vector<uint8_t> big((size_t(256) << 20) + 1);
    expect_receive(live, big, WSYNC_ERR_MALFORMED, "exceeds the limit", "oversized");
    assert_int_equal(live.receive(live.request), WSYNC_OK);
}

static void hostile_init_info_is_refused_by_name(void **state) {
    (void)state;
    // A segment nobody has attached to yet, so its name still exists.
    wsync_strategy_t *owner;
    wsync_blob_t init;
    OK(wsync_strategy_create("shm", "{\"receivers\": 2, \"bucket_bytes\": 8192}", &owner));
    OK(wsync_strategy_create_init_info(owner, &init));
    const bytes valid(init.data, init.data + init.size);
    const Case cases[] = {
        {"segment missing", [](json &r) { r[4].erase("segment"); }, WSYNC_ERR_MALFORMED, "shm init info: missing field 'segment'"},
        {"segment path", [](json &r) { r[4]["segment"] = "/../../etc/passwd"; }, WSYNC_ERR_MALFORMED, "is not a POSIX shm name"},
        {"segment relative", [](json &r) { r[4]["segment"] = "wsync"; }, WSYNC_ERR_MALFORMED, "is not a POSIX shm name"},
        {"receivers zero", [](json &r) { r[4]["receivers"] = 0; }, WSYNC_ERR_MALFORMED, "out of range"},
        {"receivers 65", [](json &r) { r[4]["receivers"] = 65; }, WSYNC_ERR_MALFORMED, "receivers = 65 exceeds 64"},
        {"bucket unaligned", [](json &r) { r[4]["bucket_bytes"] = 4097; }, WSYNC_ERR_MALFORMED, "out of range"},
        {"bucket huge", [](json &r) { r[4]["bucket_bytes"] = UINT64_MAX; }, WSYNC_ERR_MALFORMED, "exceeds"},
        {"checksum not bool", [](json &r) { r[4]["checksum"] = "yes"; }, WSYNC_ERR_MALFORMED, "checksum is not a boolean"},
        {"geometry differs", [](json &r) { r[4]["buckets"] = 3; }, WSYNC_ERR_MISMATCH, "implies"},
        {"vanished segment", [](json &r) { r[4]["segment"] = "/wsync-gone"; r[4]["rendezvous"] = "wsync-gone"; }, WSYNC_ERR_UNAVAILABLE, "the sender is gone"},
        {"request type", [](json &r) { r[2] = "request"; }, WSYNC_ERR_MISMATCH, "expected an init blob"},
        {"other kind", [](json &r) { r[3] = "cuda_ipc"; }, WSYNC_ERR_MISMATCH, "blob is for strategy 'cuda_ipc'"},
    };
    wsync_strategy_t *s;
    OK(wsync_strategy_create("shm", nullptr, &s));
    for (const Case &c : cases) {
        json r = decode(valid);
        c.mutate(r);
        bytes b = encode(r);
        wsync_receiver_t *rcv = nullptr;
        wsync_status_t st = wsync_receiver_create(s, b.data(), b.size(), 0, &rcv);
        if (st != c.status || !strstr(wsync_last_error(), c.needle))
            fail_msg("%s: got %s \"%s\", want %s \"%s\"", c.what, wsync_status_string(st),
                     wsync_last_error(), wsync_status_string(c.status), c.needle);
        assert_null(rcv);
    }
    wsync_receiver_t *rcv = nullptr;  // the genuine blob still works
    OK(wsync_receiver_create(s, valid.data(), valid.size(), 1, &rcv));
    wsync_receiver_destroy(rcv);
    wsync_strategy_destroy(s);
    wsync_strategy_destroy(owner);
    wsync_blob_free(&init);
}

// A C consumer of a string with a NUL byte sees it cut ("/wsync-ab"), so every string field
// of every blob refuses NUL bytes as malformed, naming the field and showing the bytes.
static void string_fields_with_a_nul_byte_are_malformed_naming_the_field(void **state) {
    (void)state;
    Live live;
    const std::string nul_segment("/wsync-ab\0cd", 12);
    json init = decode(live.init_bytes());
    init[4]["segment"] = nul_segment;
    bytes b = encode(init);
    wsync_receiver_t *rcv = nullptr;
    EXPECT_ERR(wsync_receiver_create(live.rstrategy, b.data(), b.size(), 0, &rcv),
               WSYNC_ERR_MALFORMED, "shm init info.segment contains a NUL byte: '/wsync-ab\\x00cd'");
    assert_null(rcv);
    json req = decode(live.request);
    req[4]["transport"]["segment"] = nul_segment;
    expect_receive(live, encode(req), WSYNC_ERR_MALFORMED,
                   "shm request.segment contains a NUL byte: '/wsync-ab\\x00cd'", "request segment");
    assert_int_equal(live.receive(live.request), WSYNC_OK);
}

// Names are NUL-terminated UTF-8 (wsync.h): a request carrying any other name is malformed,
// named by its tensor index and shown escaped.
static void request_tensor_names_with_nul_or_not_utf8_are_malformed_naming_the_tensor(void **state) {
    (void)state;
    Live live;
    const struct {
        std::string name;
        const char *needle;
    } cases[] = {
        {std::string("a\0b", 3), "name of tensor 0 contains NUL: 'a\\x00b'"},
        {"w\xc0\xaf", "name of tensor 0 is not valid UTF-8: 'w\\xc0\\xaf'"},
        {"w\xe0\x80\xaf", "name of tensor 0 is not valid UTF-8: 'w\\xe0\\x80\\xaf'"},
        {"w\xed\xa0\x80", "name of tensor 0 is not valid UTF-8: 'w\\xed\\xa0\\x80'"},
        {"w\xf4\x90\x80\x80", "name of tensor 0 is not valid UTF-8: 'w\\xf4\\x90\\x80\\x80'"},
        {"w\xe2\x82", "name of tensor 0 is not valid UTF-8: 'w\\xe2\\x82'"},
        {"w\x80", "name of tensor 0 is not valid UTF-8: 'w\\x80'"},
    };
    for (const auto &c : cases) {
        json r = decode(live.request);
        r[4]["tensors"]["names"][0] = c.name;
        expect_receive(live, encode(r), WSYNC_ERR_MALFORMED, c.needle, c.needle);
    }
    json r = decode(live.request);  // well-formed UTF-8 is a name like any other...
    r[4]["tensors"]["names"][0] = "\xe5\xb1\x82.\xf0\x9f\x98\x80";
    bytes b = encode(r);
    wsync_recv_t *it = nullptr;
    OK(wsync_receiver_receive(live.receiver, b.data(), b.size(), &it));
    wsync_tensor_t v;
    bool has = true;
    while (has) OK(wsync_recv_next(it, &v, &has));
    // ...but renaming a tensor of a sent version no longer loads: the manifest's table digest
    // differs, so the version is refused at its commit.
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_MISMATCH, "incomplete or differs");
}

static void describe_renders_any_blob_and_refuses_garbage(void **state) {
    (void)state;
    Live live;
    char *text = nullptr;
    OK(wsync_blob_describe(live.init.data, live.init.size, &text));
    json j = json::parse(text);
    wsync_string_free(text);
    assert_true(j["type"] == "init" && j["body"]["receivers"] == 1);
    // A foreign kind still renders: describe is for logs and tools.
    json foreign = decode(live.request);
    foreign[3] = "ucx";
    foreign[4]["transport"] = {{"worker", "x"}};
    bytes fb = encode(foreign);
    OK(wsync_blob_describe(fb.data(), fb.size(), &text));
    assert_non_null(strstr(text, "\"ucx\""));
    wsync_string_free(text);
    // Names that are not UTF-8 are rendered with replacement characters, not an exception.
    json odd = decode(live.request);
    odd[4]["tensors"]["names"][0] = std::string("\xff\xfe", 2);
    bytes ob = encode(odd);
    OK(wsync_blob_describe(ob.data(), ob.size(), &text));
    wsync_string_free(text);
    const uint8_t junk[] = {0xff};
    EXPECT_ERR(wsync_blob_describe(junk, 1, &text), WSYNC_ERR_MALFORMED, "not a sealed");
    assert_null(text);
}

static void merge_of_a_single_sender_kind_takes_exactly_one_part(void **state) {
    (void)state;
    Live live;
    wsync_blob_t part = {live.request.data(), live.request.size()};
    wsync_blob_t out;
    OK(wsync_request_merge(&part, 1, &out));
    assert_int_equal(out.size, live.request.size());
    assert_memory_equal(out.data, live.request.data(), out.size);
    wsync_blob_free(&out);
    wsync_blob_t two[2] = {part, part};
    EXPECT_ERR(wsync_request_merge(two, 2, &out), WSYNC_ERR_UNSUPPORTED, "'shm' has a single sender; got 2 parts");
    EXPECT_ERR(wsync_request_merge(two, 0, &out), WSYNC_ERR_INVALID_ARGUMENT, "no parts");
    wsync_blob_t bad[2] = {part, {live.init.data, live.init.size}};
    EXPECT_ERR(wsync_request_merge(bad, 2, &out), WSYNC_ERR_MISMATCH, "part 1 is not a request");
    json other = decode(live.request);
    other[3] = "cuda_ipc";
    bytes ob = encode(other);
    wsync_blob_t mixed[2] = {part, {ob.data(), ob.size()}};
    EXPECT_ERR(wsync_request_merge(mixed, 2, &out), WSYNC_ERR_MISMATCH, "part 1 is for strategy 'cuda_ipc'");
    const uint8_t junk[] = {0x01};
    wsync_blob_t jb[1] = {{const_cast<uint8_t *>(junk), 1}};
    EXPECT_ERR(wsync_request_merge(jb, 1, &out), WSYNC_ERR_MALFORMED, "merge: part 0");
}

// Observation 9 of the transactions issue: one flipped bit in a request used to load (last
// false->true, version 1->3, float->int, a renamed checksum key). Every bit of a sealed request
// is now covered: a flip anywhere is refused before any field is read.
static void every_single_bit_flip_of_a_request_is_refused_and_nothing_loads(void **state) {
    (void)state;
    Live live;
    size_t integrity = 0, malformed = 0;
    for (size_t i = 0; i < live.request.size(); ++i) {
        for (int bit = 0; bit < 8; ++bit) {
            bytes b = live.request;
            b[i] ^= static_cast<uint8_t>(1u << bit);
            wsync_status_t st = live.receive(b);
            if (st == WSYNC_ERR_INTEGRITY) ++integrity;
            else if (st == WSYNC_ERR_MALFORMED) ++malformed;
            else fail_msg("byte %zu bit %d: accepted or misreported as %s (%s)", i, bit,
                          wsync_status_string(st), wsync_last_error());
        }
    }
    assert_true(integrity > malformed);  // most flips land in the body: the seal catches them
    assert_int_equal(live.receive(live.request), WSYNC_OK);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(every_single_bit_flip_of_a_request_is_refused_and_nothing_loads),
    cmocka_unit_test(blobs_are_a_cbor_array_with_magic_version_type_and_kind),
    cmocka_unit_test(blobs_round_trip_through_the_codec_and_describe),
    cmocka_unit_test(hostile_requests_are_refused_by_name_and_the_receiver_still_works),
    cmocka_unit_test(the_table_names_its_checksum_kind_and_is_verified_by_it),
    cmocka_unit_test(receiver_refuses_parts_out_of_order_or_incomplete_at_commit),
    cmocka_unit_test(garbage_truncated_and_oversized_bytes_are_malformed),
    cmocka_unit_test(hostile_init_info_is_refused_by_name),
    cmocka_unit_test(string_fields_with_a_nul_byte_are_malformed_naming_the_field),
    cmocka_unit_test(request_tensor_names_with_nul_or_not_utf8_are_malformed_naming_the_tensor),
    cmocka_unit_test(describe_renders_any_blob_and_refuses_garbage),
    cmocka_unit_test(merge_of_a_single_sender_kind_takes_exactly_one_part),
};

TU_MAIN(tests)
