"""A small decoder-only transformer with the module names real checkpoints use, and helpers to
compare models bit for bit. Shared by the in-process and the multi-process tests."""

import hashlib

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=True)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q = self.q_proj(x).view(b, t, h, d // h).transpose(1, 2)
        k = self.k_proj(x).view(b, t, h, d // h).transpose(1, 2)
        v = self.v_proj(x).view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) / (d // h) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLM(nn.Module):
    """embed_tokens, layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
    mlp.{gate,up,down}_proj}, norm, lm_head; plus a float buffer and an int64 buffer."""

    def __init__(self, vocab=64, dim=32, heads=4, hidden=64, layers=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("rope_inv_freq", 1.0 / (10000 ** (torch.arange(0, dim // heads, 2).float() / (dim // heads))))
        self.register_buffer("trained_steps", torch.zeros((), dtype=torch.int64))

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    def load_weights(self, weights):
        """vLLM-style loader: copies each (name, tensor) into the parameter or buffer of that
        name; returns the names loaded."""
        targets = self.state_dict(keep_vars=True)
        loaded = set()
        with torch.no_grad():
            for name, tensor in weights:
                targets[name].copy_(tensor)
                loaded.add(name)
        return loaded


def train_steps(model, steps, seed=1):
    """Runs `steps` optimizer steps of next-token prediction on random tokens; yields after each."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(1, steps + 1):
        tokens = torch.randint(0, model.lm_head.out_features, (4, 12), generator=g)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.trained_steps += 1
        yield step


def tensor_digest(t) -> str:
    """sha256 over dtype, shape and the raw bytes of a tensor."""
    t = t.detach().cpu().contiguous()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(raw.numpy().tobytes())
    return h.hexdigest()


def model_digests(model, dtype=None) -> dict:
    """{name: digest} of a model's state dict, floating-point tensors cast to `dtype` first."""
    out = {}
    for name, t in model.state_dict().items():
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = tensor_digest(t)
    return out
