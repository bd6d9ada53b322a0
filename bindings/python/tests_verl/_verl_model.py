"""The weights the tests send: deterministic per seed, several dtypes, tensors larger than a
1 MiB bucket (split into parts), special float values (bit-exact means NaN payloads and -0.0
too)."""

import socket

import torch


def weights(seed: int, fail_after=None, touch: int = 0):
    """A generator of ``(name, tensor)``, as verl's ``get_per_tensor_param`` yields them;
    with ``fail_after`` it raises after that many (a trainer failing mid-version); ``touch``
    changes the first ``touch`` elements of every tensor (a small step, for delta sync)."""
    for count, (name, t) in enumerate(_weights(seed)):
        if fail_after is not None and count >= fail_after:
            raise RuntimeError(f"the trainer failed after {count} tensors")
        if touch:
            flat = t.view(-1)
            flat[:touch] = flat[:touch] + touch
        yield name, t


def _weights(seed: int):
    g = torch.Generator().manual_seed(1000 + seed)

    def rnd(*shape, dtype=torch.float32):
        return (torch.randn(shape, generator=g) * (seed + 1)).to(dtype)

    embed = rnd(600, 1024, dtype=torch.bfloat16)  # 1.2 MiB: two parts of a 1 MiB bucket
    embed.view(-1)[:4] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")],
                                      dtype=torch.bfloat16)
    yield "model.embed_tokens.weight", embed
    for i in range(6):
        yield f"model.layers.{i}.mlp.weight", rnd(128, 256)            # 128 KiB each
        yield f"model.layers.{i}.mlp.bias", rnd(256, dtype=torch.bfloat16)
    yield "model.norm.scale", rnd(dtype=torch.float32)                  # 0-dim
    yield "model.big", rnd(3, 200_000)                                  # 2.3 MiB: three parts
    yield "lm_head.weight", rnd(300, 1000, dtype=torch.float16)
    yield "model.position_ids", torch.arange(7, dtype=torch.int64) * (seed + 3)


def mismatches(expected: dict, got: dict) -> list:
    """Names whose tensor differs from the expected one in name, dtype, shape or any byte."""
    bad = [f"missing {n}" for n in expected if n not in got]
    bad += [f"unexpected {n}" for n in got if n not in expected]
    for name, want in expected.items():
        have = got.get(name)
        if have is None:
            continue
        if have.dtype != want.dtype or tuple(have.shape) != tuple(want.shape):
            bad.append(f"{name}: {have.dtype}{tuple(have.shape)} != {want.dtype}{tuple(want.shape)}")
        elif not torch.equal(have.contiguous().view(-1).view(torch.uint8),
                             want.contiguous().view(-1).view(torch.uint8)):
            bad.append(f"{name}: bytes differ")
    return bad


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
