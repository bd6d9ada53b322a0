/* The ucx kind as a network service (issue 37): who may talk to a trainer, and what a peer that
 * can reach its UCX port but does not hold the init info can do to it (wsync.h, the ucx kind's
 * trust model). The trainer and an honest engine are libwsync in this one process over loopback
 * tcp; the "rogue" is a raw UCP worker of its own (linked against libucp, not through libwsync)
 * that knows the trainer's worker address, and what any request blob says (the session), but
 * not the init info's key. Where a test plays a peer that holds the key (a recorded engine), it
 * makes the control messages itself from docs/wire-format.md, with OpenSSL's HMAC-SHA256, so the
 * documented format is what is checked.
 *
 * Each test asserts what the rogue gets back (nothing, unless it proved the key), that the
 * trainer stays unharmed (the honest engine still loads a version bit for bit and the trainer's
 * flush is OK), and the time bounds (the rogue listens a fixed 400 ms per attempt; flushes and
 * attaches within their deadlines). */
#define _GNU_SOURCE /* memmem */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sched.h>
#include <openssl/hmac.h>
#include <ucp/api/ucp.h>

#include "testutil.h"

#define OPTS "\"transports\":\"tcp\",\"net_devices\":\"lo\",\"timeout_ms\":3000"
enum { TENSOR_BYTES = 65536, LISTEN_MS = 400 };

/* ---- the trainer and the honest engine (libwsync) ----------------------------------------- */

struct trainer {
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *snd;
    uint8_t data[TENSOR_BYTES];
};

static void trainer_start(struct trainer *t, unsigned receivers) {
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":%u}", receivers);
    OK(wsync_strategy_create("ucx", o, &t->s));
    OK(wsync_strategy_create_init_info(t->s, &t->init));
    OK(wsync_sender_create(t->s, t->init.data, t->init.size, &t->snd));
}

static void trainer_stop(struct trainer *t) {
    wsync_sender_destroy(t->snd);
    wsync_blob_free(&t->init);
    wsync_strategy_destroy(t->s);
}

static wsync_status_t engine_with(const uint8_t *init, size_t len, uint32_t index, wsync_receiver_t **r) {
    wsync_strategy_t *s = NULL;
    OK(wsync_strategy_create("ucx", "{" OPTS "}", &s));
    wsync_status_t st = wsync_receiver_create(s, init, len, index, r);
    wsync_strategy_destroy(s);
    return st;
}

static wsync_receiver_t *engine(struct trainer *t, uint32_t index) {
    wsync_receiver_t *r = NULL;
    OK(engine_with(t->init.data, t->init.size, index, &r));
    return r;
}

/* Sends version v (one tensor of tu_fill(v, 0)) in one committing chunk; the request in *req. */
static void send_version(struct trainer *t, uint64_t v, wsync_blob_t *req) {
    static const int64_t shape[1] = {TENSOR_BYTES / 4};
    tu_fill(t->data, TENSOR_BYTES, v, 0);
    wsync_tensor_t w = tu_tensor("w", t->data, shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&w, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(t->snd, &c, req));
}

/* Engine r receives req: version v of tensor number t (as tu_fill writes it), `bytes` long,
 * bit for bit. */
static void take_tensor(wsync_receiver_t *r, const wsync_blob_t *req, size_t bytes, uint64_t v, uint64_t t) {
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(r, req->data, req->size, &it));
    wsync_tensor_t view;
    bool has = false;
    OK(wsync_recv_next(it, &view, &has));
    assert_true(has);
    assert_true(tu_check(view.data, bytes, v, t));
    OK(wsync_recv_end(it));
}

/* Engine r receives req, version v of the tensor, bit for bit. */
static void take(wsync_receiver_t *r, const wsync_blob_t *req, uint64_t v) { take_tensor(r, req, TENSOR_BYTES, v, 0); }

/* The trainer is unharmed: version v reaches engine r bit for bit and the flush is OK within 3 s. */
static void honest_version_loads(struct trainer *t, wsync_receiver_t *r, uint64_t v) {
    wsync_blob_t req;
    send_version(t, v, &req);
    take(r, &req, v);
    const long t0 = tu_now_ms();
    OK(wsync_sender_flush(t->snd, 3000));
    assert_true(tu_now_ms() - t0 < 3000);
    wsync_blob_free(&req);
}

/* ---- what the blobs say (CBOR, docs/wire-format.md) ---------------------------------------- */

/* The byte string after the text key `name` in a blob: its bytes, its length in *n. */
static const uint8_t *blob_bytes(const wsync_blob_t *b, const char *name, size_t *n) {
    uint8_t key[32];
    const size_t kl = strlen(name);
    key[0] = (uint8_t)(0x60 + kl);
    memcpy(key + 1, name, kl);
    const uint8_t *p = memmem(b->data, b->size, key, kl + 1);
    assert_non_null(p);
    p += kl + 1;
    if (*p >= 0x40 && *p < 0x58) { *n = *p - 0x40u; return p + 1; }
    if (*p == 0x58) { *n = p[1]; return p + 2; }
    if (*p == 0x59) { *n = (size_t)p[1] << 8 | p[2]; return p + 3; }
    assert_int_equal(*p, 0x5a);
    *n = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
    return p + 5;
}

/* The unsigned integer after the text key `name`. */
static uint64_t blob_uint(const wsync_blob_t *b, const char *name) {
    uint8_t key[32];
    const size_t kl = strlen(name);
    key[0] = (uint8_t)(0x60 + kl);
    memcpy(key + 1, name, kl);
    const uint8_t *p = memmem(b->data, b->size, key, kl + 1);
    assert_non_null(p);
    p += kl + 1;
    if (*p < 0x18) return *p;
    const int len = *p == 0x18 ? 1 : *p == 0x19 ? 2 : *p == 0x1a ? 4 : 8;
    assert_true(*p >= 0x18 && *p <= 0x1b);
    uint64_t v = 0;
    for (int i = 1; i <= len; ++i) v = v << 8 | p[i];
    return v;
}

/* ---- control messages, made here from the documented format ------------------------------- */

enum { HELLO = 1, WELCOME, LEASE, GRANT, ACK, BYE, ABANDON, DROPPED, FETCH, DATA };
enum { HEAD = 2 + 2 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 4 + 4 + 4 + 16 + 2 + 4, MAC = 32, NONCE_AT = HEAD - 16 - 6,
       STATUS_AT = 2 + 2 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 4, TEXT_AT = HEAD };

struct msg {
    uint16_t type;
    uint32_t index;
    uint64_t token, number, seq;
    uint8_t nonce[16];
    const void *address;
    size_t address_len;
    uint64_t version, offset, bytes;
};

static void put(uint8_t **p, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) *(*p)++ = (uint8_t)(v >> (8 * i));
}

/* Encodes m (wire version 3) into out and appends its MAC: a hello's is HMAC-SHA256(key,
 * "wsync-ucx-hello" | bytes), any other's HMAC-SHA256(key, 'E' | bytes) (engine to trainer).
 * Returns the size. */
static size_t seal(const struct msg *m, const uint8_t key[32], uint8_t *out) {
    uint8_t *p = out;
    put(&p, 3, 2);
    put(&p, m->type, 2);
    put(&p, m->index, 4);
    put(&p, m->token, 8);
    put(&p, m->number, 8);
    put(&p, m->seq, 8);
    put(&p, m->version, 8);
    put(&p, m->offset, 8);
    put(&p, m->bytes, 8);
    put(&p, 0, 4);  /* chunk */
    put(&p, 0, 4);  /* status */
    put(&p, (uint64_t)getpid(), 4);
    memcpy(p, m->nonce, 16);
    p += 16;
    put(&p, 0, 2);
    put(&p, m->address_len, 4);
    if (m->address_len) memcpy(p, m->address, m->address_len);
    p += m->address_len;
    uint8_t d[70000];
    size_t n = 0;
    if (m->type == HELLO) {
        memcpy(d, "wsync-ucx-hello", 15);
        n = 15;
    } else {
        d[n++] = 'E';
    }
    memcpy(d + n, out, (size_t)(p - out));
    n += (size_t)(p - out);
    unsigned len = 0;
    HMAC(EVP_sha256(), key, 32, d, n, p, &len);
    assert_int_equal(len, MAC);
    return (size_t)(p - out) + MAC;
}

/* The connection's key: HMAC-SHA256(key, "wsync-ucx-conn" | index | token | engine nonce |
 * trainer nonce), integers little-endian. */
