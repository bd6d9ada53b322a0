"""The worker processes' entry point, importable without vLLM (the trainer process pickles a
reference to it; the worker process imports the heavy part)."""


def run_worker(conn, rank: int, world_size: int) -> None:
    import _vllm_worker

    _vllm_worker.serve(conn, rank, world_size)


def run_tp_worker(conn, rank: int, world_size: int, port: int) -> None:
    import _vllm_tp_worker

    _vllm_tp_worker.serve(conn, rank, world_size, port)
