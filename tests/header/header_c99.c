/* Compiled alone as C99 with -Wall -Wextra -Werror -pedantic: the header needs nothing else. */
#include "wsync.h"

int wsync_header_c99_probe(void);
int wsync_header_c99_probe(void) { return (int)sizeof(wsync_tensor_t) + WSYNC_VERSION_NUMBER; }

/* The initialisers set struct_size and nothing else. */
int wsync_header_c99_init_probe(void);
int wsync_header_c99_init_probe(void) {
    wsync_recv_info_t info = WSYNC_RECV_INFO_INIT;
    wsync_tensor_t t = WSYNC_TENSOR_INIT;
    wsync_apply_result_t r = WSYNC_APPLY_RESULT_INIT;
    return (int)(info.struct_size + t.struct_size + r.struct_size) + (t.name == 0) + (int)r.bytes;
}