static void connection_key(const uint8_t key[32], uint32_t index, uint64_t token, const uint8_t ours[16],
                           const uint8_t theirs[16], uint8_t out[32]) {
    uint8_t d[14 + 4 + 8 + 32], *p = d + 14;
    memcpy(d, "wsync-ucx-conn", 14);
    put(&p, index, 4);
    put(&p, token, 8);
    memcpy(p, ours, 16);
    memcpy(p + 16, theirs, 16);
    unsigned len = 0;
    HMAC(EVP_sha256(), key, 32, d, sizeof d, out, &len);
}

/* ---- the rogue: a raw UCP worker ------------------------------------------------------------ */

struct rogue {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    int got;                /* messages that reached it on the control and data ids */
    uint8_t last[4096];     /* the last of them (a Data message's header) */
    size_t last_len;
    uint8_t payload[8192];  /* a Data message's eager payload */
    size_t payload_len;
};

static ucs_status_t rogue_on_am(void *arg, const void *h, size_t hl, void *data, size_t n,
                                const ucp_am_recv_param_t *param) {
    struct rogue *r = arg;
    ++r->got;
    const void *m = hl ? h : data;
    const size_t ml = hl ? hl : n;
    r->last_len = ml < sizeof r->last ? ml : sizeof r->last;
    memcpy(r->last, m, r->last_len);
    r->payload_len = 0;
    if (hl && !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        r->payload_len = n < sizeof r->payload ? n : sizeof r->payload;
        memcpy(r->payload, data, r->payload_len);
    }
    return UCS_OK;
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t st) { (void)arg, (void)ep, (void)st; }

static void rogue_start(struct rogue *r, const struct trainer *t) {
    memset(r, 0, sizeof *r);
    ucp_config_t *cfg = NULL;
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    ucp_config_modify(cfg, "TLS", "tcp");
    ucp_config_modify(cfg, "NET_DEVICES", "lo");
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM | UCP_FEATURE_RMA};
    assert_int_equal(ucp_init(&p, cfg, &r->ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    assert_int_equal(ucp_worker_create(r->ctx, &wp, &r->w), UCS_OK);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = 1, .cb = rogue_on_am, .arg = r};
    assert_int_equal(ucp_worker_set_am_recv_handler(r->w, &hp), UCS_OK);
    hp.id = 2; /* Data */
    assert_int_equal(ucp_worker_set_am_recv_handler(r->w, &hp), UCS_OK);
    size_t n = 0;
    const uint8_t *addr = blob_bytes(&t->init, "address", &n);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .address = (const ucp_address_t *)addr, .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {ep_failed, NULL}};
    assert_int_equal(ucp_ep_create(r->w, &ep, &r->ep), UCS_OK);
}

static void rogue_stop(struct rogue *r) {
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(r->ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(r->w);
        ucp_request_free(req);
    }
    ucp_worker_destroy(r->w);
    ucp_cleanup(r->ctx);
}

/* Its worker address (for a hello that asks the trainer to answer it). */
static size_t rogue_address(struct rogue *r, uint8_t *out, size_t cap) {
    ucp_address_t *a = NULL;
    size_t n = 0;
    assert_int_equal(ucp_worker_get_address(r->w, &a, &n), UCS_OK);
    assert_true(n <= cap);
    memcpy(out, a, n);
    ucp_worker_release_address(r->w, a);
    return n;
}

/* Sends n bytes to active-message id `id` of the trainer and waits until they are out. */
static void rogue_send(struct rogue *r, unsigned id, const void *bytes, size_t n) {
    ucp_request_param_t p = {0};
    void *req = ucp_am_send_nbx(r->ep, id, NULL, 0, bytes, n, &p);
    if (UCS_PTR_IS_PTR(req)) {
        const long t0 = tu_now_ms();
        while (ucp_request_check_status(req) == UCS_INPROGRESS && tu_now_ms() - t0 < 3000) ucp_worker_progress(r->w);
        ucp_request_free(req);
    }
}

/* Progresses for LISTEN_MS; returns how many control messages reached it meanwhile. */
static int rogue_listen(struct rogue *r) {
    const int before = r->got;
    const long t0 = tu_now_ms();
    while (tu_now_ms() - t0 < LISTEN_MS) {
        ucp_worker_progress(r->w);
        usleep(1000);
    }
    return r->got - before;
}

/* Progresses until one more message reached it (up to 2 s); returns whether one did. */
static int rogue_await(struct rogue *r) {
    const int before = r->got;
    const long t0 = tu_now_ms();
    while (r->got == before && tu_now_ms() - t0 < 2000) ucp_worker_progress(r->w);
    return r->got > before;
}

static uint64_t rnd64(void) {
    uint64_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 16 ^ (uint64_t)(rand() & 0xffff);
    return v;
}

/* Attaches rogue a at `index` as an engine holding the key would (the test plays a recorded
 * engine): a hello MACed with the key, the welcome (OK), the connection's key in ck. */
static void keyed_attach(struct rogue *a, const struct trainer *t, uint32_t index, uint64_t token, uint8_t ck[32]) {
    size_t kn = 0;
    const uint8_t *key = blob_bytes(&t->init, "key", &kn);
    static uint8_t addr[65536], hello[70000];
    const size_t alen = rogue_address(a, addr, sizeof addr);
    struct msg h = {HELLO, index, token, 0, blob_uint(&t->init, "session"), {0}, addr, alen, 0, 0, 0};
    for (int i = 0; i < 16; ++i) h.nonce[i] = (uint8_t)rand();
    rogue_send(a, 1, hello, seal(&h, key, hello));
    assert_int_equal(rogue_listen(a), 1);
    assert_int_equal(a->last[2], WELCOME);
    assert_int_equal(a->last[STATUS_AT], 0);
    connection_key(key, index, token, h.nonce, a->last + NONCE_AT, ck);
}

/* The status of the last message the rogue got, and whether its text holds `needle`. */
static int last_status(const struct rogue *r) { return r->last[STATUS_AT] | r->last[STATUS_AT + 1] << 8; }
static int last_says(const struct rogue *r, const char *needle) {
    const size_t n = r->last[HEAD - 6] | (size_t)r->last[HEAD - 5] << 8;
    char text[300] = {0};
    memcpy(text, r->last + TEXT_AT, n < 299 ? n : 299);
    return strstr(text, needle) != NULL;
}

/* A peer that holds the key and is attached as receiver `index` (keyed_attach), and the number
 * of its last message. */
struct keyed {
    struct rogue a;
    uint8_t ck[32];
    uint32_t index;
    uint64_t token, number;
};

static void keyed_start(struct keyed *k, const struct trainer *t, uint32_t index) {
    rogue_start(&k->a, t);
    k->index = index;
    k->token = rnd64();
    k->number = 0;
    keyed_attach(&k->a, t, index, k->token, k->ck);
}

/* Sends the keyed peer's next message of `type` for chunk seq (version, offset, bytes as the
 * message carries them) and, unless `answer` is 0, asserts one answer of that type came back;
 * returns its status (0 when none is awaited). */
static int keyed_ask(struct keyed *k, int type, uint64_t seq, uint64_t version, uint64_t offset, uint64_t bytes,
                     int answer) {
    uint8_t out[4096];
    struct msg m = {(uint16_t)type, k->index, k->token, ++k->number, seq, {0}, NULL, 0, version, offset, bytes};
    rogue_send(&k->a, 1, out, seal(&m, k->ck, out));
    if (!answer) return 0;
    assert_int_equal(rogue_listen(&k->a), 1);
    assert_int_equal(k->a.last[2], answer);
    return last_status(&k->a);
}

/* ---- the tests ------------------------------------------------------------------------------ */

/* A peer that reaches the trainer's port without the key is not answered and takes nothing:
 * hellos for a free index with the right session and its own address but a MAC made with
 * another key, or none, or of wire version 1 (no MAC at all), are dropped; the rogue's worker
 * hears nothing back (the trainer did not connect to the address they name). An engine whose
 * init info carries another key (a stale or forged one) times out at its own deadline naming
 * the trainer, and the index it asked for stays free: the honest engine takes it afterwards.
 * Engine 0, attached throughout, loads a version bit for bit and the flush is OK. */
