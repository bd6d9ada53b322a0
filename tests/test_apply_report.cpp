// Engines report their verified apply time with their acknowledgements (docs/delta.md, "How
// auto decides"), white-box: a trainer and two engines in this process over the real board
// (shm) and over loopback tcp (ucx, skipped where this build or machine has none); what the
// trainer's Sender received is read through its internal accessor (no public ABI carries it);
// and that the Sender hands it to "auto".
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core.hpp"
#include "wsync.h"

#include "whitebox.hpp"

namespace {

constexpr int64_t kElems = 1 << 20;  // 4 MiB of float32: a patch's apply takes microseconds
constexpr uint32_t kEngines = 2;

// The one float32 host tensor "w" over x (its length in *shape).
wsync_tensor_t float_tensor(std::vector<float> &x, int64_t *shape) {
    *shape = static_cast<int64_t>(x.size());
    wsync_tensor_t t{};
    t.name = "w";
    t.data = x.data();
    t.shape = shape;
    t.ndim = 1;
    t.dtype = {WSYNC_DTYPE_FLOAT, 32, 1};
    t.device = {WSYNC_DEVICE_CPU, 0};
    return t;
}

struct Rig {
    wsync_strategy_t *s = nullptr, *rs = nullptr;
    wsync_blob_t init{};
    wsync_sender_t *tx = nullptr;
    wsync_receiver_t *r[kEngines] = {};
    std::vector<float> x = std::vector<float>(kElems), held[kEngines];

    // `side`: both sides' options of `kind`; `trainer`: the trainer's own ("delta": "on" is
    // added: every version after the first is patches).
    Rig(const char *kind, const std::string &side, const std::string &trainer) {
        const std::string o = "{" + side + (side.empty() ? "" : ", ") + trainer +
                              "\"receivers\": 2, \"delta\": \"on\"}";
        assert_int_equal(wsync_strategy_create(kind, o.c_str(), &s), WSYNC_OK);
        assert_int_equal(wsync_strategy_create_init_info(s, &init), WSYNC_OK);
        assert_int_equal(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_OK);
        const std::string ro = "{" + side + "}";
        assert_int_equal(wsync_strategy_create(kind, ro.c_str(), &rs), WSYNC_OK);
        for (uint32_t k = 0; k < kEngines; ++k) {
            assert_int_equal(wsync_receiver_create(rs, init.data, init.size, k, &r[k]), WSYNC_OK);
            held[k].assign(kElems, 0.0f);
        }
    }
    ~Rig() {
        for (auto *rx : r) wsync_receiver_destroy(rx);
        wsync_strategy_destroy(rs);
        wsync_sender_destroy(tx);
        wsync_strategy_destroy(s);
        wsync_blob_free(&init);
    }

    // Version v: 1 % of the elements change; each engine copies (a patch: applies) into its own
    // memory, which holds the version before; the trainer flushes.
    void version(uint64_t v) {
        for (int64_t k = 0; k < kElems; k += 100) x[k] = static_cast<float>(v * 1000 + k);
        int64_t shape = kElems;
        const wsync_tensor_t t = float_tensor(x, &shape);
        wsync_chunk_t c{&t, 1, WSYNC_CHUNK_LAST, 0};
        wsync_blob_t q{};
        assert_int_equal(wsync_sender_send_chunk(tx, &c, &q), WSYNC_OK);
        for (uint32_t k = 0; k < kEngines; ++k) {
            wsync_recv_t *it = nullptr;
            assert_int_equal(wsync_receiver_receive(r[k], q.data, q.size, &it), WSYNC_OK);
            wsync_tensor_t peek{};
            wsync_recv_peek(it, 0, &peek);
            assert_true(((peek.flags & WSYNC_TENSOR_PATCH) != 0) == (v > 1));
            assert_int_equal(wsync_recv_copy(it, 0, 0, held[k].data(), kElems * sizeof(float)), WSYNC_OK);
            assert_int_equal(wsync_recv_end(it), WSYNC_OK);
            assert_memory_equal(held[k].data(), x.data(), kElems * sizeof(float));
        }
        wsync_blob_free(&q);
        assert_int_equal(wsync_sender_flush(tx, 20000), WSYNC_OK);
    }

