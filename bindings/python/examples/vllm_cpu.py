"""Try the wsync vLLM backend without a GPU: a trainer syncs a small model to a real vLLM 0.33.0
``Worker`` (the class every vLLM GPU worker is) in this process, over the ``shm`` kind, for a few
versions, and checks every tensor bit for bit. It is the recipe the backend's tests use
(bindings/python/tests_vllm/_vllm_worker.py): vLLM's own update-session methods on a real
``Worker`` object, its engine built by ``WeightTransferEngineFactory`` as ``Worker.load_model``
builds it; only the GPU model runner is replaced by a small object holding a torch model.

    . <venv with vllm==0.33.0 and this package>/bin/activate
    WSYNC_LIBRARY=$PWD/build/libwsync.so python bindings/python/examples/vllm_cpu.py

Prints one line per version and exits 0 when every version arrived bit-exact.
"""

import os
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM cannot infer a device without a GPU
# b12x (optional FlashInfer kernels) fails to import without CUDA, uncaught by vLLM; hide it as
# if it were not installed (vllm/utils/b12x.py supports that).
sys.modules.setdefault("b12x", None)

import torch  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.config.weight_transfer import WeightTransferConfig  # noqa: E402
from vllm.distributed.weight_transfer import (  # noqa: E402
    ModuleSource, WeightTransferEngineFactory, WeightTransferTrainerFactory)
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading  # noqa: E402
from vllm.model_executor.model_loader.weight_utils import default_weight_loader  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

import wsync.integrations.vllm as backend  # noqa: E402


class Model(torch.nn.Module):
    """Two layers and a vLLM-style ``load_weights(iterable of (name, tensor))``."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(64, 64) for _ in range(2)])

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            p = params[name]
            getattr(p, "weight_loader", default_weight_loader)(p, tensor)
        return set(params)


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


class WorkerClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol (four methods) over workers in this process."""

    def __init__(self, workers):
        self.workers = workers

    def init_weight_transfer_engine(self, init_info):
        for w in self.workers:
            w.init_weight_transfer_engine(init_info)

    def start_weight_update(self):
        for w in self.workers:
            w.start_weight_update()

    def update_weights(self, update_info):
        for w in self.workers:
            w.update_weights(update_info)

    def finish_weight_update(self, weight_version=None):
        for w in self.workers:
            w.finish_weight_update()


def make_worker():
    # In a vLLM process the entry point runs this; on PYTHONPATH alone call it yourself.
    load_general_plugins()
    backend.register()
    vc = VllmConfig(weight_transfer_config=WeightTransferConfig(backend="wsync"))
    worker = Worker(vllm_config=vc, local_rank=0, rank=0,
                    distributed_init_method="tcp://127.0.0.1:0")
    model = Model()
    record_metadata_for_reloading(model)  # vLLM's model loader does this
    worker.model_runner = CpuModelRunner(model)
    worker.device = torch.device("cpu")
    worker.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
        vc.weight_transfer_config, vc, worker.device, model)  # as Worker.load_model does
    return worker, model


def main(versions=3):
    worker, served = make_worker()
    trained = Model()
    trainer = WeightTransferTrainerFactory.trainer_init(
        backend.WsyncTrainerInitInfo(rank=0, receivers=1, kind="shm"),
        client=WorkerClient([worker]), source=ModuleSource(trained))
    try:
        for v in range(1, versions + 1):
            with torch.no_grad():
                for p in trained.parameters():
                    p.add_(torch.randn_like(p))
            began = time.perf_counter()
            trainer.send_weights()
            took = time.perf_counter() - began
            same = all(torch.equal(a, b) for a, b in
                       zip(trained.state_dict().values(), served.state_dict().values()))
            done = worker.weight_transfer_engine.completed_version
            print(f"version {done}: {'bit-exact' if same else 'DIFFERS'} in {took:.3f} s")
            if not same or done != v:
                return 1
    finally:
        trainer.shutdown()
        worker.shutdown_weight_transfer_engine()
    print(f"{versions} versions bit-exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
