"""The ``verifier`` command's configs: one typed dataclass tree (docs/contracts.md 2).

``verifier serve``, ``check``, ``eval`` and ``health`` are each one dataclass here; tyro turns
their fields and docstrings into flags and help text, and each ``__post_init__`` checks the
cross-field rules before anything loads.

Why a module of its own: tyro builds the parser of every subcommand from these classes, so
every ``verifier`` command imports this module. It imports nothing heavy (no gRPC server, no
sandbox backend, no sympy): ``verifier health`` (a container's health probe, run every few
seconds) and ``verifier check --addr`` start without loading the scoring engine. The modules
that run a command (``verifier.scoring.scorer``, ``verifier.service.server``, ``verifier.eval.evaluate``) import
their config from here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Annotated, Literal

import tyro

from sandbox import SandboxKind
from verifier.auth import TokenSource
from verifier.client.config import ClientConfig
from verifier.data.lcb import LCB_REPORT_WINDOW
from verifier.scoring.profiles import DEFAULT_MAX_OUTPUT_MB, ProfileName


@dataclass
class ScoringConfig:
    """How items are scored. Shared by ``verifier serve`` and ``verifier check``."""

    workers: int = 2
    """Math worker processes, and code samples run at once. Default 2 (one per core here);
    set it to the pod's CPU count."""
    sandbox: SandboxKind = "nsjail"
    """Where model-written code runs: "nsjail" (default), "docker", or "unsafe-none" (no
    isolation; development only, refused off loopback)."""
    docker_image: str = "python:3.11-slim"
    """Image of the docker sandbox's containers (with ``--sandbox docker``; the engine is the
    one DOCKER_HOST names). It must hold ``python3``; the verifier image does."""
    code_concurrency: int = 0
    """Jails run at once: code samples and the HTTP gateway's /run_code runs share these
    slots; 0 (default): ``workers``. A sample's jail spends about as
    much wall time in the kernel (namespaces, cgroups made and torn down) as on the CPU, so
    a value above the cores keeps them busy (docs/verifier.md 3); it also lets CPU-heavy
    tests share the cores, so their wall-clock limits get less slack."""
    warm_jails: int | None = None
    """Pre-started jails kept ready per jail command (nsjail): a sample's jail is started
    while earlier samples run, so its set-up is off the sample's path (sandbox/warm.py; each
    jail still serves one sample only). None (default): one per code slot; 0: none, every
    sample starts its jail when it arrives."""
    forkserver: Literal["auto", "on", "off"] = "auto"
    """Fork the harness's jails from a warm zygote (sandbox/forkserver.py) instead of starting
    nsjail and an interpreter for each sample: the same jail (a test checks it against
    nsjail's), about a third of the CPU per sample (docs/benchmarks.md, "Code throughput").
    "auto" (default): on with the nsjail sandbox when the service runs as root, unless
    --warm-jails is given; "on": on (nsjail, root, no --warm-jails); "off": nsjail starts every
    jail (pre-started ones, --warm-jails). The zygote does root's work (namespaces, mounts, uid
    changes); the verifier image's non-root user has nsjail's file capabilities only, so it runs
    "off". It needs its system-call module, sandbox/jailsys.c: built at start with a C compiler
    against the jail interpreter's headers (make setup installs both), or prebuilt and named by
    $MAGIC_SANDBOX_JAILSYS. Without either the service refuses to start, naming what is missing.
    The service's log names the way it starts jails."""
    math_timeout_s: float = 5.0
    """Hard wall-clock deadline for one math item, seconds, unless the item asks for another.
    5 s is far above a normal item (~10 ms) and bounds a sympy blow-up."""
    max_timeout_s: float = 300.0
    """The largest per-item deadline a caller may ask for, seconds; a larger one is
    INVALID_INPUT (a client cannot pin a worker for an hour)."""
    max_memory_mb: int = 4096
    """The largest per-item program memory (``limits.memory_mb``) a caller may ask for, MiB; a
    larger one is INVALID_INPUT (one item cannot claim the pod's memory). Default 4 GiB."""
    max_pending: int = 4096
    """Items queued per domain beyond those running; past it a batch call gets
    RESOURCE_EXHAUSTED and a stream waits (backpressure). Bounds server memory."""
    max_output_mb: int = DEFAULT_MAX_OUTPUT_MB
    """The server's maximum output (stdout, or the output a harness captures) of one test of a
    code item, MiB; more is OUTPUT_LIMIT. lcb and skywork items get all of it (LiveCodeBench
    has no output cap, nor has Skywork-OR1's copy of its judge: raise this, and the item's
    memory_mb, to judge programs that print more); the default profile keeps its own 8 MiB
    cap, or this maximum if it is lower. Each test's output is
    compared in a worker limited by --worker-memory-mb. Default 64 MiB."""
    worker_memory_mb: int = 2048
    """Address-space limit of each math worker process, MiB; a bigger answer is MEMORY_LIMIT."""
    worker_max_tasks: int = 2000
    """Tasks a worker process (math, or comparing a program's output) runs before it is
    replaced by a fresh fork of the warm forkserver; 0: never. Bounds what a long-lived worker
    accumulates (caches, heap holes): in a 60-minute soak the workers grew +4.5 MB/hour. A
    replacement costs a fork, a few milliseconds per 2,000 tasks."""
    profile: ProfileName = "default"
    """The judging profile of items that name none: "default" (this project's rules), "lcb"
    (LiveCodeBench's judge) or "skywork" (the released Skywork-OR1 reward). See docs/verifier-service.md's
    table of profiles."""


