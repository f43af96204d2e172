"""Hugging Face ``transformers`` models built from small random configs (nothing is
downloaded), wrapped to return their logits, for the PyTorch capture tests and
``bench/torch_profile.py``.

:func:`make_language_model` returns ``(module, ids, targets, loss_fn, optimizer)`` for one
batch, like :mod:`baechi.examples.torch_models`, seeded so two calls give identical modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: The model families :func:`make_language_model` builds.
KINDS = ("gpt2", "llama", "bert")


class LanguageModel(nn.Module):
    """A causal or masked LM returning its logits as one (tokens, vocabulary) tensor."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits.flatten(0, 1)


def make_language_model(kind: str, *, layers: int = 2, width: int = 64, vocab: int = 128,
                        batch: int = 2, length: int = 16, seed: int = 0) -> tuple[Any, ...]:
    """A ``kind`` model (``gpt2``, ``llama`` or ``bert``) in train mode with dropout off,
    a batch of token ids, its targets, cross-entropy and SGD."""
    import transformers

    torch.manual_seed(seed)
    small = {"vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    heads = max(1, width // 32)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=layers, n_head=heads, n_embd=width, n_positions=max(32, length),
            resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, use_cache=False, **small))
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            hidden_size=width, intermediate_size=2 * width,
            max_position_embeddings=max(32, length), use_cache=False, **small))
    elif kind == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            num_hidden_layers=layers, num_attention_heads=heads, hidden_size=width,
            intermediate_size=2 * width, max_position_embeddings=max(32, length),
            hidden_dropout_prob=0, attention_probs_dropout_prob=0, **small))
    else:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    module = LanguageModel(model).train()
    ids = torch.randint(0, vocab, (batch, length))
    targets = torch.randint(0, vocab, (batch * length,))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    return module, ids, targets, nn.CrossEntropyLoss(), optimizer
