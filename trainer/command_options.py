"""The options of ``trainer eval`` and ``trainer filter``: one dataclass each, whose fields and
docstrings tyro turns into the commands' flags and help (trainer/cli.py).

Why a module of their own: the command line builds its parser, and answers ``--help`` or a
misspelt flag, from these classes alone; the modules that run the commands
(trainer/evaluation.py, trainer/magic/offline_filter.py) import torch and transformers, about ten
seconds on a small CPU, which only a command that samples needs (tests/test_cli_speed.py).

What both commands take (sampling limits, the prompt format, the verifier, the engine) is
declared once, in :class:`SamplingCommandOptions`; where a knob is also ``trainer run``'s, its
default is the run config's field (``data.*``, ``verifier.*``, ``magic.*``, ``eval.*`` of
trainer/config.py), so the two cannot drift. The flags stay flat (``--verifier-addr``, not
``--verifier.addr``): a nested VerifierSettings or DataSettings would also offer the run-only
knobs (``stream``, ``outage_window_s``, ``profile``, ``train_files``, ``shuffle``, ...) that
these commands never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from trainer.config import DataSettings, EvalSettings, VerifierSettings
from trainer.data import LCB_REPORT_WINDOW
from trainer.engines import EngineConfig, standalone_engine
from trainer.magic.config import MagicConfig, default_stages

PROGRESS_VERSION = 1
"""The filter's progress-file format (a file of another version is not resumed)."""


@dataclass
class SamplingCommandOptions:
    """The options ``trainer eval`` and ``trainer filter`` share. Each command is
    ``Command(SamplingCommandOptions, _CommandFields)``: a dataclass lists the fields of its
    LAST base first, so the command's own fields (its required ones among them) come first in
    ``--help`` and in the constructor, these after them."""

    top_p: float = MagicConfig.top_p
    """Nucleus sampling mass."""
    top_k: int = MagicConfig.top_k
    """Top-k sampling (-1: off)."""
    max_tokens: int = default_stages()[-1].max_response_length
    """Response limit, tokens."""
    instruction_suffix: str = DataSettings.instruction_suffix
    """Appended to math prompts (the report's; '' for none)."""
    skip_invalid: bool = DataSettings.skip_invalid
    """Skip malformed rows (counted) instead of failing."""
    timeout_s: float = 3600.0  # not verifier.timeout_s (one step's): a whole set's verdicts
    """Longest wait for verdicts after generation ends, seconds."""
    tokenizer: str | None = None
    """Tokenizer directory (default: --model)."""
    verifier_addr: str | None = VerifierSettings.addr
    """HOST:PORT[,HOST:PORT...] of a verifier; default: start a local one."""
    verifier_workers: int = VerifierSettings.workers
    """Workers of the local verifier (without --verifier-addr)."""
    engine: EngineConfig = field(default_factory=standalone_engine)
    """The rollout engine (hf: Hugging Face generate, CPU and small models; vllm: production)."""


@dataclass
class _EvalFields:
    """``trainer eval``'s own options (:class:`EvalOptions`)."""

    model: str
    """Local Hugging Face checkpoint directory."""
    dataset: str
    """aime24 | aime25 (datasets/eval/*.parquet) | lcb (needs --lcb-file) | a JSONL or parquet
    file in any loader format."""
    lcb_files: Annotated[list[str], tyro.conf.arg(name="lcb_file")] = field(default_factory=list)
    """Local LiveCodeBench code_generation_lite release JSONL files."""
    lcb_start: str = LCB_REPORT_WINDOW[0]
    """First contest_date kept (inclusive; the report's window)."""
    lcb_end: str = LCB_REPORT_WINDOW[1]
    """Last contest_date kept (inclusive)."""
    lcb_all_dates: bool = False
    """No contest-date window."""
    lcb_style: Literal["auto", "generic", "deepseek-r1"] = "auto"
    """LiveCodeBench prompt template; auto: LiveCodeBench's choice for the model (deepseek-r1
    for DeepSeek-R1-Distill models, else generic)."""
    k: int | None = None
    """Samples per problem (avg@k); default: the report's, 32 for AIME and math files, 4 for
    LiveCodeBench and files with code."""
    temperature: float = EvalSettings.temperature
    """Sampling temperature (the report's 0.6 for the 7B model)."""
    seed: int = 0
    """Sampling seed."""
    output_dir: Path | None = None
    """Where generations.jsonl, results.jsonl and summary.json go (default:
    runs/eval/<model>-<dataset>)."""
    limit: int | None = None
    """First N problems only."""
    allow_errors: bool = False
    """Count responses the verifier could not judge as incorrect."""


