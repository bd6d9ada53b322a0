"""Every Python block of README.md and bindings/python/README.md runs, and every C block of
README.md compiles (issue 39: the first README example a user tried did not compile). The Rust
blocks run in the Rust binding's tests (tests/readme.rs), against these Python blocks as their
peers. The vLLM sections' blocks need vLLM itself: scripts/test-vllm.sh."""

import asyncio
import shutil
import subprocess
import threading

import pytest
import torch

import wsync
from wsync.engine import ModuleLoader
from wsync.trainer import send_model, send_model_async

import readme_blocks as rb
from conftest import REPO_ROOT


def run_threads(*targets):
    """Runs each callable in its own thread; re-raises the first exception."""
    errors = []

    def guard(f):
        try:
            f()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=guard, args=(f,)) for f in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a peer is stuck"
    if errors:
        raise errors[0]


def engine_model():
    model = rb.small_model().to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def assert_loaded_as_sent(d, indices, names):
    for i in indices:
        for name in names:
            sent = (d / f"expected-{name}").read_bytes()
            got = (d / f"loaded-{i}-{name}").read_bytes()
            assert got == sent, f"engine {i}: {name} differs"


NAMES = ["embed.weight", "proj.weight", "proj.bias"]


def test_every_python_and_c_block_of_the_readmes_has_a_test():
    """A block added without a test here fails this: the counts are those the tests below run."""
    assert len(rb.python_blocks(rb.TOP_README)) == 2
    assert len(rb.python_blocks(rb.PY_README)) == 8
    assert len(rb.blocks(rb.TOP_README, "c")) == 4


def test_readme_python_trainer_and_engine_blocks_sync_two_engines_bit_exact(tmp_path):
    """README.md: the trainer block (receivers=2) and two engine blocks, one thread each."""
    engines = {}

    def engine(i):
        block = rb.python_blocks(rb.TOP_README)[1]
        ns = {"init": rb._wait_for(tmp_path / "init"), "my_index": i, "model": engine_model(),
              "forwarded_requests": rb.inbox(tmp_path)}
        engines[i] = block.run(ns)
        rb.write_loaded(tmp_path, i, ns["model"])
    run_threads(lambda: rb.top_trainer(tmp_path), lambda: engine(0), lambda: engine(1))
    assert all(ns["serving_version"] == 1 for ns in engines.values())
    assert_loaded_as_sent(tmp_path, [0, 1], NAMES)


def test_binding_readme_trainer_and_engine_blocks_sync_two_engines_bit_exact(tmp_path):
    """bindings/python/README.md: the trainer block (receivers=2) and two engine blocks."""
    engines = {}

    def engine(i):
        engines[i] = rb.engine(tmp_path, i, engine_model())
    run_threads(lambda: rb.trainer(tmp_path), lambda: engine(0), lambda: engine(1))
    assert all(ns["serving_version"] == 1 for ns in engines.values())
    assert_loaded_as_sent(tmp_path, [0, 1], NAMES)


def test_binding_readme_dest_table_block_loads_q_k_v_into_a_fused_tensor(make_sync):
    s = make_sync()
    q_rows, kv_rows = 4, 2
    sent = {"q": torch.arange(32.0).reshape(4, 8), "k": torch.arange(16.0).reshape(2, 8) + 100,
            "v": torch.arange(16.0).reshape(2, 8) + 200, "lm_head.weight": torch.ones(3, 8)}
    request = s.sender.send_chunk(list(sent.items()), last=True)
    ns = {"receiver": s.receiver, "qkv": torch.zeros(8, 8), "q_rows": q_rows, "kv_rows": kv_rows,
          "head": torch.zeros(3, 8), "request": request}
    rb.python_blocks(rb.PY_README)[2].run(ns)
    s.sender.flush(timeout_s=10)
    assert torch.equal(ns["qkv"], torch.cat([sent["q"], sent["k"], sent["v"]]))
    assert torch.equal(ns["head"], sent["lm_head.weight"])


def test_binding_readme_map_name_block_maps_projections_into_the_fused_rows():
    class Attn(torch.nn.Module):
        def __init__(self, h):
            super().__init__()
            self.qkv = torch.nn.Linear(h, 3 * h)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].attn = Attn(8)
    model.config = type("Config", (), {"hidden_size": 8})()
    ns = rb.python_blocks(rb.PY_README)[3].run({"model": model, "ModuleLoader": ModuleLoader})
    assert ns["to_fused"]("layers.0.attn.k_proj.weight") == ("layers.0.attn.qkv.weight", slice(8, 16))
    assert ns["to_fused"]("lm_head.weight") == "lm_head.weight"
    assert isinstance(ns["loader"], ModuleLoader)


