"""``trainer run``'s configuration: one typed dataclass tree, loaded from a YAML file plus
``key=value`` overrides, validated as a whole before anything starts.

The MAGIC knobs live in ``magic`` (trainer/magic/config.py's MagicConfig, docs/magic.md), the
rollout engine in ``engine`` (trainer/engines), the training backend in ``backend``
(trainer/backends); everything else is here. Each field is documented by its attribute docstring
(trainer/config_schema.py), which ``trainer run --help`` and ``trainer config show`` print.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from trainer.backends import BackendConfig, OptimizerConfig
from trainer.config_schema import build, check_keys, field_docs
from trainer.data import DEFAULT_SUFFIX, LCB_STYLES
from trainer.engines import EngineConfig
from trainer.magic.config import MagicConfig
from verifier.client import ClientConfig
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
    dedupe: bool = True
    """Judge a response once per step (and per evaluation pass) however many samples repeat
    it: a sample equal to an earlier one (the same problem, response and profile) gets a copy
    of its verdict. At low entropy most of a group's samples are the same text, and each code
    sample costs a sandbox run. The same rewards for any deterministic program; a program whose
    verdict varies from run to run (randomness, timing) gets one draw for all its copies.
    False: every sample judged on its own."""
    client: dict[str, Any] = field(default_factory=dict)
    """Extra verifier.client.ClientConfig fields for reaching a secured fleet, e.g.
    ``{tls: true, tls_ca: ca.pem}`` or ``{token_file: /secrets/token}`` (a token in the
    VERIFIER_TOKEN environment variable is used without this)."""
    connect_timeout_s: float = 30.0
    """How long to wait at start-up for the verifier to answer health checks, seconds; an
    unreachable verifier is an error before any model is loaded."""
    outage_window_s: float = 600.0
    """How long a run rides out a verifier outage, seconds (default 600: long enough for a pod
    to be rescheduled and restarted). While every replica is unreachable the client retries
    the unanswered items with exponential backoff (at most ``client.max_backoff_s``, 5 s,
    apart), logging each wait, and a replica that comes back gets them (each still scored
    once). Past the window the run writes a checkpoint of its last finished step and stops
    with an error. 0: stop once every replica failed ``client.max_retries`` (8) times in a
    row, ~15 s (always so for the local verifier a run starts without ``addr``: it is never
    restarted). Must be under ``timeout_s``, the step's own deadline."""
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
    """Nucleus sampling mass, in (0, 1] (1.0: off, as in the report's evaluation)."""
    max_tokens: int | None = None
    """Response limit; None uses the current stage's max response length."""
    max_problems: int | None = None
    """Evaluate on the first N problems only (None: all)."""


@dataclass
class WarmStartSettings:
    """A short supervised warm start before RL (the CPU demo uses it so that the randomly
    initialised policy solves some problems; 0 steps = off)."""

    steps: int = 0
    """Supervised steps before RL (0: no warm start)."""
    lr: float = 1e-3
    """AdamW learning rate of the warm start (no weight decay)."""
    batch_size: int = 32
    """Problems per supervised step."""
    response_template: str = "\\boxed{{{answer}}}"
    """Target response for a problem, formatted with ``answer`` (the ground truth) and the
    problem's string ``extra`` fields: ``"{reference}"`` trains on the toy world's reference
    responses (datasets/toyworld.py). A field that is a list of strings (the toy world's
    ``"{references}"`` with ``--ways``) is one element, drawn uniformly per problem per step."""
    target_loss: float = 0.0
    """Stop the warm start once the mean cross-entropy per response token on a fixed probe
    set of training problems is at or below this, nats (checked every ``check_every`` steps;
    ``steps`` is then the most it may run). 0: run exactly ``steps``. Why: a warm start at a
    high learning rate is chaotic, and a fixed step count lands anywhere in a 25-point band of
    held-out accuracy depending on the CPU's kernels; a measured skill does not
    (trainer/warmstart.py)."""
    check_every: int = 25
    """Steps between two probe measurements (with ``target_loss``)."""
    probe_size: int = 256
    """Training problems in the warm start's probe set (with ``target_loss``)."""


