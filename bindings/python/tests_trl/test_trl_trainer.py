"""TRL's own ``AsyncGRPOTrainer`` (trl 1.16.0) drives WsyncWeightTransfer, as far as it runs
on CPU: its constructor, ``train()``'s train-begin callback (``init_weight_transfer``, then
the cold sync ``_sync_weight``: ``pause`` -> ``send_weights(self._streaming_iter())`` ->
``resume``), its periodic sync (the ``StepIntervalCallback`` of ``weight_sync_steps``), and
``destroy`` in ``train()``'s ``finally``.

Where it stops on CPU, and what stands in:
- ``AsyncGRPOTrainer.__init__`` asks CUDA for the device name to estimate peak FLOPs
  (``get_peak_flops_per_device``, metrics only); that one function is replaced by a constant.
- Generation is vLLM's (``AsyncRolloutWorker`` posts to ``/v1/completions`` of a GPU vLLM
  server), and training steps use TRL's tree attention (FA3 kernels from the Hub). Neither
  runs here: the rollout worker is one injected through the trainer's ``rollout_worker``
  argument (TRL's API for it), which records model versions and, for ``train()``, refuses to
  start, so ``train()`` ends right after the cold sync, through TRL's ``finally``.
"""

import pytest
import torch

from conftest import served_matches
from _trl_models import tokenizer
from datasets import Dataset
import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from wsync.integrations.trl import WsyncWeightTransfer


class NoGenerationOnCpu(RuntimeError):
    pass


class RolloutWorker:
    """TRL's ``RolloutWorkerProtocol``, without generation (it needs a GPU vLLM server)."""

    def __init__(self, refuse_start=False):
        import queue

        self.rollout_buffer = queue.Queue()
        self.refuse_start = refuse_start
        self.versions = []
        self.stopped = False

    def start(self):
        if self.refuse_start:
            raise NoGenerationOnCpu("generation needs vLLM on a GPU")

    def stop(self):
        self.stopped = True

    def update_model_version(self, version):
        self.versions.append(version)

    def check_health(self, stale_after_s):
        pass


@pytest.fixture
def cpu_trainer(monkeypatch, tmp_path, model_dir, server):
    monkeypatch.setattr(trainer_module, "get_peak_flops_per_device", lambda acc, dtype: float("nan"))

    def make(rollout_worker):
        args = AsyncGRPOConfig(output_dir=str(tmp_path), max_steps=2, report_to="none",
                               use_cpu=True, bf16=False, dtype="float32",
                               per_device_train_batch_size=2, num_generations=2,
                               vllm_server_base_url=server.url, weight_sync_steps=1,
                               token_budget=256)  # else train() asks /v1/models (generation)
        transfer = WsyncWeightTransfer.from_pretrained(
            server.url, model_dir, dtype=args.dtype, chunk_bytes=4096,
            weight_sync_timeout=args.weight_sync_timeout)
        trainer = AsyncGRPOTrainer(
            model=model_dir, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args, train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "w1 w2"}]] * 4}),
            processing_class=tokenizer(), rollout_worker=rollout_worker, weight_transfer=transfer)
        assert trainer.weight_transfer is transfer
        return trainer, transfer

    return make


def served_model(trainer):
    return trainer.accelerator.unwrap_model(trainer.model)


def test_train_syncs_the_initial_policy_bit_exact_and_destroys_the_transfer_in_its_finally(
        cpu_trainer, server):
    worker = RolloutWorker(refuse_start=True)
    trainer, transfer = cpu_trainer(worker)
    with torch.no_grad():  # a policy the server does not already hold
        for p in served_model(trainer).parameters():
            p.add_(torch.randn_like(p))
    with pytest.raises(NoGenerationOnCpu):
        trainer.train()
    assert served_matches(server, served_model(trainer))["match"]
    assert worker.stopped and transfer.engine is None  # TRL's finally: stop(), destroy()


def test_the_trainers_periodic_syncs_reach_the_engine_bit_exact(cpu_trainer, server):
    worker = RolloutWorker()
    trainer, transfer = cpu_trainer(worker)
    try:
        trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)
        assert transfer.engine is not None and worker.versions == [1]
        assert served_matches(server, served_model(trainer))["match"]
        for step in (1, 2):
            with torch.no_grad():  # what an optimizer step would change
                for p in served_model(trainer).parameters():
                    p.add_(torch.randn_like(p) * 1e-2)
            trainer.state.global_step = step
            trainer._sync_weight()  # what StepIntervalCallback calls every weight_sync_steps
            assert served_matches(server, served_model(trainer)) == {"match": True, "mismatches": []}
        assert worker.versions == [1, 2, 3]
    finally:
        transfer.destroy()