@dataclass
class EvalOptions(SamplingCommandOptions, _EvalFields):
    """Generate k samples per problem and report avg@k / pass@k (the report's table)."""

    @property
    def lcb_window(self) -> tuple[str, str] | None:
        """The contest-date window of LiveCodeBench problems (None: every date)."""
        return None if self.lcb_all_dates else (self.lcb_start, self.lcb_end)


@dataclass
class _FilterFields:
    """``trainer filter``'s own options (:class:`FilterOptions`)."""

    input: Path
    """JSONL or parquet, any loader format."""
    output: Path
    """Every row with pass_count/pass_k (same format as the input)."""
    model: str | None = None
    """Local checkpoint that samples the responses (its path also identifies the model in the
    progress file)."""
    released_difficulty: str | None = None
    """Sample nothing: use extra_info.model_difficulty[MODEL] of the data (e.g.
    DeepSeek-R1-Distill-Qwen-7B), as Skywork's release does."""
    kept_output: Path | None = None
    """The kept rows (default: <output>.kept.<ext>)."""
    k: int = 16
    """Samples per problem."""
    lo: int = 1
    """Keep pass_count >= lo."""
    hi: int = 15
    """Keep pass_count <= hi."""
    temperature: float = MagicConfig.temperature
    """Sampling temperature: the rollout temperature of training (docs/magic.md), so the filter
    measures how the policy will see each problem."""
    seed: int = 0
    """Batch b samples with seed + b."""
    batch_size: int = 64
    """Problems per generate call and per saved progress record: the unit of resumption."""
    difficulty_key: str | None = None
    """Key under extra_info.model_difficulty for verl rows (default: the model directory's
    name)."""
    allow_errors: bool = False
    """Count responses the verifier could not judge as incorrect instead of stopping."""


@dataclass
class FilterOptions(SamplingCommandOptions, _FilterFields):
    """Offline difficulty filter: keep problems solved in [lo, hi] of k samples."""

    def __post_init__(self) -> None:
        self.input, self.output = Path(self.input), Path(self.output)
        if self.kept_output is not None:
            self.kept_output = Path(self.kept_output)
        if self.k < 1:
            raise ValueError(f"--k must be >= 1, got {self.k}")
        if not 0 <= self.lo <= self.hi <= self.k:
            raise ValueError(f"need 0 <= lo <= hi <= k, got lo={self.lo}, hi={self.hi}, k={self.k}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.output.resolve() == self.input.resolve():
            raise ValueError("--output must differ from --input (the input is never overwritten)")

    @property
    def kept_path(self) -> Path:
        if self.kept_output is not None:
            return self.kept_output
        return self.output.with_name(f"{self.output.stem}.kept{self.output.suffix}")

    @property
    def progress_path(self) -> Path:
        return self.output.with_name(self.output.name + ".progress.jsonl")

    def fingerprint(self) -> dict[str, Any]:
        return {"version": PROGRESS_VERSION, "input": str(self.input.resolve()),
                "model": self.model or "", "k": self.k, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "max_tokens": self.max_tokens,
                "seed": self.seed, "batch_size": self.batch_size,
                "instruction_suffix": self.instruction_suffix}
