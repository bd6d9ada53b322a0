/* wsync_recv_patch (docs/delta.md, "Patches as indices and values"): a trainer with delta sync and
 * an engine in this process that takes every patch as flat indices and values and applies it
 * itself, as vLLM's sparse loader would. The indices and values must be exactly the elements
 * whose bits the trainer changed (random changes, -0.0 vs 0.0, NaN payloads), and the call must
 * refuse, by name, a patch against another version, a dense entry, and patch bytes whose indices
 * were corrupted in the shared segment. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "testutil.h"

#define NT 6
static const char *kNames[NT] = {"f32.1000", "bf16.33x17", "f64.77", "u8.301", "c128.9", "i16x3.40"};
static const uint8_t kCode[NT] = {WSYNC_DTYPE_FLOAT, WSYNC_DTYPE_BFLOAT, WSYNC_DTYPE_FLOAT,
                                  WSYNC_DTYPE_UINT,  WSYNC_DTYPE_COMPLEX, WSYNC_DTYPE_INT};
static const uint8_t kBits[NT] = {32, 16, 64, 8, 128, 16};
static const uint16_t kLanes[NT] = {1, 1, 1, 1, 1, 3};
static const int32_t kNdim[NT] = {1, 2, 1, 1, 1, 1};
static const int64_t kShapes[NT][2] = {{1000, 0}, {33, 17}, {77, 0}, {301, 0}, {9, 0}, {40, 0}};

typedef struct {
    uint8_t *data[NT], *prev[NT], *engine[NT];
    size_t bytes[NT], esize[NT], elems[NT];
    int64_t shape[NT][2];
    wsync_tensor_t t[NT];
} model_t;

static uint64_t rnd(uint64_t *s) { return *s = tu_splitmix(*s); }

static void model_init(model_t *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < NT; ++i) {
        size_t elems = 1;
        for (int d = 0; d < kNdim[i]; ++d) elems *= (size_t)kShapes[i][d], m->shape[i][d] = kShapes[i][d];
        m->esize[i] = (size_t)kBits[i] * kLanes[i] / 8;
        m->elems[i] = elems;
        m->bytes[i] = elems * m->esize[i];
        m->data[i] = aligned_alloc(64, (m->bytes[i] + 63) / 64 * 64);
        m->prev[i] = malloc(m->bytes[i]);
        m->engine[i] = calloc(1, m->bytes[i]);
        tu_fill(m->data[i], m->bytes[i], seed, (uint64_t)i);
        for (size_t e = 0; e < elems; e += 7) memset(m->data[i] + e * m->esize[i], 0, m->esize[i]);
        m->t[i] = tu_tensor(kNames[i], m->data[i], m->shape[i], kNdim[i], kCode[i], kBits[i]);
        m->t[i].dtype.lanes = kLanes[i];
    }
    /* f32: element 1 a quiet NaN with payload 1 (it becomes payload 2 in version 2) */
    uint32_t nan1 = 0x7fc00001u;
    memcpy(m->data[0] + 4, &nan1, 4);
}

static void model_free(model_t *m) {
    for (int i = 0; i < NT; ++i) free(m->data[i]), free(m->prev[i]), free(m->engine[i]);
}

/* A change a float compare would miss or mangle, or random bits. */
static void change_element(uint8_t *p, size_t es, uint64_t r) {
    switch (r % 3) {
    case 0:
        for (size_t b = 0; b < es; ++b) p[b] ^= (uint8_t)(tu_splitmix(r + b) | 1);
        break;
    case 1: /* the sign bit: 0.0 <-> -0.0 for the zeros */
        p[es - 1] ^= 0x80;
        break;
    default: /* a NaN of another payload where the element is 4 or 2 bytes */
        if (es == 4) {
            uint32_t nan = 0x7f800000u | (uint32_t)(r >> 41 | 1);
            memcpy(p, &nan, 4);
        } else if (es == 2) {
            uint16_t nan = (uint16_t)(0x7f80u | (r >> 58 | 1));
            memcpy(p, &nan, 2);
        } else {
            p[0] ^= 0x5a;
        }
    }
}