static void a_peer_without_the_key_is_not_answered_and_takes_no_index(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 2);
    wsync_receiver_t *e0 = engine(&t, 0);
    wsync_blob_t req;
    send_version(&t, 1, &req);  /* what any holder of a request knows: the session */
    const uint64_t session = blob_uint(&req, "session");
    struct rogue r;
    rogue_start(&r, &t);
    static uint8_t addr[65536], out[70000];
    const size_t alen = rogue_address(&r, addr, sizeof addr);
    uint8_t wrong[32];
    memset(wrong, 0x5a, sizeof wrong);
    struct msg h = {HELLO, 1, rnd64(), 0, session, {1, 2, 3}, addr, alen, 0, 0, 0};
    size_t n = seal(&h, wrong, out);
    rogue_send(&r, 1, out, n);
    assert_int_equal(rogue_listen(&r), 0);          /* a MAC made with another key */
    rogue_send(&r, 1, out, n - MAC);
    assert_int_equal(rogue_listen(&r), 0);          /* no MAC */
    uint8_t v1[50 + 65536] = {0};
    v1[0] = HELLO;                                   /* wire version 1: type u32 first */
    v1[4] = 1;
    memcpy(v1 + 16, &session, 8);
    v1[46] = (uint8_t)alen, v1[47] = (uint8_t)(alen >> 8);
    memcpy(v1 + 50, addr, alen);
    rogue_send(&r, 1, v1, 50 + alen);
    assert_int_equal(rogue_listen(&r), 0);
    rogue_stop(&r);

    /* An init info with another key: the attach is not answered; TIMEOUT at timeout_ms. */
    wsync_blob_t forged = {malloc(t.init.size), t.init.size};
    memcpy(forged.data, t.init.data, t.init.size);
    size_t kn = 0;
    uint8_t *key = (uint8_t *)blob_bytes(&forged, "key", &kn);
    assert_int_equal(kn, 32);
    key[0] ^= 1;
    tu_reseal(forged.data, forged.size);
    wsync_receiver_t *e1 = NULL;
    const long t0 = tu_now_ms();
    EXPECT_ERR(engine_with(forged.data, forged.size, 1, &e1), WSYNC_ERR_TIMEOUT, "did not answer the attach within 3000 ms");
    const long took = tu_now_ms() - t0;
    assert_true(took >= 2900 && took < 5000);
    assert_null(e1);
    free(forged.data);

    /* Nothing took index 1: the honest engine attaches there (and leaves owing nothing). */
    e1 = engine(&t, 1);
    wsync_receiver_destroy(e1);
    take(e0, &req, 1);
    OK(wsync_sender_flush(t.snd, 3000));
    wsync_blob_free(&req);
    honest_version_loads(&t, e0, 2);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* A hello is answered once: a peer holding the key (here the test, playing a recorded engine)
 * gets exactly one welcome, whose status is OK and whose MAC is made with the connection's key;
 * the same hello sent again, from another worker, is dropped (its nonce was seen), and nothing
 * reaches either worker. After the hello every message is authenticated: a lease with the
 * member's index and token (both visible on the wire) but a wrong MAC is dropped (no grant
 * comes); a lease MACed with the connection's key is granted an answer; the same lease again
 * (its number does not rise) is dropped. A bye MACed right ends the membership, so the honest
 * engine's version flushes OK. */
static void a_replayed_hello_and_forged_or_replayed_messages_are_dropped(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 2);
    wsync_receiver_t *e0 = engine(&t, 0);
    size_t kn = 0;
    const uint8_t *key = blob_bytes(&t.init, "key", &kn);
    assert_int_equal(kn, 32);
    const uint64_t session = blob_uint(&t.init, "session");
    struct rogue a, b;
    rogue_start(&a, &t);
    rogue_start(&b, &t);
    static uint8_t addr[65536], hello[70000], out[4096];
    const size_t alen = rogue_address(&a, addr, sizeof addr);
    const uint64_t token = rnd64();
    struct msg h = {HELLO, 1, token, 0, session, {0}, addr, alen, 0, 0, 0};
    for (int i = 0; i < 16; ++i) h.nonce[i] = (uint8_t)rand();
    const size_t hn = seal(&h, key, hello);

    rogue_send(&a, 1, hello, hn);
    assert_int_equal(rogue_listen(&a), 1);           /* the welcome */
    assert_int_equal(a.last[STATUS_AT], 0);         /* attached */
    /* Its text offers the data stream (over tcp, "data_path" "auto"): on lo, at 127.0.0.1. */
    static const char offer[] = "data stream at 127.0.0.1:";
    const size_t tlen = a.last_len - HEAD - MAC;
    assert_true(tlen > sizeof offer - 1 && tlen <= sizeof offer - 1 + 5);
    assert_memory_equal(a.last + HEAD, offer, sizeof offer - 1);
    uint8_t ck[32];
    connection_key(key, 1, token, h.nonce, a.last + NONCE_AT, ck);
    {
        uint8_t d[1 + HEAD + 64], mac[32];
        d[0] = 'T';
        memcpy(d + 1, a.last, HEAD + tlen);
        unsigned len = 0;
        HMAC(EVP_sha256(), ck, 32, d, 1 + HEAD + tlen, mac, &len);
        assert_memory_equal(mac, a.last + HEAD + tlen, MAC);  /* MACed with the connection's key */
    }

    rogue_send(&b, 1, hello, hn);                    /* replayed from elsewhere */
    assert_int_equal(rogue_listen(&b) + rogue_listen(&a), 0);

    struct msg lease = {LEASE, 1, token, 1, 99, {0}, NULL, 0, 0, 0, 0};
    size_t n = seal(&lease, key, out);               /* the init info's key, not the connection's */
    rogue_send(&b, 1, out, n);
    assert_int_equal(rogue_listen(&a), 0);
    n = seal(&lease, ck, out);
    rogue_send(&a, 1, out, n);
    assert_int_equal(rogue_listen(&a), 1);           /* granted an answer (seq 99: not kept) */
    assert_int_equal(a.last[2], GRANT);
    rogue_send(&b, 1, out, n);                       /* the same lease again */
    assert_int_equal(rogue_listen(&a), 0);

    struct msg bye = {BYE, 1, token, 2, 0, {0}, NULL, 0, 0, 0, 0};
    n = seal(&bye, ck, out);
    rogue_send(&a, 1, out, n);
    (void)rogue_listen(&a);
    rogue_stop(&b);
    rogue_stop(&a);
    honest_version_loads(&t, e0, 1);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* Active messages to ids other than the control id (28000 and 40000, where UCX 1.13.1 read
 * past its handler table and killed the trainer, whatever the id libwsync used; 0xffff, the
 * highest; 0x5753, wire version 1's id; 2, which found a stale callback in the grown table),
 * and malformed ones to
 * the control id (empty, short, another wire version, lengths that do not add up, a 1 MiB
 * rendezvous message) are dropped: the rogue hears nothing, the trainer neither crashes nor
 * stalls, and the honest engine loads the next version with the flush OK. */
static void unknown_ids_and_malformed_messages_are_dropped(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 1);
    wsync_receiver_t *e0 = engine(&t, 0);
    struct rogue r;
    rogue_start(&r, &t);
    static uint8_t junk[1 << 20];
    for (size_t i = 0; i < sizeof junk; ++i) junk[i] = (uint8_t)(i * 131);
    const unsigned ids[] = {28000, 40000, 0xffff, 0x5753, 2, 0};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; ++i) rogue_send(&r, ids[i], junk, 64);
    rogue_send(&r, 1, junk, 0);
    rogue_send(&r, 1, junk, 10);
    uint8_t m[HEAD + MAC] = {0};
    m[0] = 1;                                        /* wire version 1 */
    rogue_send(&r, 1, m, sizeof m);
    m[0] = 2, m[2] = ACK, m[HEAD - 6] = 200;         /* says 200 text bytes; carries none */
    rogue_send(&r, 1, m, sizeof m);
    rogue_send(&r, 1, junk, sizeof junk);            /* rendezvous */
    assert_int_equal(rogue_listen(&r), 0);
    rogue_stop(&r);
    honest_version_loads(&t, e0, 1);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* The key is in the init info only: no request carries it. No blob names this host (the
 * trainer is "the trainer (session ...)" to engines, an engine "receiver N (pid P)" to the
 * trainer). An init info without the wire version and key (libwsync 0.6, ucx wire version 1)
 * is refused by name before anything connects, and so is one of wire version 2 (libwsync 0.7,
 * whose engines would take a request whose checksums follow its bytes for one without). */
