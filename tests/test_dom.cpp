// wire::dispose (src/wire.cpp), white-box: it empties any DOM the library builds or decodes,
// nested as deep as a blob may be, with strings, binary values, objects inside arrays and arrays
// inside objects, and leaves it null; the sanitizer stage checks that nothing leaks or is freed
// twice. And a real request, decoded, disposed, decoded again from the same bytes, is unchanged.
#include <string>

#include "wire.hpp"
#include "whitebox.hpp"

namespace {
using json = wsync::wire::json;

// A DOM `depth` levels deep, every level holding a string, a binary value, numbers and an
// object whose members are arrays.
json nested(int depth) {
    json leaf = {{"names", {std::string(40, 'n'), "x"}}, {"bytes", json::binary({1, 2, 3})}};
    json level = json::array({std::string(100, 's'), json::binary(std::vector<uint8_t>(64, 7)),
                              uint64_t(1) << 63, -1, 2.5, leaf});
    if (depth > 1) level.push_back(nested(depth - 1));
    return level;
}

void dispose_empties_a_dom_of_any_shape_and_leaves_it_null(void **) {
    json deep = nested(16);
    wsync::wire::dispose(deep);
    assert_true(deep.is_null());
    json object = {{"a", nested(3)}, {"b", json::object({{"c", json::array({json::object()})}})}};
    wsync::wire::dispose(object);
    assert_true(object.is_null());
    json scalar = "just a string", empty = json::array();
    wsync::wire::dispose(scalar);
    wsync::wire::dispose(empty);
    assert_true(scalar.is_null() && empty.is_null());
    wsync::wire::dispose(scalar);  // again: a null stays null
    assert_true(scalar.is_null());
}

void a_blob_decoded_and_disposed_decodes_again_the_same(void **) {
    json body = {{"version", 1}, {"chunk", 0}, {"last", true},
                 {"tensors", {{"names", {"a.weight", "b.weight"}}, {"tree", {1, 2}}}},
                 {"transport", {{"segment", "/wsync-x"}, {"bucket", 0}}}};
    const std::vector<uint8_t> blob = wsync::wire::encode(wsync::wire::BlobType::Request, "shm", body);
    wsync::wire::Envelope first = wsync::wire::decode(blob.data(), blob.size());
    assert_true(first.body == body);
    wsync::wire::dispose(first.body);
    assert_true(first.body.is_null());
    wsync::wire::Envelope again = wsync::wire::decode(blob.data(), blob.size());
    assert_true(again.body == body);
}

}  // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dispose_empties_a_dom_of_any_shape_and_leaves_it_null),
        cmocka_unit_test(a_blob_decoded_and_disposed_decodes_again_the_same),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