@dataclass
class TinyModelSettings:
    """Build a tiny random model + tokenizer instead of loading ``model_path`` (demo, tests)."""

    hidden_size: int = 64
    """Width of the residual stream."""
    layers: int = 2
    """Decoder layers."""
    heads: int = 4
    """Attention heads (query)."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention); divides ``heads``."""
    intermediate_size: int = 256
    """Width of the MLP."""
    max_positions: int = 512
    """Longest sequence (prompt + response), tokens."""
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
    every_steps: int = 1
    """Without a progress bar (stdout not a terminal: nohup, SLURM, CI, a pipe; or
    ``progress=off``), a log line every N steps and at every evaluation: step, stage, reward,
    held-out accuracy, entropy, truncated share, response length, step seconds. 0: none."""
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
    """Parent directory of run directories."""
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
    """Sequences per forward/backward pass (gradient accumulation inside a mini-batch); with
    ``max_tokens_per_micro_batch`` set, the most rows one packed micro-batch may hold."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget of one micro-batch, tokens, prompt included (docs/magic.md "How a step is
    split"). Set: each mini-batch's rows are packed by length (first-fit decreasing) into
    micro-batches of at most this many tokens (and ``micro_batch_size`` rows), each run as one
    padding-free sequence (per-row positions, attention never crossing rows), for the update
    and the old/reference log-prob forwards; with several ranks the rows are dealt out so that
    every rank holds about the same number of tokens. A row longer than the budget is trained
    alone (counted in ``update/oversized_rows``), never dropped or cut. The loss, its gradient
    and every metric are those of the row split (within float rounding). How to choose it:
    the row split's largest micro-batch is ``micro_batch_size`` x (max_prompt_length + the
    last stage's max_response_length) tokens, so that product keeps the peak memory you
    already fit (the recipes' choice; ``micro_batch_size`` then only caps rows), and a budget
    of at least max_prompt_length + max_response_length never trains a row alone. Must
    exceed magic.max_prompt_length. Default None: micro-batches of ``micro_batch_size``
    padded rows (today's split: the demo's numbers bit for bit)."""
    torch_threads: int = 0
    """Intra-op CPU threads of the trainer process (0: torch's default). On a small CPU
    machine shared with the local verifier's workers, 1 avoids oversubscription (it made
    matmuls ~100x slower here)."""
    on_invalid_reward: Literal["fail", "drop_group"] = "fail"
    """A response the verifier could not judge (INVALID_INPUT, SANDBOX_ERROR, INTERNAL_ERROR):
    fail the step loudly, or drop its whole group from the update (counted in
    ``reward/unjudged``). Never a silent zero reward."""
    magic: MagicConfig = field(default_factory=MagicConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The rollout engine ("hf" or "vllm") and its settings."""
    backend: BackendConfig = field(default_factory=BackendConfig)
    """The training backend ("torch" or "deepspeed") and its settings; the optimizer's come
    from ``magic`` (lr, betas, weight_decay, grad_clip)."""
    data: DataSettings = field(default_factory=DataSettings)
    verifier: VerifierSettings = field(default_factory=VerifierSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)
    log: LogSettings = field(default_factory=LogSettings)

    def __post_init__(self) -> None:
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
        if self.log.every_steps < 0:
            raise ValueError("log.every_steps must be >= 0 (0: no per-step log lines)")
        w = self.warm_start
        if not w.target_loss >= 0 or w.check_every < 1 or w.probe_size < 1:
            raise ValueError("warm_start.target_loss must be >= 0, warm_start.check_every and "
                             "warm_start.probe_size >= 1")
        if self.eval.every_steps and not self.data.eval_files:
            raise ValueError("eval.every_steps > 0 needs data.eval_files (or set it to 0)")
        v = self.verifier
        if "outage_window_s" in v.client:  # one home per knob
            raise ValueError("verifier.client.outage_window_s: set verifier.outage_window_s")
        if not 0 <= v.outage_window_s < v.timeout_s:
            raise ValueError(f"verifier.outage_window_s must be >= 0 and under verifier.timeout_s "
                             f"({v.timeout_s:g}), the step's deadline; got {v.outage_window_s:g}")
        try:
            self.verifier_client_config()
        except (TypeError, ValueError) as e:
            raise ValueError(f"verifier.client: {e}") from None
        if self.micro_batch_size < 1:
            raise ValueError("micro_batch_size must be >= 1")
        budget, prompt = self.max_tokens_per_micro_batch, self.magic.max_prompt_length
        if budget is not None and budget < 1:
            raise ValueError("max_tokens_per_micro_batch must be >= 1 tokens (or null: "
                             f"micro-batches of micro_batch_size rows), got {budget}")
        if budget is not None and budget <= prompt:
            raise ValueError(f"max_tokens_per_micro_batch ({budget}) must exceed "
                             f"magic.max_prompt_length ({prompt}): a micro-batch holds a "
                             "prompt and at least one response token")
        if self.log.samples_every < 0 or self.log.samples_prompts < 1:
            raise ValueError("log.samples_every must be >= 0 and log.samples_prompts >= 1, got "
                             f"{self.log.samples_every} and {self.log.samples_prompts}")
        if self.name in ("", ".", "..") or "/" in self.name:
            raise ValueError(f"name {self.name!r} must be a plain directory name")

    def verifier_client_config(self) -> ClientConfig:
        """The ClientConfig for ``verifier.addr`` (TLS, token, retries, the outage window)."""
        v = self.verifier
        # The local verifier a run starts itself is never restarted: no outage to wait out.
        return ClientConfig(**v.client, outage_window_s=v.outage_window_s if v.addr else 0.0)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    # -- plain data ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data that :func:`load_config` reads back to an equal config (the run
        directory's ``config.yaml``)."""
        return _plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        """The typed tree from plain data (parsed YAML) by the one parsing routine
        (config_schema.build): unknown keys are refused naming the closest valid key, every
        value is checked against its field's type, and every cross-field rule runs
        (``__post_init__``) before anything is loaded. A ``backend:`` key whose home is
        elsewhere (BACKEND_FIELDS_SET_BY_RUN) is refused naming that home; a retired one
        (RETIRED_BACKEND_KEYS) is read only with the value every run had."""
        backend = data.get("backend") if isinstance(data, Mapping) else None
        if isinstance(backend, Mapping):
            for key in backend:
                if key in BACKEND_FIELDS_SET_BY_RUN:
                    raise ValueError(_set_by_run(f"backend.{key}", key))
            retired = [k for k in backend if k in RETIRED_BACKEND_KEYS]
            for key in retired:
                if backend[key] != RETIRED_BACKEND_KEYS[key]:
                    raise ValueError(
                        f"backend.{key} cannot be set any more (the optimizer left the backend "
                        f"config): every run now has {RETIRED_BACKEND_KEYS[key]!r}, this config "
                        f"says {backend[key]!r}")
            if retired:
                data = {**data, "backend": {k: v for k, v in backend.items()
                                            if k not in retired}}
        return build(cls, data, "")


#: ``backend.*`` keys whose one home is elsewhere in the run config, and that home. The
#: optimizer (the report's row lives in ``magic``) is no backend field at all: a run builds
#: ``OptimizerConfig.from_magic`` (trainer/loop.py); ``seed`` and ``keep_reference`` are
#: backend fields that a run sets from ``seed`` and ``magic.kl_coef``. Written in a
#: ``backend:`` section, each is refused naming its home rather than as an unknown key.
BACKEND_FIELDS_SET_BY_RUN = {"lr": "magic.lr", "betas": "magic.betas",
                             "weight_decay": "magic.weight_decay",
                             "grad_clip": "magic.grad_clip",
                             "keep_reference": "magic.kl_coef (> 0 keeps a reference policy)",
                             "seed": "seed"}

#: ``backend.*`` keys of earlier versions and the only value a run may still give them. The
#: run directory's ``config.yaml`` of a run started before the optimizer left the backend
#: config holds ``backend.eps`` (AdamW's epsilon, then a backend field that ``trainer run``
#: never changed): such a run still resumes, and an ablation still finds it equal to a fresh
#: one; any other value is refused, since no run can have it now.
RETIRED_BACKEND_KEYS = {"eps": OptimizerConfig.eps}


def _set_by_run(key: str, name: str) -> str:
    return (f"{key} cannot be set: a run sets it from {BACKEND_FIELDS_SET_BY_RUN[name]} "
            "(every value has one home; the optimizer's settings live in magic)")


def _plain(obj: Any) -> Any:
    if isinstance(obj, MagicConfig):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        skip = BACKEND_FIELDS_SET_BY_RUN if isinstance(obj, BackendConfig) else ()
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.name not in skip}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _fields(cls: type) -> list[str]:
    fields = [f.name for f in dataclasses.fields(cls)]
    if cls is BackendConfig:
        fields = [f for f in fields if f not in BACKEND_FIELDS_SET_BY_RUN]
    return fields


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0]
    return None