static void the_key_is_in_the_init_info_only_and_an_older_init_info_is_refused_by_name(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 1);
    size_t kn = 0;
    const uint8_t *key = blob_bytes(&t.init, "key", &kn);
    assert_int_equal(kn, 32);
    wsync_blob_t req;
    send_version(&t, 1, &req);
    assert_null(memmem(req.data, req.size, key, kn));
    char host[256] = {0};
    assert_int_equal(gethostname(host, sizeof host - 1), 0);
    assert_null(memmem(t.init.data, t.init.size, " pid ", 5));
    if (strlen(host) >= 6) { /* shorter names turn up by chance in the key or the address */
        assert_null(memmem(t.init.data, t.init.size, host, strlen(host)));
        assert_null(memmem(req.data, req.size, host, strlen(host)));
    }

    wsync_blob_t old = {malloc(t.init.size), t.init.size};
    memcpy(old.data, t.init.data, t.init.size);
    uint8_t *w = memmem(old.data, old.size, "\x64wire", 5);
    assert_non_null(w);
    w[4] = 'x';  /* no "wire" field: as a version 1 init info */
    tu_reseal(old.data, old.size);
    wsync_receiver_t *r = NULL;
    EXPECT_ERR(engine_with(old.data, old.size, 0, &r), WSYNC_ERR_MALFORMED, "ucx wire version 1");
    assert_null(r);
    memcpy(old.data, t.init.data, t.init.size);
    w = memmem(old.data, old.size, "\x64wire\x03", 6);  /* CBOR: "wire": 3 */
    assert_non_null(w);
    w[5] = 0x02;
    tu_reseal(old.data, old.size);
    EXPECT_ERR(engine_with(old.data, old.size, 0, &r), WSYNC_ERR_MALFORMED,
               "ucx init info is of ucx wire version 2; this library speaks version 3");
    assert_null(r);
    free(old.data);
    wsync_blob_free(&req);
    trainer_stop(&t);
}

/* The key leaks through no description either: wsync_blob_describe (what `wsync inspect` and
 * the bindings' describe print, and what lands in logs and issue reports) shows the init
 * info's key by its length only, and none of the key's bytes as a JSON byte array. */
static void a_description_of_the_init_info_shows_the_keys_length_not_the_key(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 1);
    size_t kn = 0;
    (void)blob_bytes(&t.init, "key", &kn);
    assert_int_equal(kn, 32);
    char *text = NULL;
    OK(wsync_blob_describe(t.init.data, t.init.size, &text));
    /* the member is a string naming the length; a byte string would render as an object
     * {"bytes": [...], "subtype": null} */
    assert_non_null(strstr(text, "\"key\": \"(secret, 32 bytes, not shown)\""));
    assert_null(strstr(text, "\"key\": {"));
    /* the other byte strings are still shown (the worker address an engine connects to) */
    assert_non_null(strstr(text, "\"address\": {"));
    wsync_string_free(text);
    trainer_stop(&t);
}

/* Chunks move only as the trainer's answers to fetches it checked (nothing of its memory is
 * registered for peers, and its UCX context has no remote memory access: requests carry no
 * address and no remote key). Even an engine holding the key (here the test, attached as one)
 * gets bytes only of a chunk it holds a lease on and only within the chunk: a fetch without a
 * lease is refused with WRONG_STATE, one that reaches past the chunk's end (or wraps around
 * 2^64) with MALFORMED naming the chunk's size, each with no byte; a fetch within it brings
 * exactly those bytes of the version. The trainer does not crash, and after the rogue
 * acknowledges and leaves, the honest engine loads the version and the flush is OK. */
static void fetches_without_a_lease_or_past_a_chunks_end_are_refused_without_a_byte(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 2);
    wsync_receiver_t *e0 = engine(&t, 0);
    struct keyed k;
    keyed_start(&k, &t, 1);
    wsync_blob_t req;
    send_version(&t, 1, &req);
    assert_null(memmem(req.data, req.size, "\x64rkey", 5));
    assert_null(memmem(req.data, req.size, "\x64" "addr", 5));
    const uint64_t seq = blob_uint(&req, "seq");
    assert_int_equal(keyed_ask(&k, FETCH, seq, 1, 0, 4096, DATA), WSYNC_ERR_WRONG_STATE); /* no lease yet */
    assert_true(last_says(&k.a, "is not leased to this receiver"));
    assert_int_equal(k.a.payload_len, 0);

    assert_int_equal(keyed_ask(&k, LEASE, seq, 0, 0, 0, GRANT), 0);

    const uint64_t past[][2] = {{TENSOR_BYTES - 100, 200}, {TENSOR_BYTES, 1}, {UINT64_MAX - 10, 100}, {0, 0}};
    for (size_t i = 0; i < sizeof past / sizeof *past; ++i) {
        assert_int_equal(keyed_ask(&k, FETCH, seq, 2 + i, past[i][0], past[i][1], DATA), WSYNC_ERR_MALFORMED);
        assert_true(last_says(&k.a, "-byte chunk seq"));
        assert_int_equal(k.a.payload_len, 0);
    }
    assert_int_equal(keyed_ask(&k, FETCH, seq, 9, 4096, 4096, DATA), 0); /* within the chunk */
    assert_int_equal(k.a.payload_len, 4096);
    uint8_t want[8192];
    tu_fill(want, sizeof want, 1, 0);
    assert_memory_equal(k.a.payload, want + 4096, 4096);

    keyed_ask(&k, ACK, seq, 1, 0, 0, 0);
    keyed_ask(&k, BYE, 0, 0, 0, 0, 0);
    (void)rogue_listen(&k.a);
    rogue_stop(&k.a);
    take(e0, &req, 1);
    OK(wsync_sender_flush(t.snd, 3000));
    wsync_blob_free(&req);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* A chunk sent in place from the trainer's arena is served only until the flush returns OK:
 * a peer holding the key that owed the version, leased the chunk, read it and acknowledged it
 * is refused a new lease and a fetch of it afterwards (ABANDONED, no byte), while the trainer
 * writes the arena for its next step. */
