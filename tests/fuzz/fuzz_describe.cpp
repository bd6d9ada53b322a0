// Any bytes through the envelope parser and the JSON renderer (wsync_blob_describe).
#include <cstddef>
#include <cstdint>

#include "wsync.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *json = nullptr;
    if (wsync_blob_describe(data, size, &json) == WSYNC_OK) wsync_string_free(json);
    return 0;
}
