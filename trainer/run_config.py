"""``trainer run``'s configuration: one dataclass tree, loaded from YAML plus ``key=value``
overrides (OmegaConf merges them), validated at construction.

The MAGIC knobs live in ``magic`` (trainer/config.py's MagicConfig, docs/magic.md); the rollout
engine in ``engine``, the training backend in ``backend``; everything else is here.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from trainer.config import MagicConfig
from trainer.data import DEFAULT_SUFFIX, LCB_STYLES
from verifier.items import PROFILES


@dataclass
class DataSettings:
    """Where problems come from."""

    train_files: list[str] = field(default_factory=list)
    """Training data: JSONL or verl/Skywork parquet files (trainer/data.py)."""
    eval_files: list[str] = field(default_factory=list)
    """Held-out data for evaluation every ``eval.every_steps`` steps."""
    instruction_suffix: str = DEFAULT_SUFFIX
    """Appended to each prompt's last user message (the report's suffix by default)."""
    shuffle: bool = True
    """Shuffle the training problems every epoch (seeded: resumable)."""
    skip_invalid: bool = False
    """Skip malformed rows (counted and logged) instead of failing on the first one."""
    lcb_style: str = "generic"
    """Prompt template of LiveCodeBench rows: "generic" (LiveCodeBench's generic template as
    the user message, through the chat template) or "deepseek-r1" (LiveCodeBench's DeepSeekR1
    prompt text, its choice for R1-distill models)."""


@dataclass
class VerifierSettings:
    """How rewards are computed."""

    addr: str | None = None
    """HOST:PORT of a verifier (a comma list for a fleet). None: start a local
    ``verifier serve`` on a free loopback port for the run and stop it after."""
    workers: int = 2
    """Workers of the local verifier (ignored with ``addr``)."""
    timeout_s: float = 1800.0
    """Longest wait for a step's rewards after generation ends, seconds; past it the step fails."""
    stream: bool = True
    """Send each finished generation chunk to the verifier at once (overlap, the default);
    False waits for the whole batch first (for comparison: benchmarks/bench_trainer.py)."""
    client: dict[str, Any] = field(default_factory=dict)
    """Extra verifier.client.ClientConfig fields for reaching a secured fleet, e.g.
    ``{tls: true, tls_ca: ca.pem}`` or ``{token_file: /secrets/token}`` (a token in the
    VERIFIER_TOKEN environment variable is used without this)."""
    connect_timeout_s: float = 30.0
    """How long to wait at start-up for the verifier to answer health checks, seconds; an
    unreachable verifier is an error before any model is loaded."""
    profile: str = ""
    """The judging profile of every reward: "" (by the data: LiveCodeBench rows "lcb", others
    the verifier's default), "default", "lcb" (LiveCodeBench's judge) or "skywork" (the
    released Skywork-OR1 reward: pick it to train on Skywork's data as the report did)."""


@dataclass
class EvalSettings:
    """Evaluation on held-out data through the same verifier."""

    every_steps: int = 10
    """Evaluate every N steps (0: never); also at the start and the end of a run."""
    n_samples: int = 1
    """k of avg@k: samples per problem (report: 32 for AIME, 4 for LiveCodeBench)."""
    temperature: float = 0.6
    """Sampling temperature (report: 0.6 for the 7B model); 0 means greedy."""
    top_p: float = 1.0
    max_tokens: int | None = None
    """Response limit; None uses the current stage's max response length."""
    max_problems: int | None = None
    """Evaluate on the first N problems only (None: all)."""


@dataclass
class WarmStartSettings:
    """A short supervised warm start before RL (the CPU demo uses it so that the randomly
    initialised policy solves some problems; 0 steps = off)."""

    steps: int = 0
    lr: float = 1e-3
    batch_size: int = 32
    response_template: str = "\\boxed{{{answer}}}"
    """Target response for a problem, formatted with ``answer`` (the ground truth) and the
    problem's string ``extra`` fields: ``"{reference}"`` trains on the toy world's reference
    responses (datasets/toyworld.py)."""