# -- YAML and key=value ---------------------------------------------------------------------

class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 scalars: only true/false are booleans (YAML 1.1 also
    reads yes/no/on/off as booleans, which turned ``entropy_mode: off`` into False), and
    ``1e-6`` is a float (YAML 1.1 wants a dot: ``1.0e-6``)."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def read_yaml(text: str, what: str) -> Any:
    """YAML 1.2 scalars (see _Yaml12Loader); a syntax error names ``what``."""
    try:
        return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ValueError(f"{what}: not valid YAML: {e}") from None


_NONE_WORDS = ("null", "none", "None", "~", "")
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True,
               "false": False, "no": False, "off": False, "0": False}


def parse_value(raw: str, hint: Any, key: str) -> Any:
    """An override's text read as the field's type expects: a string or Literal field takes
    the text as is (``off``, ``none``, ``yes`` stay strings), a bool takes true/false/yes/no/
    on/off/1/0, a number parses as one, ``null``/``none`` is None where the field allows it,
    and lists, tuples and mappings are YAML (``[a, b]``, ``{k: v}``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if type(None) in args and raw in _NONE_WORDS:
            return None
        if len(inner) == 1:
            return parse_value(raw, inner[0], key)
        return read_yaml(raw, key)
    if hint is str or (origin is Literal and all(isinstance(a, str) for a in args)):
        return raw
    if hint is bool:
        if raw.lower() not in _BOOL_WORDS:
            raise ValueError(f"{key} must be a bool (true/false, yes/no, on/off), got {raw!r}")
        return _BOOL_WORDS[raw.lower()]
    if hint is int or (origin is Literal and all(isinstance(a, int) for a in args)):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{key} must be an int, got {raw!r}") from None
    if hint is float:
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{key} must be a number, got {raw!r}") from None
    return read_yaml(raw, key)


def _field_hint(key: str) -> tuple[list[str], Any]:
    """The path and the type of a dotted key of the run config; an unknown part is refused
    naming the closest valid key."""
    cls: Any = RunConfig
    path = key.split(".")
    hint: Any = None
    for i, part in enumerate(path):
        where = ".".join(path[:i]) or "run config"
        if cls is None:
            raise ValueError(f"{'.'.join(path[:i])} is not a section: {key!r} cannot be set "
                             "(give the whole value, e.g. magic.stages='[{...}]')")
        if cls is BackendConfig and part in BACKEND_FIELDS_SET_BY_RUN:
            raise ValueError(_set_by_run(key, part))
        check_keys(where, {part: None}, _fields(cls))
        hint = typing.get_type_hints(cls)[part]
        cls = _dataclass_of(hint)
    return path, hint


def apply_override(data: dict[str, Any], override: str) -> None:
    """Set one ``key=value`` (dotted key) in the plain config ``data``, the value read as the
    field's type expects (:func:`parse_value`)."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"overrides must look like key=value, got {override!r}")
    path, hint = _field_hint(key)
    value = parse_value(raw, hint, key)
    node = data
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """YAML file + ``key=value`` overrides (dotted keys, e.g. ``magic.group_size=8``), built
    and validated as one :class:`RunConfig` before anything is loaded."""
    data: Any = {}
    if path is not None:
        data = read_yaml(Path(path).read_text(encoding="utf-8"), str(path)) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config file must be a mapping, got {type(data).__name__}")
    for override in overrides:
        apply_override(data, override)
    return RunConfig.from_dict(data)