static void an_arena_chunk_is_served_to_no_peer_once_the_flush_returned(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    OK(wsync_strategy_create("ucx", "{" OPTS ",\"receivers\":2,\"arena_bytes\":65536}", &t.s));
    OK(wsync_strategy_create_init_info(t.s, &t.init));
    OK(wsync_sender_create(t.s, t.init.data, t.init.size, &t.snd));
    void *arena = NULL;
    uint64_t arena_bytes = 0;
    OK(wsync_sender_arena(t.snd, &arena, &arena_bytes));
    assert_true(arena_bytes >= TENSOR_BYTES);
    wsync_receiver_t *e0 = engine(&t, 0);
    struct keyed k;
    keyed_start(&k, &t, 1);

    static const int64_t shape[1] = {TENSOR_BYTES / 4};
    tu_fill(arena, TENSOR_BYTES, 1, 0);
    wsync_tensor_t w = tu_tensor("w", arena, shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&w, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(t.snd, &c, &req));
    const uint64_t seq = blob_uint(&req, "seq");
    assert_int_equal(keyed_ask(&k, LEASE, seq, 0, 0, 0, GRANT), 0);
    assert_int_equal(keyed_ask(&k, FETCH, seq, 1, 0, 4096, DATA), 0);
    assert_int_equal(k.a.payload_len, 4096);
    assert_memory_equal(k.a.payload, arena, 4096);
    keyed_ask(&k, ACK, seq, 1, 0, 0, 0);
    take(e0, &req, 1);
    OK(wsync_sender_flush(t.snd, 3000));
    tu_fill(arena, TENSOR_BYTES, 2, 0); /* the trainer's next step */

    assert_int_equal(keyed_ask(&k, LEASE, seq, 0, 0, 0, GRANT), WSYNC_ERR_ABANDONED);
    assert_true(last_says(&k.a, "was sent in place from the trainer's arena and its flush has returned"));
    assert_int_equal(keyed_ask(&k, FETCH, seq, 2, 0, 4096, DATA), WSYNC_ERR_ABANDONED);
    assert_int_equal(k.a.payload_len, 0);
    rogue_stop(&k.a);
    wsync_blob_free(&req);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* The trainer's resident memory, in KiB (VmRSS). */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* Sends version v as one committing chunk of one BIG_BYTES tensor (tu_fill(v, 1)). */
enum { BIG_BYTES = 4 << 20 };
static void send_big(struct trainer *t, uint8_t *data, uint64_t v, wsync_blob_t *req) {
    static const int64_t shape[1] = {BIG_BYTES / 4};
    tu_fill(data, BIG_BYTES, v, 1);
    wsync_tensor_t w = tu_tensor("big", data, shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&w, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(t->snd, &c, req));
}

/* An engine holding the key that leases every chunk and never gives the leases back (issue 37:
 * the trainer's memory grew to 566 MB against 106 MB after 16 versions) holds at most
 * kLeasesPerChunk (4) leases on a chunk, the fifth refused with WRONG_STATE naming the bound,
 * and its leases end when the chunk's version is no longer kept (keep_versions 2): its fetch
 * of such a chunk is refused with ABANDONED and no byte, and the trainer's resident memory
 * stays within a few chunks over 12 versions of 4 MiB (it grew by a chunk a version before).
 * The honest engine loads every version bit for bit and every flush is OK. */
static void leases_are_capped_and_end_when_their_version_is_no_longer_kept(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 2);
    wsync_receiver_t *e0 = engine(&t, 0);
    struct rogue a;
    rogue_start(&a, &t);
    uint8_t ck[32];
    const uint64_t token = rnd64();
    keyed_attach(&a, &t, 1, token, ck);
    uint8_t *data = malloc(BIG_BYTES);
    assert_non_null(data);
    uint8_t out[4096];
    uint64_t number = 0, first_seq = 0;
    long rss_early = 0;
    for (uint64_t v = 1; v <= 12; ++v) {
        wsync_blob_t req;
        send_big(&t, data, v, &req);
        const uint64_t seq = blob_uint(&req, "seq");
        if (v == 1) first_seq = seq;
        for (int i = 0; i < 5; ++i) {
            struct msg lease = {LEASE, 1, token, ++number, seq, {0}, NULL, 0, 0, 0, 0};
            rogue_send(&a, 1, out, seal(&lease, ck, out));
            assert_true(rogue_await(&a));
            assert_int_equal(a.last[2], GRANT);
            if (i < 4) {
                assert_int_equal(last_status(&a), 0);
            } else {
                assert_int_equal(last_status(&a), WSYNC_ERR_WRONG_STATE);
                assert_true(last_says(&a, "leases on chunk seq"));
            }
        }
        /* One acknowledgement (the flush then waits for nobody); three leases stay held. */
        struct msg ack = {ACK, 1, token, ++number, seq, {0}, NULL, 0, v, 0, 0};
        rogue_send(&a, 1, out, seal(&ack, ck, out));
        wsync_recv_t *it = NULL;
        OK(wsync_receiver_receive(e0, req.data, req.size, &it));
        wsync_tensor_t view;
        bool has = false;
        OK(wsync_recv_next(it, &view, &has));
        assert_true(has);
        assert_true(tu_check(view.data, BIG_BYTES, v, 1));
        OK(wsync_recv_end(it));
        OK(wsync_sender_flush(t.snd, 3000));
        wsync_blob_free(&req);
        if (v == 3) rss_early = rss_kib();
    }
    const long grew = rss_kib() - rss_early;
    print_message("trainer RSS grew by %ld KiB from version 3 to 12 (a chunk is %d KiB)\n", grew, BIG_BYTES / 1024);
    assert_true(grew < 6 * (BIG_BYTES / 1024));
    struct msg f = {FETCH, 1, token, ++number, first_seq, {0}, NULL, 0, 1, 0, 4096};
    rogue_send(&a, 1, out, seal(&f, ck, out));
    assert_int_equal(rogue_listen(&a), 1);
    assert_int_equal(a.last[2], DATA);
    assert_int_equal(last_status(&a), WSYNC_ERR_ABANDONED);
    assert_true(last_says(&a, "is no longer kept"));
    assert_int_equal(a.payload_len, 0);
    rogue_stop(&a);
    free(data);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* A flooder: a rogue of its own on a thread, sending forged control messages (a Fetch of
 * receiver 0 with a made-up token, MACed with a key of its own) as fast as the link takes them
 * until told to stop. */
struct flood {
    const struct trainer *t;
    volatile int stop;
    long sent;
};

static void *flood_run(void *arg) {
    struct flood *f = arg;
    struct rogue r;
    rogue_start(&r, f->t);
    uint8_t bad[32], out[4096];
    memset(bad, 0x5a, sizeof bad);
    struct msg m = {FETCH, 0, rnd64(), 1, 1, {0}, NULL, 0, 1, 0, 4096};
    const size_t n = seal(&m, bad, out);
    ucp_request_param_t p = {0};
    while (!f->stop) {
        void *req = ucp_am_send_nbx(r.ep, 1, NULL, 0, out, n, &p);
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS && !f->stop) ucp_worker_progress(r.w);
            ucp_request_free(req);
        } else if (UCS_PTR_IS_ERR(req)) {
            break;
        }
        ++f->sent;
        if ((f->sent & 63) == 0) {  /* the link's pace, sharing the CPU with the trainer */
            ucp_worker_progress(r.w);
            sched_yield();
        }
    }
    rogue_stop(&r);
    return NULL;
}

/* A flood of forged messages cannot crowd out an honest engine: each is dropped as it arrives
 * (its MAC checked at the door), not queued in the trainer's inbox, whose 65536 places a round
 * it filled ahead of the honest engine's messages; and a round of progress is bounded, so the
 * trainer handles what arrived while the flood goes on. The honest engine loads 5 versions
 * during the flood, each flush OK within its 3 s. */
static void a_flood_of_forged_messages_does_not_crowd_out_an_honest_engine(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 1);
    wsync_receiver_t *e0 = engine(&t, 0);
    struct flood f = {&t, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, flood_run, &f), 0);
    while (f.sent < 200000) usleep(1000);
    for (uint64_t v = 1; v <= 5; ++v) honest_version_loads(&t, e0, v);
    f.stop = 1;
    pthread_join(th, NULL);
    print_message("the flood sent %ld forged messages\n", f.sent);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* The child's part (this program run again with EXIT_CHILD_ARG and the round): a trainer, a
 * flood, and exit(0) mid-flood. 77: no UCX here. */
#define EXIT_CHILD_ARG "--exit-while-serving"
static int exit_while_serving(int round) {
    if (!tu_kind_here("ucx", "{" OPTS "}")) return 77;
    static struct trainer t;
    trainer_start(&t, 1);
    static struct flood f;
    f.t = &t;
    pthread_t th;
    if (pthread_create(&th, NULL, flood_run, &f) != 0) return 3;
    while (f.sent < 2000 + 500 * round) usleep(200);
    exit(0); /* the trainer and the flood still running */
}

/* A process may end with a trainer still serving: a caller that returns from main (or calls
 * exit) without destroying its sender, as an interpreter at shutdown may. Its serving thread
 * goes on through exit handlers and static destructors, checking each message's MAC: it must
 * find nothing freed under it. In one CI run (a test failed with its trainer up) it read
 * libwsync's table of UCX functions after its static destructor had freed it, and OpenSSL's
 * locks after OpenSSL's exit handler (SIGSEGV in CRYPTO_THREAD_read_lock); this reproduced
 * both in the sanitizer build on the first round. Here a child process starts a trainer, floods
 * it with forged messages (each costs the trainer one MAC) and calls exit(0) mid-flood, 20
 * times: each child exits with status 0 within 10 s (in the sanitizer build: no report). */
static void a_process_that_exits_while_its_trainer_checks_macs_exits_cleanly(void **state) {
    (void)state;
    /* The child is this program anew (no state inherited), with leak checking off: it ends
     * without tearing down on purpose; any other sanitizer report still fails it. */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", asan ? asan : "", asan && *asan ? ":" : "");
    for (int round = 0; round < 20; ++round) {
        fflush(NULL);
        const pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char r[16];
            snprintf(r, sizeof r, "%d", round);
            setenv("ASAN_OPTIONS", opts, 1);
            execl("/proc/self/exe", "test_ucx_trust", EXIT_CHILD_ARG, r, (char *)NULL);
            _exit(4);
        }
        int st = 0;
        const long t0 = tu_now_ms();
        pid_t got = 0;
        while ((got = waitpid(pid, &st, WNOHANG)) == 0 && tu_now_ms() - t0 < 10000) usleep(2000);
        if (got == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("round %d: the child did not finish exiting within 10 s", round);
        }
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77) skip();
        if (WIFSIGNALED(st)) fail_msg("round %d: the child died of signal %d while exiting", round, WTERMSIG(st));
        if (WEXITSTATUS(st) != 0) fail_msg("round %d: the child exited with status %d", round, WEXITSTATUS(st));
    }
}

