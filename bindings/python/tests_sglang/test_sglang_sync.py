"""wsync.integrations.sglang against SGLang 0.5.23's own weight-update path on CPU (see
_sglang_engine.py for what is SGLang's): several versions bit-exact through SGLang's custom
loader, failed versions (a shape or a name SGLang's model refuses, a trainer killed
mid-version, an engine killed or stalled mid-version) named to the trainer and leaving the
engine serving the last complete version, and the next version arriving."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import wsync
from conftest import HERE, served_matches, tiny_trainer_model
from wsync.integrations.sglang import LOADER, PAYLOAD_NAME, SGLangWeightSync, decode_payload, encode_payload

#: Small chunks: a version of the tiny model is several chunks, its embedding split in parts.
CHUNK_BYTES = 4096
#: How long the trainer's call may take to report a dead or stalled engine.
DEADLINE_S = 30


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def state(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


@pytest.fixture
def sync(engine):
    s = SGLangWeightSync(engine.url, chunk_bytes=CHUNK_BYTES, flush_timeout_s=20.0,
                         http_timeout_s=60.0)
    s.init()
    yield s
    s.destroy()


def test_the_payload_passes_sglangs_own_safe_unpickler():
    from sglang.srt.utils.common import MultiprocessingSerializer, normalize_serialized_named_tensor_payloads

    payload = {"init_info": "AAEC", "index": 3, "requests": ["BAUG"], "options": {"a": 1}}
    raw = normalize_serialized_named_tensor_payloads([encode_payload(payload)])[0]
    pairs = MultiprocessingSerializer.deserialize(raw)
    assert [n for n, _ in pairs] == [PAYLOAD_NAME]
    assert decode_payload(pairs) == payload


def test_the_loader_is_what_sglangs_weight_updater_imports_by_its_dotted_name():
    from sglang.srt.utils import dynamic_import

    import wsync.integrations.sglang as module

    assert dynamic_import(LOADER) is module.load_weights


def test_several_versions_arrive_bit_exact_through_sglangs_custom_loader(engine, sync):
    model = tiny_trainer_model()
    versions = []
    for _ in range(3):
        perturb(model)
        versions.append(sync.update(model.state_dict()))
        assert served_matches(engine, state(model)) == []
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_sglangs_cache_is_flushed_once_per_served_version_and_never_for_a_failed_one(engine, sync):
    model = tiny_trainer_model()
    before = engine.flushes()
    sync.update(model.state_dict())
    assert engine.flushes() == before + 1
    bad = state(model)
    bad["lm_head.weight"] = bad["lm_head.weight"].t().contiguous()
    with pytest.raises(wsync.WsyncError):
        sync.update(bad)
    assert engine.flushes() == before + 1


def test_a_shape_sglang_refuses_fails_the_version_by_name_and_the_previous_one_stays_served(
        engine, sync):
    model = tiny_trainer_model()
    sync.update(model.state_dict())
    good = state(model)
    perturb(model)
    bad = state(model)
    # The last tensor (lm_head) transposed: SGLang's loader has written every other tensor of
    # the version when it refuses this one, so the snapshot must put them all back.
    bad["lm_head.weight"] = bad["lm_head.weight"].t().contiguous()
    with pytest.raises(wsync.WsyncError) as caught:
        sync.update(bad)
    text = str(caught.value)
    assert caught.value.status == wsync.Status.PEER
    assert engine.url in text and "receiver 0" in text and "'lm_head.weight'" in text
    assert f"pid {engine.proc.pid}" in text and "MISMATCH" in text
    assert engine.alive()
    assert served_matches(engine, good) == []
    perturb(model)
    sync.update(model.state_dict())
    assert served_matches(engine, state(model)) == []


def test_a_name_sglang_does_not_know_fails_the_version_by_name_and_the_previous_one_stays_served(
        engine, sync):
    model = tiny_trainer_model()
    sync.update(model.state_dict())
    good = state(model)
    perturb(model)
    bad = state(model)
    bad["model.layers.1.mlp.down_proj.weightt"] = bad.pop("model.layers.1.mlp.down_proj.weight")
    with pytest.raises(wsync.WsyncError) as caught:
        sync.update(bad)
    assert "'model.layers.1.mlp.down_proj.weightt'" in str(caught.value)
    assert served_matches(engine, good) == []
    sync.update(model.state_dict())
    assert served_matches(engine, state(model)) == []


def test_a_trainer_killed_mid_version_leaves_the_previous_version_served_and_a_new_trainer_takes_over(
        engine, tmp_path):
    """Ten chunks of the second version reached the engine (whole tensors among them): staged,
    never loaded."""
    out = str(tmp_path / "v1.pt")
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    trainer = subprocess.run([sys.executable, os.path.join(HERE, "_sglang_trainer.py"),
                              engine.url, out], env=env, timeout=300)
    assert trainer.returncode == -signal.SIGKILL
    assert served_matches(engine, torch.load(out, weights_only=True)) == []
    model = tiny_trainer_model(seed=8)
    s = SGLangWeightSync(engine.url, chunk_bytes=CHUNK_BYTES, flush_timeout_s=20.0)
    s.init()
    try:
        s.update(model.state_dict())  # closes the session the dead trainer left open
        assert served_matches(engine, state(model)) == []
    finally:
        s.destroy()


def test_the_engine_killed_mid_version_is_named_within_a_deadline_and_a_restarted_one_takes_the_next(
        engine, sync):
    model = tiny_trainer_model()
    sync.update(model.state_dict())
    pid = engine.proc.pid
    post, calls = sync._post_tensor, []

    def killing(*args, **kwargs):
        if len(calls) == 2:
            engine.kill()
        calls.append(1)
        return post(*args, **kwargs)

    sync._post_tensor = killing
    perturb(model)
    began = time.monotonic()
    with pytest.raises(wsync.WsyncError) as caught:
        sync.update(model.state_dict())
    assert time.monotonic() - began < DEADLINE_S
    text = str(caught.value)
    assert engine.url in text and "receiver 0" in text and f"pid {pid}" in text and "died" in text
    assert isinstance(caught.value.__cause__.__cause__, RuntimeError)  # the failed HTTP call
    sync._post_tensor = post
    engine.start()
    perturb(model)
    sync.update(model.state_dict())
    assert served_matches(engine, state(model)) == []


def test_a_stalled_engine_times_out_once_and_the_next_version_closes_its_session(engine, sync):
    model = tiny_trainer_model()
    sync.update(model.state_dict())
    good = state(model)
    sync.http_timeout_s = 3.0
    post, calls = sync._post_tensor, []

    def stalling(*args, **kwargs):
        if len(calls) == 1:
            engine.proc.send_signal(signal.SIGSTOP)
        calls.append(1)
        return post(*args, **kwargs)

    sync._post_tensor = stalling
    perturb(model)
    began = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        sync.update(model.state_dict())
    waited = time.monotonic() - began
    engine.proc.send_signal(signal.SIGCONT)
    assert engine.url in str(caught.value)
    assert waited < 3.0 * 2  # one bounded wait, not a second one on the stalled server
    sync._post_tensor = post
    sync.http_timeout_s = 60.0
    assert served_matches(engine, good) == []
    perturb(model)
    sync.update(model.state_dict())
    assert served_matches(engine, state(model)) == []


def test_update_before_init_or_after_destroy_is_refused_and_destroy_is_idempotent(engine):
    s = SGLangWeightSync(engine.url)
    model = tiny_trainer_model()
    with pytest.raises(wsync.WsyncError) as caught:
        s.update(model.state_dict())
    assert caught.value.status == wsync.Status.WRONG_STATE
    s.init()
    s.update(model.state_dict())
    s.destroy()
    s.destroy()
    with pytest.raises(wsync.WsyncError):
        s.update(model.state_dict())
