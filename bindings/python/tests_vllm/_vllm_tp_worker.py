"""A vLLM worker process at tensor-parallel size 2 (gloo, CPU) holding :class:`LlamaLike` with
vLLM's own parallel layers, so each rank loads its shard of every checkpoint tensor; driven
through a pipe like ``_vllm_worker`` (``(method, args)`` -> ``("ok", result)`` or
``("error", type name, message)``)."""

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.modules.setdefault("b12x", None)  # as in _vllm_worker: not importable without CUDA


def serve(conn, rank: int, world_size: int, port: int) -> None:
    import copy

    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory
    from vllm.plugins import load_general_plugins

    from _vllm_models import LlamaLike

    torch.set_num_threads(1)
    load_general_plugins()
    vc = copy.deepcopy(VllmConfig())
    vc.parallel_config.rank = rank
    vc.parallel_config.world_size = world_size
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     backend="gloo")
        initialize_model_parallel(world_size)
        model = LlamaLike()
    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="wsync"), vc, torch.device("cpu"), model)
    conn.send(("ok", rank))
    while True:
        method, args = conn.recv()
        try:
            if method == "stop":
                engine.shutdown()
                conn.send(("ok", None))
                return
            if method == "init_weight_transfer_engine":
                result = engine.init_transfer_engine(engine.parse_init_info(args[0]))
            elif method in ("start_weight_update", "update_weights", "finish_weight_update"):
                result = getattr(engine, method)(*args)
            elif method == "params":
                result = {n: p.detach().clone() for n, p in model.named_parameters()}
            elif method == "completed_version":
                result = engine.completed_version
            else:
                raise ValueError(f"unknown method {method}")
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)))
        else:
            conn.send(("ok", result))
