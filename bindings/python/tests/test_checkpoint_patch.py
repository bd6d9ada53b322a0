"""wsync.checkpoint_patch: a sparse patch in checkpoint coordinates applied through a
``load_weights`` that shards and fuses (as vLLM's loaders do), bit for bit, and refused by name
where the loader would move staging elements other than the changed ones (torch only; the
vLLM backend's own tests run it with vLLM's real layers)."""

import pytest
import torch

from wsync.checkpoint_patch import PatchRefused, apply_checkpoint_patch

ROWS = {"q": (0, 4), "k": (4, 2)}  # fused param rows of each checkpoint tensor's shard


class Fused:
    """Rank 1 of 2 of a fused q/k parameter: each checkpoint tensor's second half of rows,
    narrowed and copied into its slice of one parameter (vLLM's QKVParallelLinear pattern)."""

    def __init__(self, how="narrow"):
        self.param = torch.zeros(6, 3)
        self.how = how
        self.calls = 0

    def load_weights(self, weights):
        self.calls += 1
        for name, w in weights:
            off, rows = ROWS[name]
            shard = w.narrow(0, rows, rows)
            if self.how == "clone":
                shard = shard.contiguous().clone()
            elif self.how == "cast":
                shard = shard.to(torch.float64)
            elif self.how == "reinterpret":
                shard = shard.view(torch.int32)
            elif self.how == "setitem":
                self.param[off:off + rows] = shard  # aten.copy_ through a slice: fine
                continue
            self.param.narrow(0, off, rows).copy_(shard)


def bits(t):
    return t.contiguous().view(torch.int32)


def nan_with_payload(payload):
    return torch.tensor([0x7FC00000 | payload], dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("how", ["narrow", "setitem"])
def test_changed_elements_land_bit_for_bit_and_nothing_else_moves(how):
    model = Fused(how)
    model.param.copy_(torch.arange(18, dtype=torch.float32).view(6, 3))
    before = model.param.clone()
    # q is 8x3; rank 1 holds rows 4..7. Element 0 is rank 0's; 13 = (4, 1), 14 = (4, 2), 23 = (7, 2)
    idx = torch.tensor([0, 13, 14, 23], dtype=torch.int32)
    values = torch.cat([torch.tensor([5.0, -0.0, float("inf")]), nan_with_payload(0x123)])
    written = apply_checkpoint_patch(model.load_weights, "q", (8, 3), idx, values)
    assert written == 3
    want = before.clone()
    want[0, 1], want[0, 2], want[3, 2] = values[1], values[2], values[3]
    assert torch.equal(bits(model.param), bits(want))
    assert int(bits(model.param)[3, 2]) == 0x7FC00123  # the payload, not torch's NaN
    assert int(bits(model.param)[0, 1]) == -(1 << 31)  # -0.0


@pytest.mark.parametrize("how,op", [("clone", "aten.clone"), ("cast", "aten._to_copy"),
                                    ("reinterpret", "reinterprets it as torch.int32")])
def test_a_loader_that_moves_the_staging_otherwise_is_refused_by_name_before_writing(how, op):
    model = Fused(how)
    before = model.param.clone()
    with pytest.raises(PatchRefused) as info:
        apply_checkpoint_patch(model.load_weights, "k", (4, 3),
                               torch.tensor([7], dtype=torch.int32), torch.tensor([1.0]))
    assert "checkpoint tensor 'k'" in str(info.value) and op in str(info.value)
    assert torch.equal(model.param, before)


def test_an_empty_patch_loads_nothing_and_a_full_one_is_a_plain_dense_load():
    model = Fused("clone")  # any loader is exact when every element changed
    assert apply_checkpoint_patch(model.load_weights, "k", (4, 3),
                                  torch.zeros(0, dtype=torch.int32), torch.zeros(0)) == 0
    assert model.calls == 0
    full = torch.arange(12, dtype=torch.float32) + 100
    assert apply_checkpoint_patch(model.load_weights, "k", (4, 3),
                                  torch.arange(12, dtype=torch.int32), full) == 12
    assert torch.equal(model.param[4:6], full.view(4, 3)[2:4])


class _NoStorage(torch.Tensor):
    """A wrapper subclass with no storage of its own (as tensor-parallel wrappers make)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(str(func))


@pytest.mark.parametrize("kind", ["sparse", "meta", "no_storage"])
def test_a_staging_whose_storage_cannot_be_identified_is_refused_not_applied_blind(kind):
    # Without the staging's storage address no use of it could be watched: the patch is
    # refused by name (sparse tensors raise NotImplementedError on storage access, a wrapper
    # without storage RuntimeError on torch 2.x and NotImplementedError on 1.13, meta ones have
    # address 0).
    from wsync.checkpoint_patch import _MaskedCopies, _storage_key
    stage = {"sparse": lambda: torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,)),
             "meta": lambda: torch.empty(2, device="meta"),
             "no_storage": lambda: _NoStorage(torch.zeros(2))}[kind]()
    assert _storage_key(stage) is None
    assert _storage_key(torch.zeros(2)) is not None
    with pytest.raises(PatchRefused, match="'w'.*cannot be identified"):
        _MaskedCopies("w", stage, torch.zeros(2, dtype=torch.bool))
