"""The small model the vLLM backend tests sync (imported by the tests and the worker
processes)."""

import torch
from vllm.model_executor.model_loader.weight_utils import default_weight_loader


def _no_missing_cpu_gemm():
    """The PyPI vllm==0.33.0 wheel is a CUDA build: its ``_C`` has no CPU sgl-kernel GEMM ops,
    yet on a host with AMX tiles (Sapphire Rapids and later) vLLM's CPU linear-layer dispatch
    (model_executor/layers/utils.py, ``check_cpu_sgl_kernel``) picks them when a layer's weights
    are processed after loading, and ``torch.ops._C.convert_weight_packed`` raises
    AttributeError (CI on such a host, 2026-12-06). Where that op is missing the dispatch is told
    the kernel does not apply, so the layers use the GEMM they use on hosts without AMX; which
    GEMM serves does not change how weights reach them, which is what these tests check."""
    try:
        torch.ops._C.convert_weight_packed  # noqa: B018 - the lookup is the check
    except (AttributeError, RuntimeError):
        import vllm.model_executor.layers.utils as layer_utils

        layer_utils.check_cpu_sgl_kernel = lambda *args, **kwargs: False


_no_missing_cpu_gemm()

HIDDEN = 32


class TiedModel(torch.nn.Module):
    """Embedding tied to the LM head, two linear layers, and a vLLM-style ``load_weights``
    that raises at the tensor named ``fail_on`` (a checkpoint tensor the model cannot place)."""

    def __init__(self, fail_on=None, vocab=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, HIDDEN)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(2)])
        self.lm_head = torch.nn.Linear(HIDDEN, vocab, bias=False)
        self.lm_head.weight = self.embed.weight
        self.fail_on = fail_on

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            if name == self.fail_on:
                raise KeyError(f"checkpoint tensor {name} has no home in this model")
            if name == "lm_head.weight":
                name = "embed.weight"
            p = params[name]
            getattr(p, "weight_loader", default_weight_loader)(p, w)
            loaded.add(name)
        return loaded


class CheckpointLike(torch.nn.Module):
    """The trainer's side of :class:`LlamaLike`: one tensor per checkpoint name (separate
    q/k/v and gate/up projections, an embedding of ``vocab`` rows)."""

    def __init__(self, vocab=100, hidden=HIDDEN, head_dim=8, heads=4, kv_heads=2, inter=64,
                 dtype=torch.bfloat16):
        super().__init__()
        lin = lambda i, o, bias=False: torch.nn.Linear(i, o, bias=bias, dtype=dtype)  # noqa: E731
        self.embed_tokens = torch.nn.Embedding(vocab, hidden, dtype=dtype)
        self.q_proj = lin(hidden, heads * head_dim, True)
        self.k_proj = lin(hidden, kv_heads * head_dim, True)
        self.v_proj = lin(hidden, kv_heads * head_dim, True)
        self.o_proj = lin(heads * head_dim, hidden)
        self.gate_proj = lin(hidden, inter)
        self.up_proj = lin(hidden, inter)
        self.down_proj = lin(inter, hidden)
        self.norm = torch.nn.Parameter(torch.ones(hidden, dtype=dtype))


class LlamaLike(torch.nn.Module):
    """vLLM's own layers (tensor parallel size 1, so the process must have initialised vLLM's
    distributed state): a padded vocab-parallel embedding, a fused QKV projection with bias, a
    merged gate/up projection, row-parallel o/down projections and a plain norm, loaded by a
    ``load_weights`` with vLLM llama.py's stacked-parameter mapping, so every checkpoint tensor
    reaches its parameter through vLLM's real weight loaders (narrowed into a fused slice).
    ``clone_in_loader`` makes the norm's loader copy the checkpoint tensor first (a loader a
    sparse patch cannot go through exactly)."""

    STACKED = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"),
               ("qkv_proj", "v_proj", "v"), ("gate_up_proj", "gate_proj", 0),
               ("gate_up_proj", "up_proj", 1)]

    def __init__(self, vocab=100, hidden=HIDDEN, head_dim=8, heads=4, kv_heads=2, inter=64,
                 dtype=torch.bfloat16, clone_in_loader=False):
        super().__init__()
        from vllm.model_executor.layers.linear import (
            MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear)
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        self.embed_tokens = VocabParallelEmbedding(vocab, hidden, params_dtype=dtype)
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, kv_heads, bias=True,
                                          params_dtype=dtype)
        self.o_proj = RowParallelLinear(heads * head_dim, hidden, bias=False, params_dtype=dtype)
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [inter, inter], bias=False,
                                                       params_dtype=dtype)
        self.down_proj = RowParallelLinear(inter, hidden, bias=False, params_dtype=dtype)
        self.norm = torch.nn.Parameter(torch.zeros(hidden, dtype=dtype))
        self.clone_in_loader = clone_in_loader

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            for param_name, shard_name, shard_id in self.STACKED:
                if shard_name in name:
                    name = name.replace(shard_name, param_name)
                    p = params[name]
                    p.weight_loader(p, w, shard_id)
                    break
            else:
                p = params[name]
                if name == "norm" and self.clone_in_loader:
                    w = w.clone()
                getattr(p, "weight_loader", default_weight_loader)(p, w)
            loaded.add(name)
        return loaded

    def expected_from(self, source):
        """This model's parameters as a dense load of ``source`` (a CheckpointLike) gives
        them: name -> tensor (the embedding's padding rows left out)."""
        s = dict(source.named_parameters())
        cat = lambda *names: torch.cat([s[n].detach() for n in names])  # noqa: E731
        return {
            "embed_tokens.weight": s["embed_tokens.weight"].detach(),
            "qkv_proj.weight": cat("q_proj.weight", "k_proj.weight", "v_proj.weight"),
            "qkv_proj.bias": cat("q_proj.bias", "k_proj.bias", "v_proj.bias"),
            "o_proj.weight": s["o_proj.weight"].detach(),
            "gate_up_proj.weight": cat("gate_proj.weight", "up_proj.weight"),
            "down_proj.weight": s["down_proj.weight"].detach(),
            "norm": s["norm"].detach(),
        }
