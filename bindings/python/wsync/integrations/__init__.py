"""Adapters that plug libwsync into RL frameworks and inference engines, one module each.

- :mod:`wsync.integrations.vllm`: the ``wsync`` weight-transfer backend for vLLM 0.33.0
  (registered by this package's ``vllm.general_plugins`` entry point).
- :mod:`wsync.integrations.verl`: the ``wsync`` checkpoint engine for verl 0.9.1 (registered in
  verl's ``CheckpointEngineRegistry`` when verl imports it as ``custom_backend_module``).
- :mod:`wsync.integrations.trl`: ``WsyncWeightTransfer``, the ``weight_transfer`` of TRL
  1.16.0's ``AsyncGRPOTrainer``, driving a vLLM server that runs the backend above.
- :mod:`wsync.integrations.sglang`: a custom weight loader for SGLang 0.5.23
  (``--custom-weight-loader``, used by ``update_weights_from_tensor``) and
  ``SGLangWeightSync``, the trainer side over SGLang's HTTP weight-update session.

Each module imports its framework (the SGLang one only torch: its loader runs inside SGLang's
process); import a module only where that framework is installed.
This package itself imports none of them.
"""