static void mutate(model_t *m, uint64_t *seed, int version) {
    for (int i = 0; i < NT; ++i) {
        memcpy(m->prev[i], m->data[i], m->bytes[i]);
        size_t es = m->esize[i], n = m->elems[i];
        switch (rnd(seed) % 4) {
        case 0: break; /* unchanged: an empty patch */
        case 1: change_element(m->data[i] + rnd(seed) % n * es, es, rnd(seed)); break;
        default:
            for (size_t e = 0; e < n; ++e)
                if (rnd(seed) % 100 < 3) change_element(m->data[i] + e * es, es, rnd(seed));
        }
    }
    if (version == 2) { /* the f32 tensor: 0.0 -> -0.0 at element 0, NaN payload 1 -> 2 at 1 */
        uint32_t negzero = 0x80000000u, nan2 = 0x7fc00002u;
        memcpy(m->data[0], &negzero, 4);
        memcpy(m->data[0] + 4, &nan2, 4);
    }
}

typedef struct {
    wsync_strategy_t *s, *rs;
    wsync_blob_t init;
    wsync_sender_t *snd;
    wsync_receiver_t *r;
    uint8_t *seg; /* the shared segment mapped writable here (corruption tests), or NULL */
    size_t seg_bytes;
} rig_t;

static void rig_open(rig_t *g, const char *options, int map_segment) {
    memset(g, 0, sizeof *g);
    OK(wsync_strategy_create("shm", options, &g->s));
    OK(wsync_strategy_create_init_info(g->s, &g->init));
    OK(wsync_sender_create(g->s, g->init.data, g->init.size, &g->snd));
    if (map_segment) { /* before the receiver attaches: its name is removed once every one has */
        char *json;
        OK(wsync_blob_describe(g->init.data, g->init.size, &json));
        const char *p = strstr(json, "\"/wsync-");
        assert_non_null(p);
        char name[128];
        size_t n = (size_t)(strchr(p + 1, '"') - p - 1);
        assert_true(n < sizeof name);
        memcpy(name, p + 1, n);
        name[n] = '\0';
        wsync_string_free(json);
        int fd = shm_open(name, O_RDWR, 0);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        g->seg_bytes = (size_t)st.st_size;
        g->seg = mmap(NULL, g->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(g->seg != MAP_FAILED);
        close(fd);
    }
    OK(wsync_strategy_create("shm", NULL, &g->rs));
    OK(wsync_receiver_create(g->rs, g->init.data, g->init.size, 0, &g->r));
}

static void rig_close(rig_t *g) {
    if (g->seg) munmap(g->seg, g->seg_bytes);
    wsync_receiver_destroy(g->r);
    wsync_sender_destroy(g->snd);
    wsync_strategy_destroy(g->rs);
    wsync_strategy_destroy(g->s);
    wsync_blob_free(&g->init);
}

static wsync_recv_t *send_and_receive(rig_t *g, const wsync_tensor_t *t, size_t n) {
    wsync_chunk_t ch = tu_chunk(t, n, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(g->snd, &ch, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(g->r, req.data, req.size, &it));
    wsync_blob_free(&req);
    return it;
}

static int64_t index_at(const wsync_patch_t *p, uint64_t k) {
    if (p->index_bits == 32) return ((const int32_t *)p->indices)[k];
    return ((const int64_t *)p->indices)[k];
}

/* The indices and values of every patch are exactly the elements whose bits changed, in order;
 * the engine applies them itself and ends bit-identical to the trainer, its result hashing to
 * result_xxh3, its base to base_xxh3. */
static void patches_carry_exactly_the_changed_elements_bit_for_bit(void **state) {
    (void)state;
    rig_t g;
    rig_open(&g, "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", 0);
    model_t m;
    model_init(&m, 5);
    uint64_t seed = 99, patches = 0, changed = 0, specials = 0;
    for (int v = 1; v <= 12; ++v) {
        if (v > 1) mutate(&m, &seed, v);
        wsync_recv_t *it = send_and_receive(&g, m.t, NT);
        for (size_t i = 0; i < NT; ++i) {
            wsync_tensor_t peek;
            OK(wsync_recv_peek(it, i, &peek));
            assert_string_equal(peek.name, kNames[i]);
            if (v == 1) { /* no base yet: dense, and flagged so */
                assert_int_equal(peek.flags, 0);
                OK(wsync_recv_copy(it, i, 0, m.engine[i], m.bytes[i]));
                continue;
            }
            assert_int_equal(peek.flags, WSYNC_TENSOR_PATCH);
            wsync_patch_t p = {.struct_size = sizeof p};
            OK(wsync_recv_patch(it, i, &p));
            assert_int_equal(p.struct_size, sizeof p);
            assert_int_equal(p.index_bits, 32);
            assert_int_equal(p.base_version, (uint64_t)v - 1);
            assert_int_equal(p.elements, m.elems[i]);
            assert_true(p.base_xxh3 == XXH3_64bits(m.prev[i], m.bytes[i]));
            assert_true(p.result_xxh3 == XXH3_64bits(m.data[i], m.bytes[i]));
            assert_true((uintptr_t)p.indices % 4 == 0 && (uintptr_t)p.values % 8 == 0);
            /* the expected change, the slow way */
            const size_t es = m.esize[i];
            uint64_t k = 0;
            for (size_t e = 0; e < m.elems[i]; ++e) {
                if (memcmp(m.prev[i] + e * es, m.data[i] + e * es, es) == 0) continue;
                if (k >= p.count) fail_msg("v%d %s: element %zu changed but the patch has only %llu", v,
                                           kNames[i], e, (unsigned long long)p.count);
                assert_int_equal(index_at(&p, k), (int64_t)e);
                assert_memory_equal((const uint8_t *)p.values + k * es, m.data[i] + e * es, es);
                ++k;
            }
            assert_int_equal(p.count, k);
            /* a second call gives the same answer and takes nothing again */
            wsync_patch_t again = {.struct_size = sizeof again};
            OK(wsync_recv_patch(it, i, &again));
            assert_memory_equal(&again, &p, sizeof p);
            /* the engine's own apply */
            for (uint64_t j = 0; j < p.count; ++j)
                memcpy(m.engine[i] + (size_t)index_at(&p, j) * es, (const uint8_t *)p.values + j * es, es);
            assert_true(XXH3_64bits(m.engine[i], m.bytes[i]) == p.result_xxh3);
            ++patches;
            changed += p.count;
        }
        if (v == 2) { /* -0.0 and the new NaN payload are among the f32 patch's values */
            wsync_patch_t p = {.struct_size = sizeof p};
            OK(wsync_recv_patch(it, 0, &p));
            assert_true(p.count >= 2);
            assert_int_equal(index_at(&p, 0), 0);
            assert_int_equal(index_at(&p, 1), 1);
            uint32_t got[2];
            memcpy(got, p.values, 8);
            assert_int_equal(got[0], 0x80000000u);
            assert_int_equal(got[1], 0x7fc00002u);
            specials += 2;
        }
        /* a patch taken this way is not applied again by a copy, nor yielded as a view */
        if (v > 1)
            EXPECT_ERR(wsync_recv_copy(it, 0, 0, m.engine[0], m.bytes[0]), WSYNC_ERR_INVALID_ARGUMENT,
                       "handed out by wsync_recv_patch");
        wsync_tensor_t view;
        bool has = true;
        OK(wsync_recv_next(it, &view, &has));
        assert_false(has);
        OK(wsync_recv_end(it));
        OK(wsync_sender_flush(g.snd, 5000));
        uint64_t done;
        OK(wsync_receiver_completed_version(g.r, &done));
        assert_int_equal(done, (uint64_t)v);
        for (int i = 0; i < NT; ++i)
            if (memcmp(m.engine[i], m.data[i], m.bytes[i]) != 0)
                fail_msg("version %d: the engine's %s differs from the trainer's", v, kNames[i]);
    }
    assert_int_equal(patches, 11 * NT);
    assert_true(changed > 100); /* the random changes did happen */
    assert_int_equal(specials, 2);
    model_free(&m);
    rig_close(&g);
}

/* A receiver whose completed version is not the patch's base (it failed version 2 after the
 * trainer had sent version 3): the call refuses it naming both versions and fails the chunk;
 * the trainer hears of it and sends version 4 dense, which the engine loads; version 5 is a
 * patch again. */
static void a_patch_against_another_version_is_refused_naming_both_versions(void **state) {
    (void)state;
    rig_t g;
    rig_open(&g, "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", 0);
    float w[512], engine[512];
    int64_t shape[1] = {512};
    for (int i = 0; i < 512; ++i) w[i] = (float)i;
    wsync_tensor_t t = tu_tensor("w", w, shape, 1, WSYNC_DTYPE_FLOAT, 32);
    /* The engine holds version 2's request open while the trainer already sends version 3 (a
     * patch against 2), then fails version 2: version 3's patch meets a receiver whose completed
     * version is 1. (A restarted engine no longer gets here: the trainer sends the version
     * after a re-attach dense; test_delta_sync.c.) */
    wsync_recv_t *held = NULL;
    for (int v = 1; v <= 5; ++v) {
        if (v > 1) w[3 * v] = -w[3 * v];
        if (v == 2) {
            wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(g.snd, &ch, &req));
            OK(wsync_receiver_receive(g.r, req.data, req.size, &held));
            wsync_blob_free(&req);
            continue;
        }
        wsync_recv_t *it;
        if (v == 3) {
            wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(g.snd, &ch, &req));
            OK(wsync_recv_fail(held, WSYNC_ERR_INTEGRITY, "engine: version 2 failed"));
            OK(wsync_receiver_receive(g.r, req.data, req.size, &it));
            wsync_blob_free(&req);
        } else {
            it = send_and_receive(&g, &t, 1);
        }
        wsync_patch_t p = {.struct_size = sizeof p};
        if (v == 3) {
            EXPECT_ERR(wsync_recv_patch(it, 0, &p), WSYNC_ERR_MISMATCH,
                       "is a patch against version 2, but this receiver's completed version is 1");
            assert_null(p.indices); /* a failed call leaves no pointer behind */
            assert_int_equal(p.count, 0);
            EXPECT_ERR(wsync_recv_patch(it, 0, &p), WSYNC_ERR_MISMATCH, "version 2"); /* failed */
            EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_MISMATCH, "completed version is 1");
            assert_int_equal(wsync_sender_flush(g.snd, 5000), WSYNC_ERR_PEER);
            continue;
        }
        if (v == 1 || v == 4) { /* dense: the first, and the one after the failure */
            OK(wsync_recv_copy(it, 0, 0, engine, sizeof engine));
        } else {
            OK(wsync_recv_patch(it, 0, &p));
            assert_int_equal(p.base_version, (uint64_t)v - 1);
            assert_int_equal(p.count, 1);
            assert_int_equal(((const int32_t *)p.indices)[0], 3 * v);
            memcpy(&engine[3 * v], p.values, 4);
        }
        OK(wsync_recv_end(it));
        OK(wsync_sender_flush(g.snd, 5000));
        assert_memory_equal(engine, w, sizeof w);
    }
    uint64_t done;
    OK(wsync_receiver_completed_version(g.r, &done));
    assert_int_equal(done, 5);
    rig_close(&g);
}

