/* Compiled alone as C99 with -Wall -Wextra -Werror -pedantic: the header needs nothing else. */
#include "wsync.h"

int wsync_header_c99_probe(void);
int wsync_header_c99_probe(void) { return (int)sizeof(wsync_tensor_t) + WSYNC_VERSION_NUMBER; }
