"""The code blocks of README.md and bindings/python/README.md, run as they are written (issue 39:
the first README example a user tried did not compile).

`blocks(path, lang)` reads a README's fenced blocks of one language. The scenarios below give
each block what it leaves to the reader (a model, `forward_to_engines`, the requests) and run it:
in-process by tests/test_readme.py, and as one side of a cross-language sync from the Rust
binding's tests (bindings/rust/wsync/tests/readme.rs), which run this file as a script:

    python3 readme_blocks.py top-trainer DIR      # README.md's Python trainer, 2 engines
    python3 readme_blocks.py top-engine DIR INDEX # README.md's Python engine
    python3 readme_blocks.py trainer DIR          # bindings/python/README.md's trainer
    python3 readme_blocks.py engine DIR INDEX     # bindings/python/README.md's engine
    python3 readme_blocks.py send DIR SPEC_JSON   # a plain Python trainer sending given tensors

Peers talk through files in DIR: `init`, `req-0000`, `req-0001`, ..., then `done`; an engine
writes what it loaded as `loaded-INDEX-NAME` and a trainer what it sent as `expected-NAME`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TOP_README = REPO / "README.md"
PY_README = REPO / "bindings" / "python" / "README.md"

if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))


class Block(NamedTuple):
    path: Path
    line: int  # of the opening fence, 1-based
    heading: str  # the nearest heading above it
    code: str

    def run(self, ns: dict) -> dict:
        exec(compile(self.code, f"{self.path.name}:{self.line + 1}", "exec"), ns)
        return ns

    async def run_async(self, ns: dict) -> dict:
        """For a block with a top-level `await`: runs as the body of a coroutine."""
        body = "async def __readme_block__():\n" + textwrap.indent(self.code, "    ") + \
               "\n    return locals()\n"
        exec(compile(body, f"{self.path.name}:{self.line + 1}", "exec"), ns)
        ns.update(await ns["__readme_block__"]())
        return ns


def blocks(path: Path, lang: str) -> List[Block]:
    """Every ```lang block of `path`, dedented as far as its fence is."""
    out: List[Block] = []
    heading, inside, start, indent, body = "", None, 0, 0, []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        stripped = line.strip()
        if inside is None:
            if stripped.startswith("```"):
                inside, start, indent, body = stripped[3:].strip(), n, len(line) - len(line.lstrip()), []
            elif line.startswith("#"):
                heading = line.lstrip("#").strip()
            continue
        if stripped == "```":
            if inside == lang:
                out.append(Block(Path(path), start, heading, "\n".join(body) + "\n"))
            inside = None
            continue
        body.append(line[indent:] if line[:indent].strip() == "" else line)
    return out


def python_blocks(path: Path) -> List[Block]:
    """The Python blocks of `path` but those of the vLLM sections, which need vLLM itself and
    are run by scripts/test-vllm.sh's tests."""
    return [b for b in blocks(path, "python") if "vllm" not in b.heading.lower()]


# -- peers through files ----------------------------------------------------------------------

def _put(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _wait_for(path: Path, timeout_s: float = 120) -> bytes:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.005)
    return path.read_bytes()


class Outbox:
    """A trainer's side: `forward(request)` writes the next request (and the init info first,
    read from the block's own `init` variable, as a controller would forward it)."""

    def __init__(self, d: Path, ns: dict = None):
        self.d, self.ns, self.n = Path(d), ns, 0

    def init(self, data: bytes) -> None:
        _put(self.d / "init", bytes(data))

    def forward(self, request: bytes) -> None:
        if self.n == 0 and self.ns is not None and not (self.d / "init").exists():
            self.init(self.ns["init"])
        _put(self.d / f"req-{self.n:04d}", bytes(request))
        self.n += 1

    def done(self) -> None:
        _put(self.d / "done", b"")


def inbox(d: Path, timeout_s: float = 120) -> Iterator[bytes]:
    """An engine's side: the requests in order, as they come, until the trainer is done."""
    d, n = Path(d), 0
    deadline = time.monotonic() + timeout_s
    while True:
        path = d / f"req-{n:04d}"
        if path.exists():
            yield path.read_bytes()
            n += 1
            deadline = time.monotonic() + timeout_s
        elif (d / "done").exists():
            if not path.exists():
                return
        elif time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} in {d} within {timeout_s} s")
        else:
            time.sleep(0.002)


# -- models -----------------------------------------------------------------------------------

def small_model():
    """The trainer's model of the trainer scenarios: embed.weight (64, 32), proj.weight (32, 32),
    proj.bias (32), float32 (the blocks send it as bfloat16)."""
    import torch
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"embed": torch.nn.Embedding(64, 32),
                                "proj": torch.nn.Linear(32, 32)})


def train_one_step(model) -> None:
    import torch
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def top_engine_model():
    """What README.md's Rust trainer sends: "w", float32 (64, 64)."""
    import torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(64, 64))
    return M()


