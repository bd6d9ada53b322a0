// Any text as strategy and planner options (strict JSON validation).
#include <cstddef>
#include <cstdint>
#include <string>

#include "wsync.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string text(reinterpret_cast<const char *>(data), size);
    wsync_strategy_t *s = nullptr;
    if (wsync_strategy_create("shm", text.c_str(), &s) == WSYNC_OK) wsync_strategy_destroy(s);
    int64_t shape = 4;
    wsync_tensor_t t = {};
    t.name = "layers.0.w";
    t.shape = &shape;
    t.ndim = 1;
    t.dtype.code = WSYNC_DTYPE_FLOAT;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.device.type = WSYNC_DEVICE_CPU;
    wsync_plan_t *p = nullptr;
    if (wsync_plan_create(&t, 1, text.c_str(), &p) == WSYNC_OK) wsync_plan_destroy(p);
    return 0;
}