/* A puller: a rogue holding the key at index 1, on a thread, that leases each chunk the test
 * publishes (acknowledging it at once, so no flush waits for it, and keeping a second lease)
 * and fetches the whole chunk over and over, up to PULL_WINDOW fetches outstanding, receiving
 * every rendezvous payload into a scratch buffer as an engine would: legal fetches only. */
enum { PULL_WINDOW = 64 };
struct puller {
    struct rogue r;
    uint8_t ck[32];
    uint64_t token, number;
    volatile uint64_t seq;  /* the chunk to pull (0: none yet) */
    volatile int stop;
    long data;              /* Data messages that reached it */
    long refused;           /* of them, refusals naming WRONG_STATE (no payload) */
    long received;          /* payload bytes received */
    volatile long receiving; /* receives started and not finished */
    uint8_t *scratch;
};

static void puller_received(void *req, ucs_status_t st, size_t n, void *arg) {
    struct puller *p = arg;
    if (st == UCS_OK) p->received += (long)n;
    --p->receiving;
    ucp_request_free(req);
}

static ucs_status_t puller_on_data(void *arg, const void *h, size_t hl, void *data, size_t n,
                                   const ucp_am_recv_param_t *param) {
    struct puller *p = arg;
    ++p->data;
    if (hl > STATUS_AT + 1) {
        const uint8_t *b = h;
        if ((b[STATUS_AT] | b[STATUS_AT + 1] << 8) == WSYNC_ERR_WRONG_STATE) ++p->refused;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) return UCS_OK;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                              .cb.recv_am = puller_received, .user_data = p};
    void *req = ucp_am_recv_data_nbx(p->r.w, data, p->scratch, n < BIG_BYTES ? n : BIG_BYTES, &rp);
    if (UCS_PTR_IS_PTR(req)) ++p->receiving;
    else if (!UCS_PTR_IS_ERR(req)) p->received += (long)n;
    return UCS_INPROGRESS;
}

static void puller_send(struct puller *p, int type, uint64_t seq, uint64_t bytes) {
    static uint8_t out[4096];
    struct msg m = {type, 1, p->token, ++p->number, seq, {0}, NULL, 0, type == ACK ? 0 : p->number, 0, bytes};
    ucp_request_param_t rp = {0};
    void *req = ucp_am_send_nbx(p->r.ep, 1, NULL, 0, out, seal(&m, p->ck, out), &rp);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && !p->stop) ucp_worker_progress(p->r.w);
        ucp_request_free(req);
    }
}

static void *puller_run(void *arg) {
    struct puller *p = arg;
    uint64_t leased = 0;
    long fetched = 0;
    while (!p->stop) {
        ucp_worker_progress(p->r.w);
        const uint64_t seq = p->seq;
        if (seq && seq != leased) {
            puller_send(p, LEASE, seq, 0);
            puller_send(p, LEASE, seq, 0);
            puller_send(p, ACK, seq, 0);
            leased = seq;
        }
        if (leased && fetched - p->data < PULL_WINDOW) {
            puller_send(p, FETCH, leased, BIG_BYTES);
            ++fetched;
        }
    }
    /* Stopped: what it asked for arrives, or 3 s pass, before its worker goes. */
    const long t0 = tu_now_ms();
    while ((fetched > p->data || p->receiving > 0) && tu_now_ms() - t0 < 3000) ucp_worker_progress(p->r.w);
    return NULL;
}

/* Engine e0 loads version v of the 4 MiB tensor from req bit for bit, and the trainer's flush
 * is OK within deadline_ms. */
static void big_version_loads(struct trainer *t, wsync_receiver_t *e0, const wsync_blob_t *req, uint64_t v,
                              int64_t deadline_ms) {
    take_tensor(e0, req, BIG_BYTES, v, 1);
    const long f0 = tu_now_ms();
    OK(wsync_sender_flush(t->snd, deadline_ms));
    assert_true(tu_now_ms() - f0 < deadline_ms);
}

/* Honest engine e0 loads `versions` 4 MiB versions (bit for bit, each flush OK within 3 s, or
 * 10 s while the puller's thread runs and acknowledges for index 1);
 * returns the milliseconds they took. Index 1 leases and acknowledges each chunk: the puller's
 * thread does if it runs (p->seq), else this thread for it, so no flush waits for index 1. */
static long honest_big_versions(struct trainer *t, wsync_receiver_t *e0, uint8_t *data, uint64_t *v,
                                int versions, struct puller *p, int puller_runs) {
    const long t0 = tu_now_ms();
    for (int i = 0; i < versions; ++i) {
        wsync_blob_t req;
        send_big(t, data, ++*v, &req);
        const uint64_t seq = blob_uint(&req, "seq");
        if (puller_runs) {
            p->seq = seq;
        } else {
            puller_send(p, LEASE, seq, 0);
            puller_send(p, ACK, seq, 0);
        }
        /* The flush also waits for the puller's acknowledgement, which its thread sends
         * between its own receives: with it running, 10 s (3 s failed once in the sanitizer
         * build on a loaded host, the honest engine's version long loaded). */
        big_version_loads(t, e0, &req, *v, puller_runs ? 10000 : 3000);
        wsync_blob_free(&req);
    }
    return tu_now_ms() - t0;
}

static void puller_start(struct puller *p, struct trainer *t) {
    memset(p, 0, sizeof *p);
    rogue_start(&p->r, t);
    p->token = rnd64();
    keyed_attach(&p->r, t, 1, p->token, p->ck);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = 2, .cb = puller_on_data, .arg = p};
    assert_int_equal(ucp_worker_set_am_recv_handler(p->r.w, &hp), UCS_OK);
    p->scratch = malloc(BIG_BYTES);
    assert_non_null(p->scratch);
}

/* The rig of the bounded-service tests: a trainer of 2 receivers, honest engine e0 at index 0,
 * the puller attached at index 1 (not running), and a 4 MiB buffer for the versions' data. */
static uint8_t *big_rig_start(struct trainer *t, wsync_receiver_t **e0, struct puller *p) {
    trainer_start(t, 2);
    *e0 = engine(t, 0);
    puller_start(p, t);
    uint8_t *data = malloc(BIG_BYTES);
    assert_non_null(data);
    return data;
}

static void big_rig_stop(struct trainer *t, wsync_receiver_t *e0, struct puller *p, uint8_t *data) {
    rogue_stop(&p->r);
    free(p->scratch);
    free(data);
    wsync_receiver_destroy(e0);
    trainer_stop(t);
}

/* Fair service (issue 37 item 3): an engine holding the key that fetches its own leased chunk
 * in a loop, PULL_WINDOW fetches outstanding, cannot starve an honest engine pulling one fetch
 * at a time: during the loop each of the honest engine's versions loads bit for bit with the
 * flush OK within 10 s (it waits for the puller's acknowledgement too), and the loop did pull
 * (at least 4 chunks). The slowdown against the same versions loaded alone, in the same test,
 * is printed, not asserted: on a loaded 2-core
 * CI host it ranged 2.3x-9x, a scheduling figure rather than a property (an equal share of the
 * trainer would be about 2x). What bounds a greedy engine by construction, at most 4 payloads
 * in flight and 64 waiting, is asserted by the next test and by the 65th fetch's refusal. */
/* The trainer sends version v of the big model (*req, freed by the caller); the puller leases
 * its chunk and asks for `fetches` fetches of the whole chunk without reading any. Returns the
 * chunk's seq. */
static uint64_t puller_lease_and_fetch(struct trainer *t, struct puller *p, uint8_t *data, uint64_t v,
                                       wsync_blob_t *req, int fetches) {
    send_big(t, data, v, req);
    const uint64_t seq = blob_uint(req, "seq");
    puller_send(p, LEASE, seq, 0);
    for (int i = 0; i < fetches; ++i) puller_send(p, FETCH, seq, BIG_BYTES);
    return seq;
}

static void an_engine_fetching_in_a_loop_does_not_starve_another(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    wsync_receiver_t *e0;
    static struct puller p;
    uint8_t *data = big_rig_start(&t, &e0, &p);
    uint64_t v = 0;
    honest_big_versions(&t, e0, data, &v, 2, &p, 0);  /* buffers faulted in */
    const long alone = honest_big_versions(&t, e0, data, &v, 6, &p, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, puller_run, &p), 0);
    const long during = honest_big_versions(&t, e0, data, &v, 6, &p, 1);
    p.stop = 1;
    pthread_join(th, NULL);
    print_message("6 honest versions of 4 MiB: %ld ms alone, %ld ms while index 1 pulled %ld MiB in %ld Data "
                  "messages (%.1fx)\n", alone, during, p.received >> 20, p.data, (double)during / (alone ? alone : 1));
    assert_true(p.received >= 4L * BIG_BYTES);  /* the loop did pull */
    big_rig_stop(&t, e0, &p, data);
}

