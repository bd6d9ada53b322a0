"""The small causal LM the TRL tests train and serve: a real transformers ``LlamaForCausalLM``
(random weights, untied head) saved to a directory, as ``AsyncGRPOTrainer`` loads a model by
path, and a word-level tokenizer built in memory (nothing is fetched from a hub)."""

import os

import torch

VOCAB = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(61)]


def tiny_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, tie_word_embeddings=False,
                       pad_token_id=0, eos_token_id=1, bos_token_id=1)


def save_tiny_model(path: str, dtype=torch.float32, seed: int = 0) -> str:
    """Writes the model (``config.json`` + safetensors) to ``path``; returns ``path``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config()).to(dtype)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return path


def load_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}w0{% endif %}")
    return fast
