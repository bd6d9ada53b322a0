"""What the vLLM backend's default (copies for load_weights) costs against zero-copy views,
and what staging (copies held until finish_weight_update) costs.

Run in the vLLM venv (scripts/test-vllm.sh makes it):
    WSYNC_LIBRARY=$PWD/build/libwsync.so VLLM_TARGET_DEVICE=cpu \\
        /tmp/wsync-vllm-venv/bin/python bindings/python/bench/bench_vllm_copy.py

One worker engine built by vLLM's factory, its model reloaded layerwise (vLLM's
start/finish_weight_update), fed by the wsync trainer engine over shm in this process. The
model is LAYERS linear layers of HIDDEN x HIDDEN float32, with chunks of one layer each, so no
layer spans two chunks and views are correct too. Versions alternate between copy=True,
copy=False and staged=True; the median of REPS each is printed, with the model's size.
"""

import json
import statistics
import sys
import time

import torch
from vllm.config import VllmConfig
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer import (
    ModuleSource,
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.plugins import load_general_plugins

from wsync.integrations.vllm import WsyncTrainerInitInfo

HIDDEN = 2048
LAYERS = 8
REPS = 5


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(LAYERS)])

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, w in weights:
            p = params[name]
            getattr(p, "weight_loader", default_weight_loader)(p, w)
        return {name for name, _ in weights}


class Client:
    def __init__(self, engine):
        self.engine = engine

    def init_weight_transfer_engine(self, info):
        self.engine.init_transfer_engine(self.engine.parse_init_info(info))

    def start_weight_update(self):
        self.engine.start_weight_update()

    def update_weights(self, info):
        self.engine.update_weights(info)

    def finish_weight_update(self, weight_version=None):
        self.engine.finish_weight_update()


def main():
    load_general_plugins()
    torch.set_num_threads(1)
    layer_bytes = HIDDEN * HIDDEN * 4
    modes = {"copy": {"copy": True}, "view": {"copy": False}, "staged": {"staged": True}}
    times = {mode: [] for mode in modes}
    trainers, engines = {}, {}
    source_model = Model()
    for mode, flags in modes.items():
        model = Model()
        record_metadata_for_reloading(model)
        engine = WeightTransferEngineFactory.create_engine(
            WeightTransferConfig(backend="wsync"), VllmConfig(), torch.device("cpu"), model)
        engines[mode] = (engine, model)
        trainers[mode] = WeightTransferTrainerFactory.trainer_init(
            WsyncTrainerInitInfo(rank=0, receivers=1, chunk_bytes=layer_bytes, **flags,
                                 options={"bucket_bytes": layer_bytes, "buckets": 2}),
            client=Client(engine), source=ModuleSource(source_model))
    for mode in modes:  # warm up: first-touch of buckets and parameters
        trainers[mode].send_weights()
    for _ in range(REPS):
        for mode in modes:
            start = time.perf_counter()
            trainers[mode].send_weights()
            times[mode].append(time.perf_counter() - start)
    for mode in modes:
        model = engines[mode][1]
        for name, t in source_model.state_dict().items():
            assert torch.equal(model.state_dict()[name], t), (mode, name)
        trainers[mode].shutdown()
        engines[mode][0].shutdown()
    median = {mode: statistics.median(t) for mode, t in times.items()}
    json.dump({"model_bytes": layer_bytes * LAYERS, "layers": LAYERS, "reps": REPS,
               **{f"{mode}_s": round(median[mode], 4) for mode in modes},
               "copy_over_view": round(median["copy"] / median["view"], 3),
               "staged_over_view": round(median["staged"] / median["view"], 3),
               **{f"{mode}_all_s": [round(t, 4) for t in times[mode]] for mode in modes}},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
