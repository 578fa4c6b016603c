"""Loading tokenizers and building chat prompts, with clear errors for bad checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

# Tokenizer classes that mean "use tokenizer.json exactly as saved". AutoTokenizer would
# instead pick the class registered for the model's architecture (Qwen2Tokenizer for a Qwen2
# config) and rebuild the pre-tokenizer, which breaks a project-made tokenizer.
_GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


class CheckpointError(ValueError):
    """A model or tokenizer path that cannot be used; the message says why."""


def check_model_path(model_path: str | Path) -> Path:
    """The checkpoint directory, checked before anything heavy is imported or loaded.

    Raises CheckpointError when the path does not exist, is not a directory, or has no
    ``config.json`` (not a Hugging Face checkpoint). The one check engines, backends and the
    trainer share.
    """
    path = Path(model_path)
    if not path.exists():
        raise CheckpointError(f"model path {str(model_path)!r} does not exist: not a Hugging Face "
                              "checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"model path {str(model_path)!r} is not a directory; expected a "
                              "Hugging Face checkpoint directory (config.json + safetensors)")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"model path {str(model_path)!r} has no config.json: not a "
                              "Hugging Face checkpoint directory")
    return path


def load_tokenizer(path: str | Path) -> Any:
    """The checkpoint's tokenizer. Raises CheckpointError for a missing path."""
    # lazy: the engines' and backends' config modules import this one without torch
    from transformers import (
        AutoTokenizer,
        PreTrainedTokenizerFast,
    )

    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"tokenizer path {str(path)!r} does not exist")
    cfg_file = p / "tokenizer_config.json"
    declared = None
    if cfg_file.exists():
        declared = json.loads(cfg_file.read_text()).get("tokenizer_class")
    if declared in _GENERIC_CLASSES:
        tok = PreTrainedTokenizerFast.from_pretrained(str(p))
    else:
        tok = AutoTokenizer.from_pretrained(str(p))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ready for the
    assistant's turn. Raises CheckpointError when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError(
            "the tokenizer has no chat template, and the data gives prompts as chat messages; "
            "use a chat/instruct checkpoint or set one in tokenizer_config.json"
        )
    out = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):  # transformers >= 5 returns a BatchEncoding
        out = out["input_ids"]
    return list(out)


def problem_prompt_ids(tokenizer: Any, problem: Any) -> list[int]:
    """Token ids of a ``trainer.data.Problem``'s prompt: its ``raw_prompt`` tokenized as it is
    (LiveCodeBench's DeepSeekR1 style writes the beginning-of-sentence, user and assistant
    markers itself, so the tokenizer adds no special tokens of its own), else its chat
    messages through the chat template."""
    if problem.raw_prompt is not None:
        return list(tokenizer(problem.raw_prompt, add_special_tokens=False)["input_ids"])
    return chat_prompt_ids(tokenizer, problem.messages)
