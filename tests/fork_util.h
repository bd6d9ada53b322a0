/* Helpers of the fork and rendezvous specifications (test_fork.c, and their cuda_ipc twins in
 * test_gpu_strategies.c): fields of an init blob, and an impostor serving a descriptor at a
 * rendezvous name. */
#ifndef WSYNC_FORK_UTIL_H
#define WSYNC_FORK_UTIL_H

#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "testutil.h"

/* The string value of `key` in the init blob's description (a segment or rendezvous name). */
static inline void tu_init_field(const wsync_blob_t *init, const char *key, char *out, size_t cap) {
    char *json;
    OK(wsync_blob_describe(init->data, init->size, &json));
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    assert_non_null(p);
    p = strchr(p + strlen(pat), '"');
    assert_non_null(p);
    const char *e = strchr(p + 1, '"');
    assert_non_null(e);
    assert_true((size_t)(e - p - 1) < cap);
    memcpy(out, p + 1, (size_t)(e - p - 1));
    out[e - p - 1] = '\0';
    wsync_string_free(json);
}

/* A process that binds `name` in the abstract namespace and hands `fd` to whoever connects,
 * until killed: what an impostor does once the trainer is gone. Answers 0 when listening, 77
 * when it could not become uid (skip), 1 when it could not bind. */
typedef struct {
    const char *name;
    int fd;       /* -1: a 0600 file of its own, made after switching users */
    uid_t uid;    /* 0: stay this user */
    size_t bytes; /* of its own file */
} tu_impostor_cfg_t;

static inline int tu_impostor_main(const void *p, int in, int out) {
    (void)in;
    const tu_impostor_cfg_t *cfg = (const tu_impostor_cfg_t *)p;
    uint8_t b = 77;
    if (cfg->uid != 0 && (setgid(cfg->uid) != 0 || setuid(cfg->uid) != 0)) {
        tu_write_all(out, &b, 1);
        return 77;
    }
    int fd = cfg->fd;
    if (fd < 0) {
        char nm[64];
        snprintf(nm, sizeof nm, "/wsync-impostor-%d", (int)getpid());
        fd = shm_open(nm, O_CREAT | O_EXCL | O_RDWR, 0600);
        shm_unlink(nm);
        if (fd < 0 || ftruncate(fd, (off_t)cfg->bytes) != 0) return 2;
    }
    int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(cfg->name);
    memcpy(a.sun_path + 1, cfg->name, n);
    b = 1;
    if (bind(l, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0 ||
        listen(l, 8) != 0) {
        tu_write_all(out, &b, 1);
        return 1;
    }
    b = 0;
    tu_write_all(out, &b, 1);
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) continue;
        char one = 0;
        struct iovec iov = {&one, 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr m = {0};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = u.buf;
        m.msg_controllen = sizeof u.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        (void)sendmsg(c, &m, MSG_NOSIGNAL);
        close(c);
    }
}

#endif