/* Bounded per engine (issue 37 item 3): the trainer has at most 4 payloads being sent to one
 * engine (kFetchesInFlight); its further fetches wait their turn (at most 64), served
 * round-robin with other engines' as payloads complete. A peer holding the key that leases
 * each version's chunk and asks for 16 fetches of it but never reads its connection therefore
 * holds at most 4 sends, of one chunk: from version 3 to 12 (9 versions of 4 MiB) the test
 * process's resident memory grows by less than 6 chunks (before, every fetch became a send,
 * each send kept its chunk's buffer from going back to the pool, and the trainer grew by a
 * chunk a version: 37 MB over 10 versions). Measured with the bound: 0-1 chunk in the release
 * build, 3 in one CI run of the sanitizer build (whose allocator keeps freed blocks for a
 * while); a bound of 3 chunks failed that run by 12 KiB. The honest engine loads every version
 * bit for bit with each flush OK within 3 s. */
static void a_peer_that_asks_and_never_reads_holds_at_most_four_sends(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    wsync_receiver_t *e0;
    static struct puller p;
    uint8_t *data = big_rig_start(&t, &e0, &p);
    long rss_early = 0;
    for (uint64_t v = 1; v <= 12; ++v) {
        wsync_blob_t req;
        puller_send(&p, ACK, puller_lease_and_fetch(&t, &p, data, v, &req, 16), 0);
        big_version_loads(&t, e0, &req, v, 3000);
        wsync_blob_free(&req);
        if (v == 3) rss_early = rss_kib();
    }
    const long grew = rss_kib() - rss_early;
    print_message("trainer RSS grew by %ld KiB from version 3 to 12 while a peer asked for 16 fetches a "
                  "version and read none (a chunk is %d KiB)\n", grew, BIG_BYTES / 1024);
    assert_true(grew < 6 * (BIG_BYTES / 1024));
    big_rig_stop(&t, e0, &p, data);
}

/* Bounded waiting (issue 37 item 3): one receiver has at most kFetchesQueued (64) fetches
 * waiting and kFetchesInFlight (4) payloads being sent. A peer holding the key that leases a
 * chunk and sends 200 fetches of it before reading anything gets every fetch answered within
 * 10 s: payloads for those the trainer queued, and for the rest a refusal naming
 * WRONG_STATE with no payload. Refusals come (at least one; before the queue had a bound,
 * none came and each fetch became a send), and only past the bound: at least 64 fetches are
 * answered with their payload (64 to 68 by how far the trainer got sending while they arrived).
 * The honest engine then loads the next version. */
static void a_receivers_fetches_past_sixty_four_waiting_are_refused(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    wsync_receiver_t *e0;
    static struct puller p;
    uint8_t *data = big_rig_start(&t, &e0, &p);
    uint64_t v = 0;
    wsync_blob_t req;
    enum { ASKED = 200 };
    const uint64_t seq = puller_lease_and_fetch(&t, &p, data, ++v, &req, ASKED);
    const long t0 = tu_now_ms();
    while ((p.data < ASKED || p.receiving > 0) && tu_now_ms() - t0 < 10000) ucp_worker_progress(p.r.w);
    print_message("%d fetches sent before reading: %ld answered, %ld refused, %ld MiB received\n", ASKED, p.data,
                  p.refused, p.received >> 20);
    assert_int_equal(p.data, ASKED);
    assert_true(p.refused >= 1);
    assert_true(ASKED - p.refused >= 64);
    assert_int_equal(p.received, (long)(ASKED - p.refused) * BIG_BYTES);
    puller_send(&p, ACK, seq, 0);
    big_version_loads(&t, e0, &req, v, 3000);
    wsync_blob_free(&req);
    honest_big_versions(&t, e0, data, &v, 1, &p, 0);
    big_rig_stop(&t, e0, &p, data);
}

/* A dropped index is not retaken by a peer holding only a request blob (issue 37: such a peer
 * took every free index and won it back after each drop). While the trainer drops engine 1 and
 * a new engine re-attaches there, the rogue sends hellos for index 1 with the request's
 * session, its own address and MACs made with what a request holds (its bytes as a key, a
 * zero key): none is answered, the new engine attaches, and both engines load the next
 * version with the flush OK. */
