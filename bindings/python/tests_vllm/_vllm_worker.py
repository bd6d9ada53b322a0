"""A vLLM worker in a process of its own, for the multi-process tests.

The update session is vLLM 0.33.0's own: ``init_weight_transfer_engine``,
``start_weight_update``, ``update_weights``, ``finish_weight_update`` and
``shutdown_weight_transfer_engine`` are the methods of ``vllm.v1.worker.gpu_worker.Worker``
(the class every vLLM GPU worker is), on a real ``Worker`` object, and the engine is built by
``WeightTransferEngineFactory.create_engine`` exactly as ``Worker.load_model`` builds it. Only
the model runner, which needs a GPU, is replaced by :class:`CpuModelRunner` holding a small
torch model.

The trainer drives a worker through a pipe: each message is ``(method, args)`` and each reply
``("ok", result)`` or ``("error", type name, message)``.
"""

import os
import sys
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# b12x (FlashInfer's Blackwell kernels, an optional vLLM dependency) fails to import on a host
# without CUDA (cuda.bindings has no cudaLibrary_t), with an AttributeError vLLM does not
# catch, and gpu_worker imports it through the quantised lm-head kernels. Hidden here as if it
# were not installed, which vLLM supports (vllm/utils/b12x.py: _HAS_B12X).
sys.modules.setdefault("b12x", None)

import torch  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.config.weight_transfer import WeightTransferConfig  # noqa: E402
from vllm.distributed.weight_transfer import WeightTransferEngineFactory  # noqa: E402
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading  # noqa: E402
from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

from _vllm_models import TiedModel  # noqa: E402

#: The vLLM methods a trainer may call through the pipe.
WORKER_RPCS = ("init_weight_transfer_engine", "start_weight_update", "update_weights",
               "finish_weight_update", "shutdown_weight_transfer_engine",
               "start_draft_weight_update")


class CpuModelRunner:
    """What ``Worker``'s weight-update methods use of the GPU model runner."""

    def __init__(self, model, draft=None):
        self.model = model
        self.draft = draft
        self.lora_resets = 0

    def get_model(self):
        return self.model

    def get_draft_model(self):
        return self.draft

    def reset_lora_state(self):
        self.lora_resets += 1


def make_worker(rank: int, world_size: int) -> Worker:
    """A real vLLM ``Worker`` (TP rank ``rank`` of ``world_size``) with a wsync engine."""
    load_general_plugins()  # vLLM does this in every worker process: it registers "wsync"
    vc = VllmConfig(weight_transfer_config=WeightTransferConfig(backend="wsync"))
    vc.parallel_config.rank = rank
    vc.parallel_config.world_size = world_size
    worker = Worker(vllm_config=vc, local_rank=rank, rank=rank,
                    distributed_init_method="tcp://127.0.0.1:0")
    model, draft = TiedModel(), TiedModel()
    record_metadata_for_reloading(model)  # vLLM's model loader does this when it builds a model
    record_metadata_for_reloading(draft)
    worker.model_runner = CpuModelRunner(model, draft)
    # A speculative draft model: Worker._set_draft_weight_update_target reads only
    # speculative_config.draft_model_config (a real SpeculativeConfig needs a checkpoint);
    # layerwise reload reads its dtype for attention layers, which these models lack.
    worker.speculative_config = SimpleNamespace(draft_model_config=SimpleNamespace(dtype=torch.float32))
    worker.device = torch.device("cpu")
    # As Worker.load_model does once the model is loaded.
    worker.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
        vc.weight_transfer_config, vc, worker.device, worker.model_runner.get_model())
    return worker


def probe(worker: Worker) -> dict:
    """What the tests check of a worker between versions."""
    engine = worker.weight_transfer_engine
    model = worker.model_runner.model
    state = engine.receiver.poll()
    return {
        "engine": type(engine).__name__,
        "receiver_index": engine.receiver.index,
        "session_active": worker._weight_update_active,
        "completed_version": state.completed_version,
        "open_version": state.open_version,
        "failed_version": state.failed_version,
        "failed_status": state.failed_status.name,
        "layers_waiting": sum(1 for m in model.modules()
                              if m in LAYERWISE_INFO and LAYERWISE_INFO[m].can_load()),
        "meta_tensors": [n for n, t in model.state_dict(keep_vars=True).items() if t.is_meta],
        "tied": model.lm_head.weight is model.embed.weight,
        "lora_resets": worker.model_runner.lora_resets,
    }


def serve(conn, rank: int, world_size: int) -> None:
    """The worker process: answers the trainer's calls until ``stop``."""
    torch.set_num_threads(1)
    worker = make_worker(rank, world_size)
    model = worker.model_runner.model
    conn.send(("ok", rank))
    while True:
        method, args = conn.recv()
        try:
            if method == "stop":
                worker.shutdown_weight_transfer_engine()
                conn.send(("ok", None))
                return
            if method in WORKER_RPCS:
                result = getattr(worker, method)(*args)
            elif method == "state_dict":
                result = {n: t.detach().clone() for n, t in model.state_dict().items()}
            elif method == "draft_state_dict":
                result = {n: t.detach().clone()
                          for n, t in worker.model_runner.draft.state_dict().items()}
            elif method == "probe":
                result = probe(worker)
            elif method == "fail_on":
                model.fail_on = args[0]
                result = None
            else:
                raise ValueError(f"unknown method {method}")
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))
        else:
            conn.send(("ok", result))
