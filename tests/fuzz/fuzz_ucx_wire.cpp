// Any bytes as what a ucx peer sends: the first byte picks the parser. 0: a control message
// (decode_msg, the sender's and receiver's active-message handler); 1: an init-info blob whose
// body reaches the ucx init-info parser; 2: a request blob whose "transport" map (or body) reaches
// the ucx request parser. Each must refuse with a named error or parse; nothing else (no crash, no leak,
// no huge allocation).
#include <cstddef>
#include <cstdint>

#include "error.hpp"
#include "transport/ucx/init_info.hpp"
#include "wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *bytes, size_t size) {
    if (size < 1) return 0;
    const uint8_t which = bytes[0] % 3;
    ++bytes;
    --size;
    try {
        if (which == 0) {
            wsync::ucx::Msg m;
            (void)wsync::ucx::decode_msg(bytes, size, m);
        } else {
            wsync::wire::Envelope env = wsync::wire::decode(bytes, size);
            if (which == 1) (void)wsync::ucx::parse_init_info(env.body);
            else if (env.body.is_object() && env.body.contains("transport"))
                (void)wsync::ucx::parse_where(env.body["transport"]);
            else
                (void)wsync::ucx::parse_where(env.body);
        }
    } catch (const wsync::Error &) {
    }
    return 0;
}