def read_run_config(run_dir: str | Path) -> RunConfig | None:
    """The typed config of a run directory, read from the ``config.yaml`` trainer/loop.py
    writes there; None without one, or when this version no longer reads it."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return None
    try:
        return load_config(path)
    except ValueError:
        return None


# -- showing the knobs --------------------------------------------------------------------

def _leaf_yaml(value: Any) -> str:
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10_000, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def config_yaml(config: Any, comments: bool = True, indent: int = 0) -> str:
    """The config as YAML that :func:`load_config` reads back, each field preceded by its help
    as ``#`` comments (``trainer config show``)."""
    lines: list[str] = []
    pad = " " * indent
    docs = field_docs(type(config))
    for name in _fields(type(config)):
        value = getattr(config, name)
        if comments and docs.get(name):
            width = max(40, 100 - indent - 2)
            lines += [f"{pad}# {line}" for line in textwrap.wrap(docs[name], width)]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            lines.append(f"{pad}{name}:")
            lines.append(config_yaml(value, comments, indent + 2))
        else:
            lines.append(f"{pad}{name}: {_leaf_yaml(value)}")
    return "\n".join(lines)


def _type_label(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_label(a) for a in args)
    if hint is type(None):
        return "null"
    if origin is not None:
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _leaf_yaml(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _leaf_yaml(f.default_factory())
    return "(required)"


def knob_help(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every settable key of the run config: ``(key, type, default, help)``, sections
    flattened with dotted keys (``trainer run --help``)."""
    rows: list[tuple[str, str, str, str]] = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in _fields(cls):
        sub = _dataclass_of(hints[name])
        if sub is not None:  # a section: its own keys, not one default built and thrown away
            rows += knob_help(sub, f"{prefix}{name}.")
            continue
        rows.append((f"{prefix}{name}", _type_label(hints[name]), _default_text(fields[name]),
                     docs.get(name, "")))
    return rows
