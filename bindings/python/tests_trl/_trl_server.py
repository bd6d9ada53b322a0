"""A vLLM 0.33.0 server for the TRL tests, on CPU: vLLM's own HTTP routes, a real vLLM
``Worker`` with the wsync engine, in one process (``python _trl_server.py PORT MODEL_DIR``).

What is vLLM's own: the FastAPI routes TRL's ``VLLMClient`` calls (``vllm.entrypoints.rl``'s
router: ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/pause``, ``/resume``, ``/get_world_size``, ``/weight_checker``;
``/health``; the dev ``/server_info``), vLLM's exception handlers (an engine error becomes the
JSON error body TRL's client reports), the ``Worker`` update-session methods, the wsync engine
built by ``WeightTransferEngineFactory`` as ``Worker.load_model`` builds it, and the digests of
``/weight_checker`` (``compute_tensor_digests``).

What is not: vLLM's ``AsyncLLM`` and engine core, which need a GPU model runner (vLLM 0.33's
CPU backend is not in its CUDA wheel). :class:`LocalEngineClient` stands where ``AsyncLLM``
stands, doing what ``AsyncLLM``'s weight-transfer methods do (one ``collective_rpc`` to the
workers, here one worker called in one thread, in order), and the model runner is a small
object holding the transformers model, with a vLLM-style ``load_weights``.
"""

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# b12x fails to import without CUDA (see tests_vllm/_vllm_worker.py); hidden as if absent.
sys.modules.setdefault("b12x", None)

import torch  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.config.weight_transfer import WeightTransferConfig  # noqa: E402
from vllm.distributed.weight_transfer import WeightTransferEngineFactory  # noqa: E402
from vllm.entrypoints.rl.factories import register_rl_api_routers  # noqa: E402
from vllm.entrypoints.serve.dev.server_info.api_router import attach_router as attach_info  # noqa: E402
from vllm.entrypoints.serve.exception_handling.register import init_exception_handler  # noqa: E402
from vllm.entrypoints.serve.instrumentator.health import router as health_router  # noqa: E402
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading  # noqa: E402
from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests  # noqa: E402
from vllm.model_executor.model_loader.weight_utils import default_weight_loader  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

from _trl_models import load_model  # noqa: E402


def add_load_weights(model):
    """vLLM's model interface: ``load_weights(iterable of (checkpoint name, tensor))``."""
    def load_weights(weights):
        # Looked up at each call: vLLM's layerwise reload swaps the parameters for a version.
        params = dict(model.named_parameters())
        loaded = set()
        for name, w in weights:
            p = params[name]
            getattr(p, "weight_loader", default_weight_loader)(p, w)
            loaded.add(name)
        return loaded

    model.load_weights = load_weights
    return model


class CpuModelRunner:
    """What ``Worker``'s weight-update methods use of the GPU model runner."""

    def __init__(self, model):
        self.model = model

    def get_model(self):
        return self.model

    def get_draft_model(self):
        return None

    def reset_lora_state(self):
        pass


class LocalEngineClient:
    """``AsyncLLM``'s weight-transfer and pause methods over one in-process worker."""

    def __init__(self, worker, vllm_config):
        self.worker = worker
        self.vllm_config = vllm_config
        self.paused = False
        self.pool = ThreadPoolExecutor(max_workers=1)  # the engine core runs RPCs in order

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        call = getattr(self.worker, method)
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(self.pool, lambda: call(*args, **(kwargs or {})))]

    async def init_weight_transfer_engine(self, request):
        await self.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": request.init_info})

    async def shutdown_weight_transfer_engine(self):
        await self.collective_rpc("shutdown_weight_transfer_engine")

    async def start_weight_update(self):
        await self.collective_rpc("start_weight_update")

    async def update_weights(self, request):
        await self.collective_rpc("update_weights", kwargs={"update_info": request.update_info})

    async def finish_weight_update(self, weight_version=None):
        await self.collective_rpc("finish_weight_update")

    async def compute_weight_checksums(self):
        model = self.worker.model_runner.get_model()
        return [await asyncio.get_running_loop().run_in_executor(
            self.pool, lambda: {f"dp0:pp0:pcp0:tp0:{n}": d
                                for n, d in compute_tensor_digests(model).items()})]

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        self.paused = True  # no generation runs here; the state is what the tests check

    async def resume_generation(self):
        self.paused = False

    async def is_paused(self):
        return self.paused

    async def check_health(self):
        return None


def make_app(model_dir: str) -> FastAPI:
    load_general_plugins()  # as every vLLM process does: the entry point registers "wsync"
    vc = VllmConfig(weight_transfer_config=WeightTransferConfig(backend="wsync"))
    worker = Worker(vllm_config=vc, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:0")
    model = add_load_weights(load_model(model_dir))
    record_metadata_for_reloading(model)  # vLLM's model loader does this
    worker.model_runner = CpuModelRunner(model)
    worker.device = torch.device("cpu")
    worker.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
        vc.weight_transfer_config, vc, worker.device, model)  # as Worker.load_model does
    app = FastAPI()
    app.include_router(health_router)
    attach_info(app)
    register_rl_api_routers(app)
    init_exception_handler(app)
    app.state.engine_client = LocalEngineClient(worker, vc)
    app.state.vllm_config = vc
    app.state.args = SimpleNamespace(log_error_stack=False)
    return app


if __name__ == "__main__":
    torch.set_num_threads(1)
    port, model_dir = int(sys.argv[1]), sys.argv[2]
    uvicorn.run(make_app(model_dir), host="127.0.0.1", port=port, log_level="warning")