@dataclass
class ServeConfig:
    """``verifier serve``: run the verification service. At start it raises its soft limit
    of open files (RLIMIT_NOFILE) to the hard limit: connections and jails all need
    descriptors, and the HTTP gateway's connections are capped below it
    (--http-max-connections)."""

    host: str = "127.0.0.1"
    """Address to bind. Loopback by default: the service runs model-written code, so exposing
    it is a decision (see --insecure)."""
    port: int = 50051
    """TCP port; 0 picks a free one (the bound port is logged)."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    max_message_mb: int = 256
    """Largest gRPC message either way, MiB. Code rows carry ~105 KB of tests each on average,
    so a 256-item batch of them needs ~27 MiB; the default leaves room for outliers."""
    max_concurrent_rpcs: int = 64
    """Scoring (and reflection) calls served at once; more get RESOURCE_EXHAUSTED at once
    instead of queueing unbounded. Health checks have slots of their own (--max-probe-calls)."""
    max_probe_calls: int = 16
    """Health checks served at once, on threads of their own: no number of scoring calls can
    starve the probes."""
    request_timeout_s: float = 60.0
    """Seconds a unary call may take to deliver its request message after its headers; a
    caller that sends headers and never a body is cancelled instead of holding a slot."""
    idle_timeout_s: float = 300.0
    """Seconds a stream (ScoreStream, ScoreBatchStream) with nothing being scored may go without sending an item or taking
    a result before it is cancelled (the fleet client reopens a stream when it needs one). At
    the call limit, a call waiting on its client for 2 s gives its slot to a new call."""
    stream_inflight: int = 512
    """Items one stream may have in flight; past it the server stops reading that stream
    (gRPC flow control then slows the client), so one client cannot fill the whole queue."""
    grace_s: float = 30.0
    """On SIGTERM: seconds to let in-flight RPCs finish before cancelling them."""
    log_format: Literal["json", "text"] = "json"
    """Log lines as JSON objects (for log pipelines) or plain text."""
    insecure: bool = False
    """Allow binding a non-loopback address without TLS or a token."""
    exit_with_parent: bool = False
    """Drain and exit when the process that started this server dies (a verifier started for
    one job, e.g. by `trainer run`, must not outlive a job that was killed)."""
    tls_cert: Path | None = None
    """PEM certificate chain this server presents; with --tls-key it turns TLS on. Default off:
    on loopback nobody can listen in; off loopback TLS or a token (or --insecure) is required."""
    tls_key: Path | None = None
    """PEM private key of --tls-cert."""
    tls_client_ca: Path | None = None
    """PEM CA bundle: require client certificates signed by it (mutual TLS). Needs --tls-cert."""
    token_file: Path | None = None
    """File of accepted bearer tokens, one per line (two lines during a rotation); re-read when
    it changes (a Kubernetes Secret volume). Clients send ``authorization: Bearer <token>``;
    a missing or wrong one is UNAUTHENTICATED. Health checks need no token (probes)."""
    token_env: str | None = None
    """Name of an environment variable holding an accepted bearer token (read at start-up);
    may be combined with --token-file."""
    health_port: int | None = None
    """Extra plaintext port serving only grpc.health.v1, for Kubernetes gRPC probes, which
    cannot speak TLS. Default: none (probes use the main port when TLS is off)."""
    metrics_port: int | None = None
    """Port of the Prometheus /metrics endpoint (plain HTTP, no token: it shows counts only).
    Default: off; 0 picks a free port (logged)."""
    metrics_host: str | None = None
    """Address the metrics endpoint binds; default: --host."""
    http_port: int | None = None
    """Port of the HTTP gateway on --host (verifier/http/gateway.py): SandboxFusion's POST
    /run_code, OpenRLHF's POST /get_reward and POST /score (JSON items), with this server's
    scorer, sandbox, limits, TLS, token, metrics and drain. Default: off; 0 picks a free port
    (logged)."""
    http_max_body_mb: int = 100
    """Largest HTTP request body, MiB; a bigger one is refused (413) on its Content-Length or
    as soon as it passes the limit. A body must arrive within --request-timeout-s (else 408)."""
    http_max_requests: int = 1024
    """HTTP scoring requests served at once (each /run_code is one run; newer OpenRLHF sends
    one query per request); more get 429 at once. Health checks are not counted."""
    http_max_connections: int = 1024
    """HTTP connections open at once, idle or not: each holds a file descriptor whether or not
    it sends anything, and jails and gRPC need descriptors too. One more is closed as soon as
    it is accepted, before anything is read (verifier_rejected_total{reason=
    "http_connections"}). Whatever is set here, the gateway holds at most half the
    descriptors above a reserve of 128: (soft RLIMIT_NOFILE - 128) // 2, e.g. 448 under the
    usual 1,024 (`verifier serve` raises its soft limit to the hard one at start; the bound
    in force is logged as http_max_connections)."""
    http_max_connections_per_peer: int = 256
    """HTTP connections open at once from one IP address, and never more than half the
    connections in force (--http-max-connections), so one client cannot take them all; more
    are closed at accept (reason "http_connections_per_peer"). Default 256, above the
    connection pools of the clients the gateway serves (aiohttp's 100, requests' 10)."""
    http_header_timeout_s: float = 10.0
    """Seconds a new HTTP connection may take to send its first request line and headers (its
    TLS handshake included); then it is closed (reason "http_header_timeout"), so a client
    that connects and sends nothing, or half a request, holds a descriptor no longer. The body
    then has --request-timeout-s."""
    http_keepalive_s: float = 30.0
    """Seconds an HTTP connection may stay open after a response without sending the next
    request's headers (an idle keep-alive connection); then it is closed."""

    def __post_init__(self) -> None:
        loopback = _is_loopback(self.host)
        if self.scoring.sandbox == "unsafe-none" and not loopback:
            raise ValueError(
                "--sandbox unsafe-none runs model-written code without isolation and is allowed "
                f"only on a loopback address, not {self.host!r}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if not loopback and not (self.tls or self.token_file or self.token_env or self.insecure):
            raise ValueError(
                f"refusing to bind non-loopback address {self.host!r} without TLS "
                "(--tls-cert/--tls-key) or a token (--token-file/--token-env); pass --insecure "
                "to do it anyway"
            )
        if self.max_message_mb < 1:
            raise ValueError("max_message_mb must be >= 1")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"--http-port must be 0-65535, got {self.http_port}")
        for name in ("max_concurrent_rpcs", "max_probe_calls", "http_max_body_mb",
                     "http_max_requests", "http_max_connections",
                     "http_max_connections_per_peer"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("request_timeout_s", "idle_timeout_s", "http_header_timeout_s",
                     "http_keepalive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds")
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
        if self.token_file is not None or self.token_env is not None:
            TokenSource(self.token_file, self.token_env)  # fail now on an empty token source

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _default_client() -> ClientConfig:
    # An evaluation is one long stream: a whole benchmark's code items can take well over the
    # library default of 600 s.
    return ClientConfig(timeout_s=24 * 3600.0)


@dataclass
class EvalConfig:
    """``verifier eval``: score k responses per problem and report avg@k / pass@k. Give either
    ``--input`` (a generations JSONL that carries its ground truths) or ``--problems`` with
    ``--generations``. Exit status: 0 every row judged; 3 the summary is written but some rows
    were not judged (the summary's not_judged says which and why); 1 an error that stopped the
    run (no summary); 2 bad flags."""

    output: Annotated[Path, tyro.conf.arg(aliases=["-o"])]
    """Where to write the summary JSON."""
    input: Annotated[Path | None, tyro.conf.arg(aliases=["-i"])] = None
    """Generations, one problem per line: {"id", "domain", "ground_truth", "data_source"?,
    "responses": [...], "limits"?}."""
    problems: list[str] = field(default_factory=list)
    """Problems files (FILE[,FILE...]): LiveCodeBench release rows (JSONL), verl/Skywork
    parquet, or plain JSONL {"id", "domain", "ground_truth", "data_source"?}; any mix."""
    generations: Path | None = None
    """With --problems: LiveCodeBench's custom-evaluator JSON [{"question_id", "code_list"}]
    (code already extracted) or JSONL {"id", "responses": [full model outputs]}, matched to
    the problems by id (a LiveCodeBench problem's id is its question_id)."""
    lcb_start: str = LCB_REPORT_WINDOW[0]
    """First contest_date of LiveCodeBench problems kept (inclusive; the report's window).
    Problems outside the window are left out of every number and counted."""
    lcb_end: str = LCB_REPORT_WINDOW[1]
    """Last contest_date of LiveCodeBench problems kept (inclusive, at midnight)."""
    lcb_all_dates: bool = False
    """No contest-date window: keep every LiveCodeBench problem."""
    lcb_profile: Literal["default", "lcb", "skywork"] = "lcb"
    """Judging profile of LiveCodeBench problems (lcb: LiveCodeBench's own judge). The other
    problems name none: the verifier's default applies (in-process: --profile)."""
    explain: Literal["default", "lcb", "skywork", "exact"] | None = None
    """Also judge the LiveCodeBench problems' responses under this profile (e.g. default: this
    project's rules, under which correct programs pass) and report, per problem and overall,
    where it and --lcb-profile disagree and the class of rule that explains each disagreement
    (verifier/eval/explain.py: stdin, stdout, wrap, name_guard, exit, preamble, output_cap, ...):
    how much of the model's LiveCodeBench failure is the harness's doing. "exact": judge the
    responses of the problems with a checker (docs/contracts.md 1) again by the exact rule and
    report how many verdicts the checker changed. The summary's explain block; a table on
    stdout. Doubles the judging work. With --problems only."""
    addr: str | None = None
    """HOST:PORT of a running verifier, a comma list of them, or dns:///NAME:PORT (work is
    spread over the healthy replicas and fails over). Without it, responses are scored
    in-process through the same code the server runs."""
    k: int | None = None
    """k of avg@k / pass@k. Default: the smallest number of responses of any problem."""
    skip_invalid: bool = False
    """Skip malformed problem rows, --input lines and generations entries (named in the
    summary's skipped, skipped_problem_rows and generations_of_skipped_rows, left out of every
    number; exit 0). Without it a malformed problem row or --input line is NOT JUDGED: named
    in the summary's not_judged with its file and line, its responses and the reason, the rest
    scored, exit 3; a malformed generations entry fails the command (exit 1, naming its file
    and entry). A line that cannot be decoded at all (not JSON, not UTF-8, nested too deeply)
    is malformed too."""
    allow_errors: bool = False
    """Count responses the verifier could not score (INVALID_INPUT, SANDBOX_ERROR,
    INTERNAL_ERROR) as incorrect and write the summary; without it they fail the command
    (exit 1) once the rest is scored: --results-output is written, the summary is not. Rows
    that cannot be judged at all (malformed, LiveCodeBench tests that inflate past
    verifier.data.lcb.MAX_LCB_TESTS_BYTES, a ground truth over the verifier's cap) are never sent
    and never fail the command: named in the summary's not_judged (exit 3) and left out of
    every number, or with this flag their responses counted as incorrect (INVALID_INPUT)."""
    results_output: Path | None = None
    """Also write one JSON line per scored response (id, index, status, reward, detail)."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    client: ClientConfig = field(default_factory=_default_client)
    progress: Literal["auto", "on", "off"] = "auto"
    """Progress bar: "auto" shows it on a terminal only."""
    log_format: Literal["json", "text"] = "text"

    def __post_init__(self) -> None:
        if self.input is not None and (self.problems or self.generations is not None):
            raise ValueError("give either --input or --problems with --generations, not both")
        if self.input is None and not (self.problems and self.generations is not None):
            raise ValueError("give --input GENERATIONS.jsonl, or --problems FILE[,FILE...] "
                             "with --generations FILE")
        if self.explain is not None and self.input is not None:
            raise ValueError("--explain compares profiles (exact: the checkers against the "
                             "exact rule) on a problems file: give --problems with "
                             "--generations")
        if self.explain is not None and self.explain == self.lcb_profile:
            raise ValueError(f"--explain {self.explain} is --lcb-profile itself: name another "
                             "profile (e.g. --explain default)")
        for name in ("lcb_start", "lcb_end"):
            try:
                date.fromisoformat(getattr(self, name))
            except ValueError:
                raise ValueError(f"--{name.replace('_', '-')} must be a date like 2024-08-01, "
                                 f"got {getattr(self, name)!r}") from None

    def problem_files(self) -> list[Path]:
        """``--problems`` split at commas."""
        return [Path(p) for arg in self.problems for p in arg.split(",") if p.strip()]

    def lcb_window(self) -> tuple[str, str] | None:
        return None if self.lcb_all_dates else (self.lcb_start, self.lcb_end)


@dataclass
class CheckConfig:
    """``verifier check``: score a JSONL file of items (docs/contracts.md 1) into a JSONL of results."""

    input: Annotated[Path, tyro.conf.arg(aliases=["-i"])]
    """Items, one JSON object per line."""
    output: Annotated[Path, tyro.conf.arg(aliases=["-o"])]
    """Where to write the results, one per line, in input order."""
    addr: str | None = None
    """HOST:PORT of a running verifier, a comma list of them, or dns:///NAME:PORT (every
    address the name resolves to): work is spread over the healthy replicas and fails over.
    Without it, items are scored in-process through the same code the server runs."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    progress: Literal["auto", "on", "off"] = "auto"
    """Progress bar: "auto" shows it on a terminal only."""
    allow_unjudged: bool = False
    """Exit 0 even when some items got no verdict (INVALID_INPUT, SANDBOX_ERROR,
    INTERNAL_ERROR). Default: the results are written, the summary printed, and the exit
    status is 3, as `verifier eval`'s, so a script or CI notices."""
    log_format: Literal["json", "text"] = "text"


@dataclass
class HealthConfig:
    """``verifier health``: exit 0 when the verifier reports SERVING (container health checks).
    Health checks need no token; pass TLS options for a TLS port, or use --health-port."""

    addr: str = "127.0.0.1:50051"
    """HOST:PORT (or a comma list / dns:/// address: then every replica must be SERVING)."""
    wait_s: float = 3.0
    """Seconds to wait for the answer."""
    client: ClientConfig = field(default_factory=ClientConfig)
    log_format: Literal["json", "text"] = "text"
