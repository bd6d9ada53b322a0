// Compiled alone as C++17 with -Wall -Wextra -Werror -pedantic: the header is usable from C++.
#include "wsync.h"

static_assert(WSYNC_OK == 0, "WSYNC_OK is 0");
int wsync_header_cpp17_probe();
int wsync_header_cpp17_probe() { return static_cast<int>(sizeof(wsync_chunk_t)); }
