"""An SGLang engine process for the tests (``python _sglang_engine.py PORT``), on CPU.

Real SGLang 0.5.23, as far as it runs without a GPU:

- SGLang's own runtime context (``runtime_context.publish`` of a ``ServerArgs`` with
  ``device="cpu"`` and ``custom_weight_loader=[wsync.integrations.sglang.load_weights]``, the
  allow-list the server's ``--custom-weight-loader`` fills), its distributed environment and
  TP group (gloo, world size 1), as ``sglang.test.layer_ut_utils.init_single_process_dist``
  sets them up;
- a real ``sglang.srt.models.qwen2.Qwen2ForCausalLM`` (tiny config, random weights) with its
  own ``load_weights`` (stacked ``qkv_proj``/``gate_up_proj``, SGLang's weight loaders);
- SGLang's own weight-update stack: ``ModelRunner.init_weight_updater`` builds the runner's
  ``WeightUpdater`` (which imports the custom loader by its dotted name), ``TpModelWorker``'s
  ``deserialize_own_rank``/``weight_update_runners``, and the scheduler's
  ``SchedulerWeightUpdaterManager`` (the begin/end session, its refusals, its TP barrier).
  The runner and worker objects are made without their ``__init__`` (which loads a model
  and allocates GPU memory pools), with only the attributes these methods read.

What is not SGLang's: the HTTP routing below. SGLang's FastAPI server needs its tokenizer
manager and a scheduler process running a ModelRunner, which needs sglang-kernel (CUDA) on
this CPU-only host. The routes keep SGLang's paths, JSON bodies (made into SGLang's own
``io_struct`` request types; base64 payloads through SGLang's
``normalize_serialized_named_tensor_payloads``) and answers (``{"success", "message"}``, 400
when not successful). An exception escaping the weight-update stack ends this process, as it
ends SGLang's scheduler (its event loop has no handler for it).

``GET /test/weights`` (the tests' own route) returns the model's parameters, pickled and
base64 encoded, to compare bit for bit; ``GET /test/flushes`` counts the cache flushes the
manager asked for (the scheduler's ``flush_cache`` is this process's counter).
"""

import base64
import io
import json
import os
import sys
import traceback
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch

LOADER = "wsync.integrations.sglang.load_weights"
#: One entry per cache flush SGLang's weight-update manager asked for (``Scheduler.flush_cache``
#: in a server: it drops the KV cache the previous weights computed).
FLUSHES = []


def tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False)


def setup_sglang(master_port: int):
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK="0",
                           WORLD_SIZE="1", LOCAL_RANK="0").items():
        os.environ[key] = value
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import (init_distributed_environment,
                                                       initialize_model_parallel)
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy", tp_size=1, device="cpu", custom_weight_loader=[LOADER]),
            role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend="gloo")


def build_engine():
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.models.qwen2 import Qwen2ForCausalLM

    torch.manual_seed(1234)
    model = Qwen2ForCausalLM(tiny_config(), quant_config=None)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    runner = object.__new__(ModelRunner)
    runner.model, runner.device, runner.gpu_id, runner.model_config = model, "cpu", 0, None
    runner.init_weight_updater()
    worker = object.__new__(TpModelWorker)
    worker._model_runner = runner
    manager = SchedulerWeightUpdaterManager(
        tp_worker=worker, draft_worker=None, memory_saver_adapter=None,
        flush_cache=lambda **_: FLUSHES.append(1) or True, is_fully_idle=lambda **_: True,
        scheduler=object.__new__(Scheduler))
    return model, manager


class Handler(BaseHTTPRequestHandler):
    model = None
    manager = None

    def log_message(self, *args):
        pass

    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._answer(200, {})
        if self.path == "/test/weights":
            buf = io.BytesIO()
            torch.save({n: p.detach().clone() for n, p in self.model.named_parameters()}, buf)
            return self._answer(200, {"weights": base64.b64encode(buf.getvalue()).decode()})
        if self.path == "/test/flushes":
            return self._answer(200, {"flushes": len(FLUSHES)})
        self._answer(404, {"detail": "Not Found"})

    def do_POST(self):
        from sglang.srt.managers import io_struct
        from sglang.srt.utils.common import normalize_serialized_named_tensor_payloads

        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        routes = {
            "/begin_weight_update": (io_struct.BeginWeightUpdateReqInput, "begin_weight_update"),
            "/end_weight_update": (io_struct.EndWeightUpdateReqInput, "end_weight_update"),
            "/update_weights_from_tensor": (io_struct.UpdateWeightsFromTensorReqInput,
                                            "update_weights_from_tensor"),
        }
        if self.path not in routes:
            return self._answer(404, {"detail": "Not Found"})
        cls, method = routes[self.path]
        if "serialized_named_tensors" in body:
            body["serialized_named_tensors"] = normalize_serialized_named_tensor_payloads(
                body["serialized_named_tensors"])
        try:
            req = cls(**body)  # SGLang's request types are array-like structs for its IPC
        except TypeError as exc:
            return self._answer(422, {"detail": str(exc)})
        try:
            out = getattr(self.manager, method)(req)
        except BaseException:
            # SGLang's scheduler has no handler here: the server goes down.
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(70)
        self._answer(200 if out.success else 400, {"success": out.success, "message": out.message})


def main():
    port = int(sys.argv[1])
    setup_sglang(master_port=int(sys.argv[2]) if len(sys.argv) > 2 else port + 1)
    Handler.model, Handler.manager = build_engine()
    server = HTTPServer(("127.0.0.1", port), Handler)
    print(f"READY {port} pid {os.getpid()}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
