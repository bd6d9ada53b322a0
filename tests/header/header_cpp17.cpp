// Compiled alone as C++17 with -Wall -Wextra -Werror -pedantic: the header is usable from C++.
#include "wsync.h"

static_assert(WSYNC_OK == 0, "WSYNC_OK is 0");
int wsync_header_cpp17_probe();
int wsync_header_cpp17_probe() { return static_cast<int>(sizeof(wsync_chunk_t)); }

// The initialisers set struct_size and nothing else, in C++ too.
int wsync_header_cpp17_init_probe();
int wsync_header_cpp17_init_probe() {
    wsync_recv_info_t info = WSYNC_RECV_INFO_INIT;
    const wsync_tensor_t t = WSYNC_TENSOR_INIT;
    wsync_apply_result_t r = WSYNC_APPLY_RESULT_INIT;
    return static_cast<int>(info.struct_size + t.struct_size + r.struct_size) + (t.name == nullptr) +
           static_cast<int>(r.bytes);
}
