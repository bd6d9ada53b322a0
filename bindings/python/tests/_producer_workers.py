"""Engine processes for test_producers.py: each builds its own model, loads every forwarded
request with a strict ModuleLoader and reports what it received (per chunk: tensor count and
bytes, from RecvInfo) and its weights, raw bytes per name. Every wait has a timeout; a
failure goes back to the controller as text."""

import traceback

import torch

import wsync
from wsync.engine import ModuleLoader
from _models import TinyLM
from _mp_workers import snapshot

WAIT_S = 60


class TiedLM(torch.nn.Module):
    """GPT-2's layout in small: a token embedding ``wte`` and an ``lm_head`` that is the same
    parameter when ``tied`` (``lm_head.weight is wte.weight``), a separate one otherwise."""

    def __init__(self, tied=True, vocab=256, dim=64, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.wte = torch.nn.Embedding(vocab, dim)
        self.h = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.ln_f = torch.nn.LayerNorm(dim)
        self.lm_head = torch.nn.Linear(dim, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight


def build(spec):
    kind, kwargs = spec
    if kind == "tied":
        return TiedLM(tied=True, **kwargs)
    if kind == "untied":
        return TiedLM(tied=False, **kwargs)
    if kind == "tinylm":
        return TinyLM(**kwargs)
    raise ValueError(f"unknown model kind {kind!r}")


def engine_main(index, spec, inbox, outbox):
    torch.set_num_threads(1)
    strategy = receiver = None
    try:
        model = build(spec)
        msg = inbox.get(timeout=WAIT_S)
        assert msg[0] == "init", msg[0]
        strategy = wsync.Strategy.for_init_info(msg[1])
        receiver = strategy.receiver(msg[1], index)
        loader = ModuleLoader(model)  # strict: every name of the module must be loaded
        outbox.put(("ready", index))
        chunks, errors = [], []
        while True:
            msg = inbox.get(timeout=WAIT_S)
            if msg[0] == "request":
                try:
                    info = loader.load(receiver, msg[1])
                    chunks.append((info.count, info.bytes))
                except wsync.WsyncError as exc:
                    errors.append((int(exc.status), exc.message))
            elif msg[0] == "check":
                tied = getattr(model, "lm_head", None) is not None and \
                    getattr(model, "wte", None) is not None and model.lm_head.weight is model.wte.weight
                outbox.put(("report", index, receiver.completed_version, chunks, snapshot(model),
                            tied, errors))
                chunks, errors = [], []
            elif msg[0] == "stop":
                break
            else:
                raise RuntimeError(f"unexpected message {msg[0]!r}")
    except BaseException:
        outbox.put(("error", f"engine {index}", traceback.format_exc()))
    finally:
        if receiver is not None:
            receiver.close()
        if strategy is not None:
            strategy.close()