static void a_dropped_index_is_not_retaken_by_a_peer_holding_a_request_only(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    trainer_start(&t, 2);
    wsync_receiver_t *e0 = engine(&t, 0), *e1 = engine(&t, 1);
    wsync_blob_t req;
    send_version(&t, 1, &req);
    take(e0, &req, 1);
    take(e1, &req, 1);
    OK(wsync_sender_flush(t.snd, 3000));
    const uint64_t session = blob_uint(&req, "session");
    struct rogue r;
    rogue_start(&r, &t);
    static uint8_t addr[65536], out[70000];
    const size_t alen = rogue_address(&r, addr, sizeof addr);
    uint8_t keys[2][32] = {{0}};
    memcpy(keys[1], req.data + req.size - 32, 32);
    OK(wsync_sender_drop_receiver(t.snd, 1));
    for (int i = 0; i < 20; ++i) {
        struct msg h = {HELLO, 1, rnd64(), 0, session, {0}, addr, alen, 0, 0, 0};
        for (int k = 0; k < 16; ++k) h.nonce[k] = (uint8_t)rand();
        rogue_send(&r, 1, out, seal(&h, keys[i & 1], out));
    }
    wsync_receiver_t *e1b = engine(&t, 1);  /* the index is free for an engine with the key */
    assert_int_equal(rogue_listen(&r), 0);
    rogue_stop(&r);
    wsync_receiver_destroy(e1);
    wsync_blob_free(&req);
    send_version(&t, 2, &req);
    take(e0, &req, 2);
    take(e1b, &req, 2);
    OK(wsync_sender_flush(t.snd, 3000));
    wsync_blob_free(&req);
    wsync_receiver_destroy(e1b);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* The kind listens only where it is told (issue 37: by default it listened on every interface):
 * without "net_devices" the strategy is refused, naming the option and "all"; "all" says it. */
static void without_net_devices_the_kind_refuses_to_start_unless_told_all(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    wsync_strategy_t *s = NULL;
    EXPECT_ERR(wsync_strategy_create("ucx", "{\"transports\":\"tcp\"}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "option 'net_devices' is not set");
    assert_null(s);
    assert_non_null(strstr(wsync_last_error(), "\"all\" to listen on every interface"));
    EXPECT_ERR(wsync_strategy_create("ucx", "{\"transports\":\"tcp\",\"net_devices\":\"\"}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "'net_devices'");
    OK(wsync_strategy_create("ucx", "{\"transports\":\"tcp\",\"net_devices\":\"all\",\"receivers\":1}", &s));
    wsync_blob_t init = {0};
    OK(wsync_strategy_create_init_info(s, &init));
    wsync_blob_free(&init);
    wsync_strategy_destroy(s);
}

/* ---- the data stream (src/transport/ucx/stream.hpp) ------------------------------------------ */

/* The TCP ports this process listens on (from /proc/net/tcp and its own descriptors): UCX's
 * and, over tcp with "data_path" "auto", the trainer's data stream. */
static int listening_ports(int *ports, int cap) {
    unsigned long inodes[512];
    int ni = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) && ni < 512) {
        char path[300], link[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = 0;
        unsigned long ino;
        if (sscanf(link, "socket:[%lu]", &ino) == 1) inodes[ni++] = ino;
    }
    if (d) closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    int np = 0;
    while (f && fgets(line, sizeof line, f) && np < cap) {
        unsigned port, st;
        unsigned long ino;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %lu", &port, &st, &ino) != 3) continue;
        if (st != 0x0A) continue; /* LISTEN */
        for (int i = 0; i < ni; ++i)
            if (inodes[i] == ino) ports[np++] = (int)port;
    }
    if (f) fclose(f);
    return np;
}

static int connect_lo(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Reads what fd says within ms (until it closes): the byte count, -1 if it stayed open. */
static int read_until_closed(int fd, uint8_t *buf, int cap, int ms) {
    int got = 0;
    for (long t0 = tu_now_ms(); tu_now_ms() - t0 < ms;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, buf + got, (size_t)(cap - got), 0);
        if (n <= 0) return got;
        got += (int)n;
        if (got == cap) return got;
    }
    return -1;
}

/* The ports this process began to listen on between `before` (n of them) and now: 0 if none,
 * -1 if several. */
static int new_port(const int *before, int n) {
    int now[64], found = 0;
    const int m = listening_ports(now, 64);
    for (int i = 0; i < m; ++i) {
        int old = 0;
        for (int k = 0; k < n; ++k) old |= before[k] == now[i];
        if (!old) found = found ? -1 : now[i];
    }
    return found;
}

/* The trainer's data stream port: the one listener its sender adds to its UCX worker's (the
 * init info's), or 0 when it offers none. */
static int sender_with_stream(struct trainer *t, const char *options) {
    OK(wsync_strategy_create("ucx", options, &t->s));
    OK(wsync_strategy_create_init_info(t->s, &t->init));
    int before[64];
    const int n = listening_ports(before, 64);
    OK(wsync_sender_create(t->s, t->init.data, t->init.size, &t->snd));
    const int port = new_port(before, n);
    assert_true(port >= 0);
    return port;
}

/* A connection to the data stream that does not prove the connection's key gets the trainer's
 * nonce and nothing else, and is closed: a wrong proof at once, silence within 2 s (kProofMs),
 * a proof made for another nonce too. Meanwhile the honest engine's versions load. */
static void a_stream_connection_without_the_key_gets_a_nonce_and_is_closed(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    const int port = sender_with_stream(&t, "{" OPTS ",\"receivers\":2}");
    assert_true(port > 0);
    wsync_receiver_t *e0 = engine(&t, 0);
    uint8_t buf[256];

    int fd;
    for (uint32_t index = 0; index < 2; ++index) { /* a wrong proof for index 0 (attached) and 1 (not) */
        fd = connect_lo(port);
        assert_int_equal(read_until_closed(fd, buf, 16, 1000), 16); /* the nonce */
        uint8_t proof[56] = {'W', 'S', 'D', '1'};
        memcpy(proof + 4, &index, 4);
        for (int i = 8; i < 56; ++i) proof[i] = (uint8_t)rand();
        assert_int_equal(send(fd, proof, sizeof proof, MSG_NOSIGNAL), (ssize_t)sizeof proof);
        const long t0 = tu_now_ms();
        assert_int_equal(read_until_closed(fd, buf, sizeof buf, 1500), 0); /* closed, nothing said */
        assert_true(tu_now_ms() - t0 < 1000);
        close(fd);
    }
    fd = connect_lo(port); /* silence */
    long t0 = tu_now_ms();
    assert_int_equal(read_until_closed(fd, buf, sizeof buf, 4000), 16);
    assert_true(tu_now_ms() - t0 >= 1500 && tu_now_ms() - t0 < 3500);
    close(fd);
    fd = connect_lo(port); /* garbage longer than a proof */
    assert_int_equal(read_until_closed(fd, buf, 16, 1000), 16);
    memset(buf, 0x5a, sizeof buf);
    (void)send(fd, buf, sizeof buf, MSG_NOSIGNAL);
    assert_true(read_until_closed(fd, buf, sizeof buf, 1500) == 0);
    close(fd);
    honest_version_loads(&t, e0, 1);
    honest_version_loads(&t, e0, 2);
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* 200 connections to the data stream at once: at most 64 wait for a proof (kMaxHalfOpen), the
 * rest are closed at accept without a nonce; the honest engine's versions load during it, and
 * every one is closed within 2 s and a margin. */
static void a_flood_of_stream_connections_is_bounded_and_does_not_stop_an_honest_engine(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    const int port = sender_with_stream(&t, "{" OPTS ",\"receivers\":1}");
    assert_true(port > 0);
    wsync_receiver_t *e0 = engine(&t, 0);
    enum { N = 200 };
    int fds[N];
    const long t0 = tu_now_ms();
    for (int i = 0; i < N; ++i) fds[i] = connect_lo(port);
    /* The connections holding a nonce at one moment, before the first could have been closed
     * for silence (2 s, kProofMs) and its place given to a later one: at most 64 wait at once.
     * (Counted over time, more get a nonce as the first ones are closed.) */
    usleep(300 * 1000);
    int nonces = 0;
    uint8_t buf[64];
    for (int i = 0; i < N; ++i) nonces += recv(fds[i], buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT) == 16;
    assert_true(tu_now_ms() - t0 < 2000);
    assert_true(nonces <= 64);
    assert_true(nonces >= 1);
    honest_version_loads(&t, e0, 1);
    honest_version_loads(&t, e0, 2);
    for (int i = 0; i < N; ++i) {
        /* every one closed in its turn: 64 at a time, each after 2 s of silence */
        assert_true(read_until_closed(fds[i], buf, sizeof buf, 3500) >= 0);
        close(fds[i]);
    }
    wsync_receiver_destroy(e0);
    trainer_stop(&t);
}

/* With "data_path" "ucx" no stream is offered or listened for: Data travel as UCX active
 * messages, bit for bit. Nor with "net_devices" "all": the stream never listens on every
 * interface, and there is no one device to listen on. */
static void with_data_path_ucx_or_net_devices_all_no_stream_listens_and_versions_still_load(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    struct trainer t;
    assert_int_equal(sender_with_stream(&t, "{" OPTS ",\"receivers\":1,\"data_path\":\"ucx\"}"), 0);
    wsync_receiver_t *e0 = engine(&t, 0);
    honest_version_loads(&t, e0, 1);
    wsync_strategy_t *s = NULL;
    assert_int_equal(wsync_strategy_create("ucx", "{" OPTS ",\"data_path\":\"sockets\"}", &s), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "data_path"));
    wsync_receiver_destroy(e0);
    trainer_stop(&t);

    struct trainer all;
    assert_int_equal(sender_with_stream(&all, "{\"transports\":\"tcp\",\"net_devices\":\"all\",\"timeout_ms\":3000,"
                                              "\"receivers\":1}"), 0);
    wsync_receiver_t *e1 = engine(&all, 0);
    honest_version_loads(&all, e1, 1);
    wsync_receiver_destroy(e1);
    trainer_stop(&all);
}

int main(int argc, char **argv) {
    srand((unsigned)tu_now_ms());
    if (argc == 3 && strcmp(argv[1], EXIT_CHILD_ARG) == 0) return exit_while_serving(atoi(argv[2]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_peer_without_the_key_is_not_answered_and_takes_no_index),
        cmocka_unit_test(a_replayed_hello_and_forged_or_replayed_messages_are_dropped),
        cmocka_unit_test(unknown_ids_and_malformed_messages_are_dropped),
        cmocka_unit_test(fetches_without_a_lease_or_past_a_chunks_end_are_refused_without_a_byte),
        cmocka_unit_test(an_arena_chunk_is_served_to_no_peer_once_the_flush_returned),
        cmocka_unit_test(the_key_is_in_the_init_info_only_and_an_older_init_info_is_refused_by_name),
        cmocka_unit_test(a_description_of_the_init_info_shows_the_keys_length_not_the_key),
        cmocka_unit_test(leases_are_capped_and_end_when_their_version_is_no_longer_kept),
        cmocka_unit_test(a_flood_of_forged_messages_does_not_crowd_out_an_honest_engine),
        cmocka_unit_test(a_process_that_exits_while_its_trainer_checks_macs_exits_cleanly),
        cmocka_unit_test(an_engine_fetching_in_a_loop_does_not_starve_another),
        cmocka_unit_test(a_peer_that_asks_and_never_reads_holds_at_most_four_sends),
        cmocka_unit_test(a_receivers_fetches_past_sixty_four_waiting_are_refused),
        cmocka_unit_test(a_dropped_index_is_not_retaken_by_a_peer_holding_a_request_only),
        cmocka_unit_test(without_net_devices_the_kind_refuses_to_start_unless_told_all),
        cmocka_unit_test(a_stream_connection_without_the_key_gets_a_nonce_and_is_closed),
        cmocka_unit_test(a_flood_of_stream_connections_is_bounded_and_does_not_stop_an_honest_engine),
        cmocka_unit_test(with_data_path_ucx_or_net_devices_all_no_stream_listens_and_versions_still_load),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
