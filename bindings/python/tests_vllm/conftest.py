"""Tests of the wsync vLLM backend against the real vLLM 0.33.0 (run by scripts/test-vllm.sh,
in a venv where vllm==0.33.0 and this binding are installed). Not collected by the binding's
own suite (bindings/python/tests), which runs without vLLM."""

import os

# vLLM cannot infer a device on a host without a GPU; its config needs to be told.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")



def versions_line():
    """The versions under test: vllm (the suite pins 0.33.0) and the torch it pins."""
    import torch
    import vllm

    return f"torch {torch.__version__}, vllm {vllm.__version__}"


def pytest_report_header(config):
    """On pytest's header (hidden by -q)."""
    return versions_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Also at the end, which -q (as scripts/test-vllm.sh runs it) still shows."""
    terminalreporter.write_line(f"tested with {versions_line()}")