    uint64_t reported(uint64_t v) { return reinterpret_cast<wsync::Sender *>(tx)->engines_apply_ns(v); }
};

// A dense version reports no apply; each patch version's flush brings the engines' apply time
// of it to the trainer: more than nothing, less than a second for 4 MiB.
void check_reports(Rig &g) {
    g.version(1);
    assert_true(g.reported(1) == 0);
    for (uint64_t v = 2; v <= 3; ++v) {
        g.version(v);
        const uint64_t ns = g.reported(v);
        print_message("version %llu: the engines reported %.3f ms of apply\n",
                      static_cast<unsigned long long>(v), double(ns) / 1e6);
        assert_true(ns > 0 && ns < uint64_t(1000000000));
    }
    assert_true(g.reported(1) == 0 && g.reported(4) == 0);  // nothing for versions not sent
}

void the_trainer_receives_the_engines_apply_time_on_the_board(void **) {
    Rig g("shm", "", "\"buckets\": 2, \"bucket_bytes\": 8388608, ");
    check_reports(g);
}

void the_trainer_receives_the_engines_apply_time_over_ucx(void **) {
    const char *side = "\"transports\": \"tcp\", \"net_devices\": \"lo\", \"timeout_ms\": 20000";
    wsync_strategy_t *probe = nullptr;
    if (wsync_strategy_create("ucx", (std::string("{") + side + "}").c_str(), &probe) != WSYNC_OK) {
        print_message("skipped: %s\n", wsync_last_error());
        skip();
    }
    wsync_strategy_destroy(probe);
    Rig g("ucx", side, "");
    check_reports(g);
}

// The Sender hands "auto" what its transport heard (SenderImpl::applied_ns) for each patch
// version, bounded. A stand-in transport moves nothing; its flush takes 100 ms (a slow link),
// so the copy aside of 16 KiB (microseconds) opens the gate and version 2 is patches; it
// reports `report_ns` for every version.
struct SlowLink final : wsync::SenderImpl {
    uint64_t report_ns;
    explicit SlowLink(uint64_t ns) : report_ns(ns) {}
    wsync::json send(const wsync::ChunkHeader &, const wsync_tensor_t *, wsync::TensorTable &t) override {
        t.offsets.assign(t.metas.size(), 0);
        return wsync::json::object();
    }
    void flush(int64_t) override { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }
    uint64_t applied_ns(uint64_t) override { return report_ns; }
};

const wsync::delta::AutoState &after_a_patch_version(std::unique_ptr<wsync::Sender> &tx, uint64_t report_ns) {
    wsync::delta::Config cfg;
    cfg.mode = wsync::delta::Mode::kAuto;
    cfg.threads = 1;
    tx = std::make_unique<wsync::Sender>(wsync::find_kind("shm"), std::make_unique<SlowLink>(report_ns), cfg);
    std::vector<float> x(4096, 1.0f);
    int64_t shape = 4096;
    const wsync_tensor_t t = float_tensor(x, &shape);
    const wsync_chunk_t c{&t, 1, WSYNC_CHUNK_LAST, 0};
    for (int v = 1; v <= 2; ++v) {
        x[100] = float(v);
        tx->send_chunk(c, nullptr);
        tx->flush(1000);
    }
    const wsync::delta::AutoState &s = *tx->auto_state();
    assert_true(s.patch_run == 1);  // version 2 went as patches
    return s;
}

void a_trainer_s_auto_learns_the_apply_its_engines_report(void **) {
    std::unique_ptr<wsync::Sender> tx;
    assert_true(after_a_patch_version(tx, 0).apply == 0);  // none reported: the model
    const double bytes = 4096 * sizeof(float);
    assert_true(after_a_patch_version(tx, 1000).apply == double(1000) * 1e-9 / bytes);
    // 7 s for 16 KiB is no apply: bounded.
    assert_true(after_a_patch_version(tx, 7000000000).apply == wsync::delta::kMaxApplyPerByte);
}

}  // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_trainer_receives_the_engines_apply_time_on_the_board),
        cmocka_unit_test(the_trainer_receives_the_engines_apply_time_over_ucx),
        cmocka_unit_test(a_trainer_s_auto_learns_the_apply_its_engines_report),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