/* A dense entry (version 1; a tensor that changed wholesale under "auto") is refused by name
 * and the iteration goes on: the loader takes it as a view or a copy. Patches and views
 * interleave in entry order (peek says which is which). Bad arguments change nothing. */
static void a_dense_entry_is_refused_by_name_and_the_iteration_goes_on(void **state) {
    (void)state;
    rig_t g;
    rig_open(&g, "{\"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\"}", 0);
    uint16_t a[1024], b[1024], ea[1024], eb[1024];
    int64_t shape[1] = {1024};
    for (int i = 0; i < 1024; ++i) a[i] = (uint16_t)i, b[i] = (uint16_t)(7 * i);
    wsync_tensor_t t[2] = {tu_tensor("a", a, shape, 1, WSYNC_DTYPE_BFLOAT, 16),
                           tu_tensor("b", b, shape, 1, WSYNC_DTYPE_BFLOAT, 16)};
    wsync_patch_t p = {.struct_size = sizeof p};
    /* version 1: both dense */
    wsync_recv_t *it = send_and_receive(&g, t, 2);
    EXPECT_ERR(wsync_recv_patch(it, 1, &p), WSYNC_ERR_INVALID_ARGUMENT, "tensor 1 ('b')");
    EXPECT_ERR(wsync_recv_patch(it, 0, &p), WSYNC_ERR_INVALID_ARGUMENT, "is not a patch (it crossed dense)");
    EXPECT_ERR(wsync_recv_patch(it, 2, &p), WSYNC_ERR_INVALID_ARGUMENT, "out of range");
    EXPECT_ERR(wsync_recv_patch(it, 0, NULL), WSYNC_ERR_INVALID_ARGUMENT, "out");
    EXPECT_ERR(wsync_recv_patch(NULL, 0, &p), WSYNC_ERR_INVALID_ARGUMENT, "it");
    wsync_patch_t small = {.struct_size = 8};
    EXPECT_ERR(wsync_recv_patch(it, 0, &small), WSYNC_ERR_INVALID_ARGUMENT, "struct_size");
    wsync_tensor_t view;
    bool has;
    OK(wsync_recv_next(it, &view, &has)); /* the iteration went on */
    assert_true(has);
    memcpy(ea, view.data, sizeof ea);
    OK(wsync_recv_copy(it, 1, 0, eb, sizeof eb));
    OK(wsync_recv_end(it));
    OK(wsync_sender_flush(g.snd, 5000));
    /* version 2: 'a' changes in two elements (a patch), 'b' wholesale (dense under "auto") */
    a[10] ^= 0x8000, a[1000] = 0x7fc1;
    for (int i = 0; i < 1024; ++i) b[i] ^= 0x5555;
    it = send_and_receive(&g, t, 2);
    wsync_tensor_t pa, pb;
    OK(wsync_recv_peek(it, 0, &pa));
    OK(wsync_recv_peek(it, 1, &pb));
    assert_int_equal(pa.flags, WSYNC_TENSOR_PATCH);
    assert_int_equal(pb.flags, 0);
    EXPECT_ERR(wsync_recv_patch(it, 1, &p), WSYNC_ERR_INVALID_ARGUMENT, "tensor 1 ('b')");
    OK(wsync_recv_patch(it, 0, &p));
    assert_int_equal(p.count, 2);
    const int32_t *ix = p.indices;
    assert_int_equal(ix[0], 10);
    assert_int_equal(ix[1], 1000);
    for (int k = 0; k < 2; ++k) memcpy(&ea[ix[k]], (const uint16_t *)p.values + k, 2);
    OK(wsync_recv_next(it, &view, &has)); /* skips the patch taken: yields 'b' */
    assert_true(has);
    assert_string_equal(view.name, "b");
    memcpy(eb, view.data, sizeof eb);
    OK(wsync_recv_end(it));
    OK(wsync_sender_flush(g.snd, 5000));
    assert_memory_equal(ea, a, sizeof a);
    assert_memory_equal(eb, b, sizeof b);
    rig_close(&g);
}

