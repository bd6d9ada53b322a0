"""Tests of the wsync vLLM backend against the real vLLM 0.33.0 (run by scripts/test-vllm.sh,
in a venv where vllm==0.33.0 and this binding are installed). Not collected by the binding's
own suite (bindings/python/tests), which runs without vLLM."""

import os

# vLLM cannot infer a device on a host without a GPU; its config needs to be told.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