@dataclass
class TinyModelSettings:
    """Build a tiny random model + tokenizer instead of loading ``model_path`` (demo, tests)."""

    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 512
    digits_per_token: int = 3
    """Numbers are tokenized in chunks of up to this many digits (1-3). Default 3 (GPT-4-style);
    the toy world uses 1 so that the model reads and writes single digits."""


@dataclass
class LogSettings:
    tensorboard: bool = True
    """Write TensorBoard event files under the run directory."""
    wandb: bool = False
    """Also log to Weights & Biases (needs the wandb package and a login)."""
    progress: Literal["auto", "on", "off"] = "auto"
    """Live progress bar with reward, entropy and stage ("auto": on a terminal only)."""
    plots: bool = True
    """Write PNG plots at the end of the run (also: ``trainer plot runs/NAME``)."""
    samples_every: int = 10
    """Every N steps, write sample completions to ``samples/step_NNNNNN.jsonl`` (prompt,
    response, reward, verifier status, truncated), to read what the policy writes; 0: never.
    Default 10: a few KB per file."""
    samples_prompts: int = 4
    """Prompts per samples file, each with its whole group of responses. Default 4."""


@dataclass
class RunConfig:
    """Everything ``trainer run`` needs."""

    name: str = "run"
    """Run name: the run directory is ``output_dir/name``."""
    output_dir: str = "runs"
    model_path: str | None = None
    """Local Hugging Face checkpoint (safetensors) to start from."""
    tokenizer_path: str | None = None
    """Tokenizer directory; defaults to ``model_path``."""
    tiny_model: TinyModelSettings | None = None
    """Instead of ``model_path``: build a tiny random model (demo and tests)."""
    total_steps: int = 100
    """RL steps (one rollout batch each)."""
    seed: int = 0
    """Seeds data order, sampling and mini-batch shuffles: the same seed reproduces a run."""
    checkpoint_every: int = 50
    """Save a resumable checkpoint every N steps (0: only at stage ends and the end)."""
    keep_checkpoints: int = 2
    """Step checkpoints kept on disk (older ones are deleted; stage-end ones are kept)."""
    micro_batch_size: int = 8
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch)."""
    torch_threads: int = 0
    """Intra-op CPU threads of the trainer process (0: torch's default). On a small CPU
    machine shared with the local verifier's workers, 1 avoids oversubscription (it made
    matmuls ~100x slower here)."""
    on_invalid_reward: Literal["fail", "drop_group"] = "fail"
    """A response the verifier could not judge (INVALID_INPUT, SANDBOX_ERROR, INTERNAL_ERROR):
    fail the step loudly, or drop its whole group from the update (counted in
    ``reward/unjudged``). Never a silent zero reward."""
    magic: MagicConfig = field(default_factory=MagicConfig)
    engine: Any = None
    """trainer.engines.EngineConfig (rollout engine: "hf" or "vllm")."""
    backend: Any = None
    """trainer.backends.BackendConfig (training backend: "torch" or "deepspeed")."""
    data: DataSettings = field(default_factory=DataSettings)
    verifier: VerifierSettings = field(default_factory=VerifierSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)
    log: LogSettings = field(default_factory=LogSettings)

    def __post_init__(self) -> None:
        from trainer.backends import BackendConfig
        from trainer.engines import EngineConfig

        if self.engine is None:
            self.engine = EngineConfig()
        if self.backend is None:
            self.backend = BackendConfig()
        if (self.model_path is None) == (self.tiny_model is None):
            raise ValueError("give exactly one of model_path (a local checkpoint) and "
                             "tiny_model (build a tiny random model)")
        if self.total_steps < 1:
            raise ValueError("total_steps must be >= 1")
        if not self.data.train_files:
            raise ValueError("data.train_files is empty: give at least one training file")
        if self.data.lcb_style not in LCB_STYLES:
            raise ValueError(f"data.lcb_style must be one of {', '.join(LCB_STYLES)}, got "
                             f"{self.data.lcb_style!r}")
        if self.verifier.profile and self.verifier.profile not in PROFILES:
            raise ValueError(f"verifier.profile must be one of {', '.join(PROFILES)} (or empty), "
                             f"got {self.verifier.profile!r}")
        if self.eval.every_steps < 0 or self.eval.n_samples < 1:
            raise ValueError("eval.every_steps must be >= 0 and eval.n_samples >= 1")
        if self.eval.every_steps and not self.data.eval_files:
            raise ValueError("eval.every_steps > 0 needs data.eval_files (or set it to 0)")
        try:
            self.verifier_client_config()
        except (TypeError, ValueError) as e:
            raise ValueError(f"verifier.client: {e}") from None
        if self.micro_batch_size < 1:
            raise ValueError("micro_batch_size must be >= 1")
        if self.log.samples_every < 0 or self.log.samples_prompts < 1:
            raise ValueError("log.samples_every must be >= 0 and log.samples_prompts >= 1, got "
                             f"{self.log.samples_every} and {self.log.samples_prompts}")
        if self.name in ("", ".", "..") or "/" in self.name:
            raise ValueError(f"name {self.name!r} must be a plain directory name")

    def verifier_client_config(self) -> Any:
        """The ClientConfig for ``verifier.addr`` (TLS, token, retries)."""
        from verifier.client import ClientConfig

        return ClientConfig(**self.verifier.client)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    # -- plain data ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, MagicConfig):
                v = v.to_dict()
            elif dataclasses.is_dataclass(v):
                v = dataclasses.asdict(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        from trainer.backends import BackendConfig
        from trainer.engines import EngineConfig

        data = dict(data)
        kwargs: dict[str, Any] = {}
        subs = {"data": DataSettings, "verifier": VerifierSettings, "eval": EvalSettings,
                "warm_start": WarmStartSettings, "log": LogSettings,
                "tiny_model": TinyModelSettings, "engine": EngineConfig,
                "backend": BackendConfig}
        _unknown(cls, data, "run config")
        for key, value in data.items():
            if key == "magic":
                kwargs[key] = MagicConfig.from_dict(value or {})
            elif key in subs and value is not None:
                kwargs[key] = build(subs[key], value, key)
            else:
                kwargs[key] = value
        _check_literals(cls, kwargs, "")
        return cls(**kwargs)


def _unknown(cls: type, data: Mapping[str, Any], what: str) -> None:
    known = [f.name for f in dataclasses.fields(cls)]
    extra = sorted(set(data) - set(known))
    if extra:
        raise ValueError(f"unknown {what} keys {extra}; known keys are {known}")


def _check_literals(cls: type, values: dict[str, Any], prefix: str) -> None:
    hints = typing.get_type_hints(cls)
    for name, value in list(values.items()):
        hint = hints.get(name)
        if typing.get_origin(hint) is not Literal:
            continue
        if isinstance(value, bool) and {"on", "off"} <= set(typing.get_args(hint)):
            # YAML 1.1 (and OmegaConf's key=value parsing) reads on/off as booleans.
            value = values[name] = "on" if value else "off"
        if value not in typing.get_args(hint):
            raise ValueError(f"{prefix}{name} must be one of {list(typing.get_args(hint))}, "
                             f"got {value!r}")


def build(cls: type, data: Any, prefix: str) -> Any:
    """A dataclass from plain data: unknown keys are errors, Literal fields are checked,
    tuples are rebuilt from YAML lists."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix} must be a mapping, got {type(data).__name__}")
    _unknown(cls, data, prefix)
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in data.items():
        hint = hints.get(k)
        if typing.get_origin(hint) is tuple and isinstance(v, list):
            v = tuple(v)
        kwargs[k] = v
    _check_literals(cls, kwargs, f"{prefix}.")
    return cls(**kwargs)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """YAML file + ``key=value`` overrides (dotted keys, e.g. ``magic.group_size=8``)."""
    from omegaconf import OmegaConf

    base = OmegaConf.load(str(path)) if path is not None else OmegaConf.create({})
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ValueError(f"overrides must look like key=value, got {bad}")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
    data = OmegaConf.to_container(merged, resolve=True)
    assert isinstance(data, dict)
    return RunConfig.from_dict(data)