/* Every patch in the writable mapping whose header says `count` changes of a tensor of
 * `elements` elements (stale patches of earlier versions may lie in other buckets: they are
 * corrupted too, and never read again). Returns how many it found. */
static int corrupt_patches(rig_t *g, uint64_t count, uint64_t elements, int how) {
    int found = 0;
    for (size_t off = 0; off + 32 <= g->seg_bytes; off += 8) {
        uint8_t *h = g->seg + off;
        uint64_t c, e;
        if (memcmp(h, "WDP1", 4) != 0) continue;
        memcpy(&c, h + 16, 8);
        memcpy(&e, h + 24, 8);
        if (c != count || e != elements || h[5] != 4) continue;
        uint32_t *ix = (uint32_t *)(h + 32);
        if (how == 0) { /* two indices swapped: out of order */
            uint32_t x = ix[0];
            ix[0] = ix[1], ix[1] = x;
        } else { /* the last index past the tensor */
            ix[count - 1] = (uint32_t)elements;
        }
        ++found;
    }
    return found;
}

/* Patch bytes whose indices were changed in the shared segment: with checksums on the tensor
 * checksum catches it (INTEGRITY naming the tensor); without, the patch's own check does
 * (MALFORMED naming the tensor and the index). Either way the chunk fails, the trainer hears
 * of it, and the next (dense) version is whole again. */
