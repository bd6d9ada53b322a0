"""The vLLM backend's former home, kept so that ``import wsync.vllm_backend`` and entry points
written as ``wsync.vllm_backend:register`` keep working: the module lives in
:mod:`wsync.integrations.vllm`, and this name is that same module object (so attributes set or
patched through either name are seen through both). Imports vLLM, like the module itself."""

import sys

from .integrations import vllm as _vllm

sys.modules[__name__] = _vllm
