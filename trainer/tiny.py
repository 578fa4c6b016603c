"""A tiny Qwen2-architecture model and a character-level tokenizer, built from nothing.

Nothing is downloaded at run time, so tests and the CPU demo build their model from a config and
their tokenizer with the ``tokenizers`` library, then save both in Hugging Face format to a
directory that ``transformers`` and vLLM load like any checkpoint.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, EOS, UNK = "<|endoftext|>", "<|im_end|>", "<unk>"
IM_START = "<|im_start|>"
# Multi-character tokens first: the pre-tokenizer matches them before single characters. The code
# words keep a small program short (the toy world's code answers: datasets/toyworld.py).
WORDS = ["\\boxed", "<think>", "</think>", "user", "assistant", "system",
         "```python", "```", "def", "return", "    "]


def numbers(digits_per_token: int) -> list[str]:
    """Number tokens: every string of 1..``digits_per_token`` digits."""
    return [f"{i:0{width}d}" for width in range(1, digits_per_token + 1) for i in range(10**width)]


CHARS = list(string.ascii_letters + " +-*/=()?,.:;!{}[]<>\n_'\"\\^$%")

# Qwen-style chat template (Jinja), so prompts go through tokenizer.apply_chat_template.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(digits_per_token: int = 3):
    """A character-level fast tokenizer (numbers in chunks of up to ``digits_per_token``
    digits) with a chat template (PreTrainedTokenizerFast)."""


    if not 1 <= digits_per_token <= 3:
        raise ValueError(f"digits_per_token must be 1, 2 or 3, got {digits_per_token}")
    specials = [PAD, IM_START, EOS, UNK]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS + numbers(digits_per_token) + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Numbers are split into chunks of up to 3 digits by default (as GPT-4-style tokenizers do),
    # so a 2-digit number is one token; with 1, every digit is its own token (the toy world's
    # digit-by-digit scratchpad). Everything else is one character per token.
    pattern = "|".join(re.escape(w) for w in WORDS) + f"|\\d{{1,{digits_per_token}}}|."
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        additional_special_tokens=[IM_START],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(vocab_size: int, *, hidden_size: int = 64, layers: int = 2, heads: int = 4,
                kv_heads: int = 2, intermediate_size: int = 256, max_positions: int = 512,
                seed: int = 0, eos_token_id: int | None = None, pad_token_id: int | None = None):
    """A randomly initialised Qwen2ForCausalLM (float32)."""

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None,
        torch_dtype="float32",
    )
    return Qwen2ForCausalLM(config)


def save_tiny(path: str | Path, digits_per_token: int = 3, vocab_size: int | None = None,
              save_dtype: torch.dtype | None = None, **model_kwargs) -> Path:
    """Build the tokenizer and a tiny model and save both to ``path`` (HF format).
    ``vocab_size``: the model's vocabulary (default: the tokenizer's; a larger one gives a
    realistically shaped output layer whose extra ids decode to nothing); ``save_dtype``: the
    dtype the weights are stored in (default float32)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(digits_per_token)
    model = build_model(
        vocab_size or len(tokenizer), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **model_kwargs,
    )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if save_dtype is not None:
        model.to(save_dtype)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    # Declare the generic class: AutoTokenizer would otherwise rebuild a Qwen2 tokenizer from
    # the model's architecture (trainer.hf_utils.load_tokenizer honours this).
    cfg = path / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.write_text(json.dumps(data, indent=2))
    return path
