"""A trainer process that dies mid-version (``python _sglang_trainer.py URL OUT``): sends one
whole version to the SGLang engine at URL, saves that version's state dict to OUT, sends the
first ten chunks of a second version (the embedding's four parts, then whole tensors of the
first layer), then SIGKILLs itself."""

import os
import signal
import sys

import torch

from conftest import tiny_trainer_model
from wsync.integrations.sglang import SGLangWeightSync


def main():
    url, out = sys.argv[1], sys.argv[2]
    model = tiny_trainer_model(seed=7)
    sync = SGLangWeightSync(url, chunk_bytes=4096, flush_timeout_s=20.0, http_timeout_s=60.0)
    sync.init()
    sync.update(model.state_dict())
    torch.save({n: t.clone() for n, t in model.state_dict().items()}, out)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    post, calls = sync._post_tensor, []

    def dying(*args, **kwargs):
        if len(calls) == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        calls.append(1)
        return post(*args, **kwargs)

    sync._post_tensor = dying
    sync.update(model.state_dict())


if __name__ == "__main__":
    main()