def test_binding_readme_lower_level_block_loads_a_split_tensor_part_by_part(make_sync):
    """The lower-level loop against send_model's default, which splits a tensor larger than a
    bucket (it used to be `for name, view in it`, which refuses parts)."""
    s = make_sync(bucket_bytes=64 << 10, buckets=4)
    sent = {"big": torch.randn(3 * 16384 + 100), "small": torch.randn(7, 5)}
    params = {name: torch.zeros_like(t) for name, t in sent.items()}
    block = rb.python_blocks(rb.PY_README)[4]
    requests = send_model(s.sender, sent, on_request=lambda request: block.run(
        {"receiver": s.receiver, "request": request, "params": params}))
    assert len(requests) > 3
    s.sender.flush(timeout_s=10)
    assert s.receiver.completed_version == 1
    for name, t in sent.items():
        assert torch.equal(params[name], t), name


def test_binding_readme_failures_block_reports_the_engines_own_failure(make_sync):
    s = make_sync()
    request = s.sender.send_chunk([("w", torch.ones(4))], last=True)
    with pytest.raises(KeyError):
        with s.receiver.receive(request) as it:
            for name, view in it:
                raise KeyError(name)  # the engine has no such parameter
    logged = []
    rb.python_blocks(rb.PY_README)[5].run({"wsync": wsync, "sender": s.sender,
                                           "log": lambda *a: logged.append(a)})
    assert logged == [(0, "FAILED", "WSYNC_ERR_MISMATCH", "KeyError: 'w'")]


def test_binding_readme_rolling_back_block_swaps_a_completed_version(make_sync):
    s = make_sync()
    staging, serving = engine_model(), engine_model()
    trainer_model = rb.small_model()
    requests = send_model(s.sender, trainer_model, dtype=torch.bfloat16)
    swapped, stopped = [], []
    ns = {"ModuleLoader": ModuleLoader, "staging_model": staging, "serving_model": serving,
          "requests": requests, "receiver": s.receiver, "new_version": 1,
          "swap": lambda a, b: swapped.append((a, b)), "version_being_loaded": 1,
          "stop_serving": lambda: stopped.append(True)}
    rb.python_blocks(rb.PY_README)[6].run(ns)
    s.sender.flush(timeout_s=10)
    assert swapped == [(serving, staging)] and stopped == []
    for name, t in trainer_model.state_dict().items():
        assert torch.equal(staging.state_dict()[name], t.to(torch.bfloat16)), name


def test_binding_readme_asyncio_block_sends_a_model_to_an_engine(make_sync):
    s = make_sync(bucket_bytes=64 << 10, buckets=4)
    model, loaded = rb.small_model(), engine_model()
    loader = ModuleLoader(loaded)

    async def post_to_engines(request):
        await asyncio.to_thread(loader.load, s.receiver, request)
    ns = {"send_model_async": send_model_async, "sender": s.sender, "model": model,
          "torch": torch, "post_to_engines": post_to_engines}
    asyncio.run(rb.python_blocks(rb.PY_README)[7].run_async(ns))
    assert len(ns["requests"]) >= 1 and s.receiver.completed_version == 1
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t.to(torch.bfloat16)), name


# The C blocks of README.md as function bodies, with what each leaves to the reader.
C_PRELUDE = """#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <wsync.h>
void forward_to_engines(const void *data, size_t size);
void load_parameter(const char *name, const void *data, const int64_t *shape, size_t ndim,
                    wsync_dtype_t dtype);
void load(const wsync_tensor_t *view);
"""
C_FUNCTIONS = [
    "void trainer(const wsync_tensor_t *tensors, size_t n)",
    "void engine(const void *init_bytes, size_t init_len, uint32_t my_index, const void *req_bytes,"
    " size_t req_len)",
    "void tables(wsync_receiver_t *receiver, size_t n, const void *req_bytes, size_t req_len,"
    " wsync_recv_t *it)",
    "void machines(const void *init_bytes, size_t init_len, const void *req, size_t req_len,"
    " wsync_strategy_t *s, wsync_blob_t init, wsync_sender_t *snd, wsync_receiver_t *r,"
    " wsync_recv_t *it, wsync_tensor_t view, bool has)",
]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("index", range(len(C_FUNCTIONS)))
def test_readme_c_block_compiles_as_c99_without_warnings(tmp_path, index):
    block = rb.blocks(rb.TOP_README, "c")[index]
    body = "\n".join(line for line in block.code.splitlines() if not line.startswith("#include"))
    source = tmp_path / f"readme_{index}.c"
    source.write_text(f"{C_PRELUDE}\n{C_FUNCTIONS[index]} {{\n#line {block.line + 1} \"README.md\"\n"
                      f"{body}\n}}\n")
    cmd = ["cc", "-std=c99", "-fsyntax-only", "-Wall", "-Wno-unused-variable",
           "-Wno-unused-but-set-variable", "-Werror", f"-I{REPO_ROOT / 'include'}", str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
