"""Tests of the wsync TRL weight transfer (wsync.integrations.trl) against the real
trl==1.16.0 and vllm==0.33.0 (run by scripts/test-trl.sh). A vLLM server process
(``_trl_server.py``: vLLM's own RL HTTP routes and a real vLLM ``Worker`` with the wsync
engine, on CPU) receives; this process is the trainer, with TRL's own ``VLLMClient``."""

import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.modules.setdefault("b12x", None)  # fails to import without CUDA; see _trl_server.py

import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: The server imports vLLM's worker module (tens of seconds on a loaded 2-core host).
START_TIMEOUT_S = 300


def versions_line():
    import torch
    import trl
    import vllm

    return f"torch {torch.__version__}, vllm {vllm.__version__}, trl {trl.__version__}"


def pytest_report_header(config):
    return versions_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(f"tested with {versions_line()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``_trl_server.py`` process on a port; ``start()`` again after ``kill()`` restarts it
    on the same port (the same URL, as a restarted ``vllm serve`` would be)."""

    def __init__(self, model_dir: str, port: int = 0):
        self.model_dir = model_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_trl_server.py"),
                                      str(self.port), self.model_dir], env=env)
        return self

    def wait_ready(self, timeout=START_TIMEOUT_S):
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the server at {self.url} did not answer in {timeout} s")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from _trl_models import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session", autouse=True)
def accelerate_state():
    """TRL's ``VLLMClient`` logs through accelerate, which needs its state (the trainer's
    ``Accelerator`` makes it)."""
    from accelerate import PartialState

    return PartialState()


@pytest.fixture(scope="session")
def server(model_dir):
    """One server for the session (a test that kills it restarts it on the same port)."""
    srv = Server(model_dir).start()
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def digests(model) -> dict:
    """vLLM's per-tensor digests (``/weight_checker``'s) of a trainer-side model, keyed as the
    server's single worker keys them."""
    from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests

    return {f"dp0:pp0:pcp0:tp0:{n}": d for n, d in compute_tensor_digests(model).items()}


def served_matches(server, model) -> dict:
    """vLLM's ``/weight_checker`` compare of the served model against ``model``."""
    import requests

    reply = requests.post(f"{server.url}/weight_checker",
                          json={"action": "compare", "baseline": digests(model)}, timeout=60)
    reply.raise_for_status()
    return reply.json()
