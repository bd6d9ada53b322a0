"""Tests of the wsync SGLang loader and trainer helper (wsync.integrations.sglang) against the
real sglang==0.5.23 (run by scripts/test-sglang.sh). An engine process (``_sglang_engine.py``:
SGLang's own model, weight-update stack and custom-loader path, on CPU) receives; this
process is the trainer."""

import base64
import io
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
#: The engine imports SGLang (tens of seconds on a loaded 2-core host).
START_TIMEOUT_S = 300


def versions_line():
    import importlib.metadata as m

    return (f"torch {torch.__version__}, sglang {m.version('sglang')}, "
            f"transformers {m.version('transformers')}")


def pytest_report_header(config):
    return versions_line()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    """A ``_sglang_engine.py`` process; ``start()`` after ``kill()`` restarts it on the same
    port (the same URL, as a restarted SGLang server would be)."""

    def __init__(self):
        self.port, self.dist_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_sglang_engine.py"), str(self.port),
             str(self.dist_port)], env=env, stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        for line in self.proc.stdout:
            if line.startswith("READY"):
                return self
            if time.monotonic() > deadline:
                break
        self.kill()
        raise RuntimeError(f"the SGLang engine process did not start (exit {self.proc.poll()})")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def flushes(self) -> int:
        """How many cache flushes SGLang's weight-update manager asked for so far."""
        return requests.get(f"{self.url}/test/flushes", timeout=60).json()["flushes"]

    def weights(self):
        """The engine model's parameters (SGLang's names and layout)."""
        body = requests.get(f"{self.url}/test/weights", timeout=60).json()
        return torch.load(io.BytesIO(base64.b64decode(body["weights"])), weights_only=True)


@pytest.fixture(scope="module")
def engine():
    e = Engine().start()
    yield e
    e.kill()


def tiny_trainer_model(seed: int = 0):
    """The trainer's model: transformers' Qwen2 with the engine's config (checkpoint names)."""
    from transformers import Qwen2ForCausalLM

    from _sglang_engine import tiny_config

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config())


def sglang_layout(state):
    """A checkpoint state dict as SGLang's Qwen2 holds it: q/k/v stacked into ``qkv_proj``,
    gate/up into ``gate_up_proj`` (SGLang's ``stacked_params_mapping``)."""
    out = {}
    for name, t in state.items():
        for parts, fused in ((("q_proj", "k_proj", "v_proj"), "qkv_proj"),
                             (("gate_proj", "up_proj"), "gate_up_proj")):
            if f".{parts[0]}." in name:
                out[name.replace(parts[0], fused)] = torch.cat(
                    [state[name.replace(parts[0], p)] for p in parts])
                break
        else:
            if not any(f".{p}." in name for p in ("k_proj", "v_proj", "up_proj")):
                out[name] = t.detach().clone()
    return out


def served_matches(engine, state) -> list:
    """Names whose served values differ bit-wise from ``state`` (a checkpoint state dict), and
    names one side lacks; empty when the engine serves exactly ``state``."""
    want, got = sglang_layout(state), engine.weights()
    bad = sorted(set(want) ^ set(got))
    bad += [n for n in sorted(set(want) & set(got))
            if want[n].dtype != got[n].dtype or not torch.equal(want[n].view(torch.uint8),
                                                                got[n].view(torch.uint8))]
    return bad