static void corrupted_patch_indices_are_refused_by_name(void **state) {
    (void)state;
    for (int checksums = 0; checksums < 2; ++checksums) {
        rig_t g;
        rig_open(&g, checksums ? "{\"bucket_bytes\": 65536, \"delta\": \"on\"}"
                               : "{\"bucket_bytes\": 65536, \"delta\": \"on\", \"checksum\": false}",
                 1);
        float w[2000], engine[2000];
        int64_t shape[1] = {2000};
        for (int i = 0; i < 2000; ++i) w[i] = (float)i;
        wsync_tensor_t t = tu_tensor("layers.0.w", w, shape, 1, WSYNC_DTYPE_FLOAT, 32);
        /* v1 dense; v2 corrupt (swap); v3 dense; v4 corrupt (out of range); v5 dense; v6 clean */
        for (int v = 1; v <= 6; ++v) {
            if (v > 1) w[v] += 1.0f, w[100 + v] += 1.0f, w[1999 - v] += 1.0f;
            wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(g.snd, &ch, &req));
            const int corrupt = v == 2 || v == 4;
            if (corrupt) assert_true(corrupt_patches(&g, 3, 2000, v == 2 ? 0 : 1) >= 1);
            wsync_recv_t *it;
            OK(wsync_receiver_receive(g.r, req.data, req.size, &it));
            wsync_blob_free(&req);
            wsync_tensor_t peek;
            OK(wsync_recv_peek(it, 0, &peek));
            wsync_patch_t p = {.struct_size = sizeof p};
            if (corrupt) {
                if (checksums)
                    EXPECT_ERR(wsync_recv_patch(it, 0, &p), WSYNC_ERR_INTEGRITY, "'layers.0.w'");
                else if (v == 2)
                    EXPECT_ERR(wsync_recv_patch(it, 0, &p), WSYNC_ERR_MALFORMED,
                               "tensor 0 ('layers.0.w') in chunk 0 of version 2: patch index 1 is out of order");
                else
                    EXPECT_ERR(wsync_recv_patch(it, 0, &p), WSYNC_ERR_MALFORMED,
                               "('layers.0.w') in chunk 0 of version 4: patch index 2 is out of order or outside the tensor");
                assert_null(p.indices);
                assert_int_not_equal(wsync_recv_end(it), WSYNC_OK);
                assert_int_equal(wsync_sender_flush(g.snd, 5000), WSYNC_ERR_PEER);
                continue;
            }
            if (peek.flags & WSYNC_TENSOR_PATCH) {
                assert_int_equal(v, 6);
                OK(wsync_recv_patch(it, 0, &p));
                assert_int_equal(p.count, 3);
                for (uint64_t k = 0; k < p.count; ++k)
                    engine[((const int32_t *)p.indices)[k]] = ((const float *)p.values)[k];
            } else {
                assert_true(v == 1 || v == 3 || v == 5);
                OK(wsync_recv_copy(it, 0, 0, engine, sizeof engine));
            }
            OK(wsync_recv_end(it));
            OK(wsync_sender_flush(g.snd, 5000));
            assert_memory_equal(engine, w, sizeof w);
        }
        rig_close(&g);
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(patches_carry_exactly_the_changed_elements_bit_for_bit),
        cmocka_unit_test(a_patch_against_another_version_is_refused_naming_both_versions),
        cmocka_unit_test(a_dense_entry_is_refused_by_name_and_the_iteration_goes_on),
        cmocka_unit_test(corrupted_patch_indices_are_refused_by_name),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
