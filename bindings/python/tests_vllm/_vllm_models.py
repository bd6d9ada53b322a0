"""The small model the vLLM backend tests sync (imported by the tests and the worker
processes)."""

import torch
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

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