def rust_trainer_model():
    """What bindings/rust/README.md's trainer sends: layers.0.attn.q.weight float32
    (4096, 4096) and layers.0.mlp.up.weight bfloat16 (11008, 4096)."""
    import torch
    nn = torch.nn
    attn = nn.Module()
    attn.q = nn.Linear(4096, 4096, bias=False)
    mlp = nn.Module()
    mlp.up = nn.Linear(4096, 11008, bias=False).to(torch.bfloat16)
    layer = nn.Module()
    layer.attn, layer.mlp = attn, mlp
    model = nn.Module()
    model.layers = nn.ModuleList([layer])
    for p in model.parameters():
        p.requires_grad_(False).zero_()
    return model


def raw_bytes(t) -> bytes:
    import torch
    t = t.detach().contiguous().cpu()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_expected(d: Path, model, dtype=None) -> None:
    for name, t in model.state_dict().items():
        _put(Path(d) / f"expected-{name}", raw_bytes(t.to(dtype) if dtype is not None else t))


def write_loaded(d: Path, index: int, model) -> None:
    for name, t in model.state_dict().items():
        _put(Path(d) / f"loaded-{index}-{name}", raw_bytes(t))


# -- scenarios --------------------------------------------------------------------------------

def top_trainer(d: Path) -> dict:
    """README.md's Python trainer block (receivers=2, one step), forwarding through `d`."""
    import torch
    block = python_blocks(TOP_README)[0]
    ns = {"steps": 1, "model": small_model(), "train_one_step": train_one_step}
    out = Outbox(d, ns)
    ns["forward_to_engines"] = out.forward
    block.run(ns)
    write_expected(d, ns["model"], torch.bfloat16)
    out.done()
    return ns


def top_engine(d: Path, index: int) -> dict:
    """README.md's Python engine block, fed from `d`."""
    block = python_blocks(TOP_README)[1]
    ns = {"init": _wait_for(Path(d) / "init"), "my_index": index, "model": top_engine_model(),
          "forwarded_requests": inbox(d)}
    block.run(ns)
    write_loaded(d, index, ns["model"])
    return ns


def trainer(d: Path) -> dict:
    """bindings/python/README.md's trainer block (receivers=2, one step)."""
    import torch
    block = python_blocks(PY_README)[0]

    class Controller:
        pass
    ns = {"torch": torch, "steps": 1, "model": small_model(), "train_one_step": train_one_step,
          "controller": Controller()}
    out = Outbox(d, ns)
    ns["controller"].forward = out.forward
    block.run(ns)
    write_expected(d, ns["model"], torch.bfloat16)
    out.done()
    return ns


def engine(d: Path, index: int, model=None) -> dict:
    """bindings/python/README.md's engine block, fed from `d`."""
    block = python_blocks(PY_README)[1]
    ns = {"init": _wait_for(Path(d) / "init"), "index": index,
          "model": model if model is not None else rust_trainer_model(),
          "forwarded_requests": inbox(d)}
    block.run(ns)
    write_loaded(d, index, ns["model"])
    return ns


def send(d: Path, spec: List[Dict]) -> None:
    """A plain Python trainer: one version of the tensors `spec` names ({"name", "shape",
    "dtype": "float32"|"bfloat16", "receivers"}), values 0, 1, 2, ... of each, split as
    `send_model` does by default."""
    import torch
    import wsync
    from wsync.trainer import send_model
    receivers = max(int(t.get("receivers", 1)) for t in spec)
    strategy = wsync.Strategy("shm", receivers=receivers, bucket_bytes=1 << 20)
    init = strategy.create_init_info()
    sender = strategy.sender(init)
    out = Outbox(d)
    out.init(init)
    tensors = {}
    for t in spec:
        n = 1
        for e in t["shape"]:
            n *= e
        tensors[t["name"]] = torch.arange(n, dtype=torch.float32).reshape(t["shape"]).to(
            getattr(torch, t.get("dtype", "float32")))
    send_model(sender, tensors, on_request=out.forward)
    sender.flush(timeout_s=60)
    for name, t in tensors.items():
        _put(Path(d) / f"expected-{name}", raw_bytes(t))
    out.done()
    sender.close()
    strategy.close()


def main(argv: List[str]) -> int:
    what, d = argv[0], Path(argv[1])
    if what == "top-trainer":
        top_trainer(d)
    elif what == "top-engine":
        ns = top_engine(d, int(argv[2]))
        print("completed", ns["receiver"].completed_version)
    elif what == "trainer":
        trainer(d)
    elif what == "engine":
        ns = engine(d, int(argv[2]))
        print("completed", ns["serving_version"])
    elif what == "send":
        send(d, json.loads(argv[2]))
    else:
        print(f"unknown scenario {what!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
