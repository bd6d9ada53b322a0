"""Tests of the wsync checkpoint engine against the real verl 0.9.1 (run by
scripts/test-verl.sh, in a venv where verl==0.9.1 and this binding are importable). Not
collected by the binding's own suite (bindings/python/tests), which runs without verl."""

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def versions_line():
    import torch
    import verl

    return f"torch {torch.__version__}, verl {verl.__version__}"


def pytest_report_header(config):
    return versions_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(f"tested with {versions_line()}")


class Side:
    """One trainer or rollout process (_verl_side.py), JSON lines both ways."""

    def __init__(self, role, rank, bucket_mb=1, engine_kwargs=None, log_dir=None):
        self.role, self.rank = role, rank
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.log_path = os.path.join(log_dir or HERE, f"{role}{rank}-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_verl_side.py"), role, str(rank), str(bucket_mb),
             json.dumps(engine_kwargs or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self.pid = self.proc.pid
        self._lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.hello = None

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def get(self, timeout=120):
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.role} {self.rank}: no reply within {timeout} s; log:\n"
                                 + self.log()) from None
        if item is None:
            raise AssertionError(f"{self.role} {self.rank} exited ({self.proc.poll()}); log:\n" + self.log())
        return item

    def ready(self, timeout=180):
        self.hello = self.get(timeout)
        assert self.hello.get("ready"), self.hello
        return self.hello

    def log(self):
        with open(self.log_path) as f:
            return f.read()[-6000:]

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="exit")
                self.get(timeout=30)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()



@pytest.fixture(scope="session")
def log_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("verl-sides"))
