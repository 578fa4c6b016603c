"""``trainer ablate NAME``: run the variants of one Skywork-OR1 ablation (trainer/ablation/designs.py)
through ``trainer run`` on the toy world, then write DIR/NAME/report.md, summary.json and
overlay plots.

Every run is ``python -m trainer.cli run --config trainer/configs/demo.yaml key=value ...``
in a child process: the profile's overrides, then ``--set`` ones, the ablation's setup, the
variant's, and last the run's place (name, output_dir, model_path, data). The runs start from a
warm-started policy made by a one-step ``trainer run`` of the demo config (its warm_start/
folder), kept per out directory: on the quick and full profiles one for all (seed 0), so seeds
vary the RL run (data order, sampling, mini-batch shuffles), not the starting point; on the
confirm profile one per seed, made with that seed and shared by both arms of its pairs, so a
label holds over the spread of warm starts.

``--profile confirm`` runs the pre-registered design (trainer/ablation/preregistration.py) on its seeds,
from a clean checkout whose pre-registration document is committed; its summary is marked
confirmatory only when every run's code commit (environment.json) descends from the
pre-registration commit, and names every run that does not.

Resume: a run whose metrics reach its last step with a held-out evaluation is finished and not
run again; one with a checkpoint continues with ``trainer run --resume``. Reuse: a variant whose
resolved config (all but its name and place) equals a finished run of another ablation in the
same ``--out`` is not run again either: its run directory becomes a link to that run (several
ablations share a baseline: ``kl``'s beta0, ``group-size``'s g8, ``batch-size``'s b16 and
``adv-mask``'s none are all the demo's own config). On the confirm profile a twin counts only
when it would be confirmatory for this ablation too (made at or after its pre-registration
commit); one that would not is run again. Worlds: each ablation names the data it trains on
(trainer/ablation/designs.py WORLDS; ``--world`` picks another on an exploratory profile); a
world's data lives in DIR/data-WORLD, the demo's in DIR/data. ``--jobs N`` makes the warm
starts, then the runs, N at a time (the dose-finding runs stay one at a time: each rung waits
for the one below); a run's result does not depend on N beyond the CPU's own rounding, its
seconds do (runs sharing the cores each take longer). Ctrl-C is forwarded once to every
running child (each in its own session, so a terminal's Ctrl-C reaches only this driver): each
finishes its step and writes a checkpoint, no further run starts; a second Ctrl-C kills them.
SIGTERM is handled as a Ctrl-C.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer import metric_names as mn
from trainer.ablation.report import (
    DONE,
    PLOTS,
    build_summary,
    fmt,
    report_markdown,
    write_plots,
)
from trainer.ablation.designs import (
    ABLATIONS,
    LABELS,
    PROFILES,
    WORLDS,
    Ablation,
    Variant,
    run_numbers,
)
from trainer.ablation import preregistration
from trainer.config import RunConfig, load_config, read_run_config
from trainer.plot import read_metrics
from trainer.provenance import code_commit, environment_records

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
BASE_CONFIG = ROOT / "trainer" / "configs" / "demo.yaml"
MARKER = "ablate.json"  # in each run directory: the overrides it was made with
PLACE = ("name", "output_dir")  # where a run lives, not what it is


class UnknownAblation(ValueError):
    pass


@dataclass
class AblateOptions:
    name: str
    profile: str = "quick"
    seeds: int | None = None
    """Seeds per variant (default: the profile's)."""
    out: Path = Path("runs/ablate")
    variants: list[str] | None = None
    """Run only these variants (default: the profile's)."""
    extra: list[str] = field(default_factory=list)
    """``key=value`` overrides for every run, after the profile's (``--set``)."""
    world: str | None = None
    """Run in this world (trainer/ablation/designs.py WORLDS; default: the ablation's own)."""
    jobs: int = 1
    """Runs (and warm starts) at a time, each a child process (``--jobs``)."""


@dataclass
class RunOutcome:
    variant: str
    seed: int
    run_dir: Path
    status: str  # "finished" | "skipped" (finished before) | "reused" | "failed" | "interrupted"
    seconds: float = 0.0
    reused_from: Path | None = None  # "reused": the other ablation's run it links to
    error: str = ""
    rows: list[dict] = field(default_factory=list)


def get_ablation(name: str) -> Ablation:
    if name not in ABLATIONS:
        raise UnknownAblation(f"unknown ablation {name!r}; valid ones: {', '.join(ABLATIONS)}")
    return ABLATIONS[name]


def list_text() -> str:
    """Each ablation: its claim, its mechanism and benefit checks, whether it is pre-registered,
    and whether the CPU toy world can decide it (the mechanism that is absent, when not)."""
    out = []
    for n, a in ABLATIONS.items():
        out.append(f"{n}: {a.claim}")
        if a.world != "demo":
            out.append(f"    world: {a.world} ({WORLDS[a.world].about})")
        for role in LABELS:
            c = a.labelled(role)
            out.append(f"    {role}: {c.describe() if c else 'none (the claim has no such part)'}")
        plan = preregistration.plan(n)
        out.append(f"    pre-registration: {'not registered: ' + plan.pending if plan.pending else f'{plan.seeds} seeds (--profile confirm)'}")
        if plan.dose is not None:
            out.append(f"    dose, found first on --profile confirm: {plan.dose.rule()}")
        if a.undecidable_on_cpu:
            out.append(f"    UNDECIDABLE ON CPU ({'quick and full profiles' if plan.dose else 'every profile'}): {a.undecidable_on_cpu}")
        optional = [v.name for v in a.variants if v.optional]
        if optional:
            out.append(f"    optional variants (--variants): {', '.join(optional)}")
    return "\n".join(out)


def run_finished(rows: Sequence[dict], total_steps: int, with_eval: bool) -> bool:
    """A run directory's metrics reach ``total_steps`` (and its final evaluation)."""
    last = [r for r in rows if r.get(mn.STEP) == total_steps and mn.REWARD_MEAN in r]
    return bool(last) and (not with_eval or mn.EVAL_ACCURACY in last[-1])


def _overrides_text(overrides: dict[str, str]) -> list[str]:
    """``key=value`` strings (the run config reads each value as its field expects:
    ``magic.entropy_mode=off`` is the string "off")."""
    return [f"{k}={v}" for k, v in overrides.items()]


# -- the driver --------------------------------------------------------------------------------

def _wait(proc: subprocess.Popen) -> int:
    """The child's exit status, waited for in short slices: Python runs a signal's handler on
    the main thread only, and the kernel may hand Ctrl-C or SIGTERM to another of this
    process's threads; a main thread blocked in an untimed waitpid() would then learn of it
    only when the child had finished on its own."""
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue


class Driver:
    def __init__(self, opts: AblateOptions):
        self.ablation = get_ablation(opts.name)
        if opts.profile not in PROFILES:
            raise ValueError(f"unknown profile {opts.profile!r}; valid: {', '.join(PROFILES)}")
        self.profile = PROFILES[opts.profile]
        self.opts = opts
        if self.profile.confirmatory:
            plan = preregistration.plan(self.ablation.name)
            if plan.pending:
                raise ValueError(f"{self.ablation.name} has no pre-registered design "
                                 f"({plan.pending}); --profile full makes an exploratory run")
            if opts.seeds is not None or opts.variants or opts.extra or (
                    opts.world not in (None, self.ablation.world)):
                raise ValueError("--profile confirm runs the registered design as it is: no "
                                 "--seeds, --variants, --set or another --world")
            self.seeds = plan.seed_list
        else:
            self.seeds = list(range(opts.seeds if opts.seeds is not None
                                    else self.profile.seeds))
        if not self.seeds:
            raise ValueError("--seeds must be >= 1")
        if opts.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {opts.jobs}")
        self.jobs = opts.jobs
        self._children: set[subprocess.Popen] = set()
        self._children_lock = threading.Lock()
        self._stop = threading.Event()
        """Set on Ctrl-C, SIGTERM or a run stopped from outside: no further child starts
        (runs queued behind --jobs are dropped) and the --jobs wait ends (_each)."""
        variants = self.ablation.variants_for(opts.profile)
        if opts.variants:
            known = {v.name: v for v in self.ablation.variants}
            bad = [v for v in opts.variants if v not in known]
            if bad:
                raise ValueError(f"unknown variants {bad} of {self.ablation.name}; valid: "
                                 f"{', '.join(known)}")
            variants = tuple(known[v] for v in opts.variants)
        self.variants: tuple[Variant, ...] = variants
        self.dose_runs: list[Path] = []
        """The dose-finding runs this ablation's summary rests on (their code is checked as
        the arms' is)."""
        self.dose_overrides: dict[str, dict[str, str]] = {}
        """variant -> the chosen dose's override (confirm profile, trainer/ablation/preregistration.py)."""
        world = opts.world or self.ablation.world
        if world not in WORLDS:
            raise ValueError(f"unknown world {world!r}; valid: {', '.join(WORLDS)}")
        self.world = WORLDS[world]
        self.out = Path(opts.out).resolve()
        self.root = self.out / self.ablation.name
        self.data = self.out / ("data" if not self.world.data_args else f"data-{world}")

    def common(self) -> list[str]:
        return [*self.profile.overrides, *self.world.overrides, *self.opts.extra]

    def data_overrides(self) -> list[str]:
        return [f"data.train_files=[{self.data / 'train.jsonl'}]",
                f"data.eval_files=[{self.data / 'eval.jsonl'}]", "log.progress=off"]

    # -- shared inputs --
    def write_data(self) -> None:
        """The world's data: the demo's (scripts/demo.py: same generator arguments), or
        datasets/toyworld.py with the world's arguments (written again only when they
        changed)."""
        if self.world.data_args:
            stamp, wanted = self.data / "ARGS", " ".join(self.world.data_args)
            if ((self.data / "eval.jsonl").exists() and stamp.exists()
                    and stamp.read_text() == wanted):
                return
            self.data.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, str(ROOT / "datasets" / "toyworld.py"), "--out",
                            str(self.data), *self.world.data_args], check=True)
            stamp.write_text(wanted)
            return
        spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
        demo = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(demo)
        self.data.mkdir(parents=True, exist_ok=True)
        demo.write_data(self.data)

    def warm_start(self, seed: int = 0) -> Path:
        """The warm-started policy a run starts from: a one-step ``trainer run`` of the base
        config with ``seed``, kept per out directory under a key of the settings that shape it
        (so another ablation, or other ``--set`` steps, reuse it)."""
        overrides = [*self.common(), *self.data_overrides(), "total_steps=1",
                     "eval.every_steps=0", "checkpoint_every=0", "log.plots=false",
                     "log.samples_every=0", "log.tensorboard=false", f"seed={seed}"]
        cfg = load_config(BASE_CONFIG, overrides).to_dict()
        shaping = {k: cfg[k] for k in ("tiny_model", "warm_start", "data", "seed")}
        shaping["max_prompt_length"] = cfg["magic"]["max_prompt_length"]
        key = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:10]
        run_dir = self.out / f"warm-start-{key}"
        model = run_dir / "warm_start"
        if (model / "config.json").exists():
            return model
        log.info("warm start: %s", run_dir)
        log_file = self.out / "logs" / f"{run_dir.name}.log"
        rc = self._child([*overrides, f"name={run_dir.name}", f"output_dir={self.out}"],
                         log_file, resume=None)
        if rc != 0 or not (model / "config.json").exists():
            raise RuntimeError(f"the warm start failed (exit {rc}): {error_tail(log_file)}")
        return model

    # -- runs --
    def run_overrides(self, variant: Variant, seed: int, model: Path) -> list[str]:
        return [*self.common(), *_overrides_text(self.ablation.setup),
                *_overrides_text(variant.overrides),
                *_overrides_text(self.dose_overrides.get(variant.name, {})),
                *self.data_overrides(),
                f"seed={seed}", f"name={variant.name}-s{seed}",
                f"output_dir={self.root / 'runs'}", f"model_path={model}", "tiny_model=null",
                "warm_start.steps=0"]

    def run_one(self, variant: Variant, seed: int, model: Path) -> RunOutcome:
        overrides = self.run_overrides(variant, seed, model)
        run_dir = self.root / "runs" / f"{variant.name}-s{seed}"
        log_file = self.root / "logs" / f"{run_dir.name}.log"
        outcome = RunOutcome(variant.name, seed, run_dir, "finished")
        marker = run_dir / MARKER
        resume: Path | None = None
        try:
            identity = run_identity(load_config(BASE_CONFIG, overrides).to_dict())
        except ValueError:  # an invalid variant: its run fails below and is recorded with why
            identity = None
        if run_dir.is_symlink() and not run_dir.exists():  # its twin was removed: run it here
            run_dir.unlink()
        if run_dir.is_symlink() and not self.twin_counts(variant, seed, run_dir.resolve()):
            # A link made before the confirm profile checked twins: its run cannot count here.
            run_dir.unlink()
        if not run_dir.exists():
            twin = self.finished_twin(identity, variant, seed)
            if twin is not None:
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                run_dir.symlink_to(os.path.relpath(twin, run_dir.parent), target_is_directory=True)
                log_file.parent.mkdir(parents=True, exist_ok=True)
                with log_file.open("a") as f:
                    f.write(f"reused {twin}: the same resolved config, finished\n")
        if marker.exists():
            if (run_dir / "config.yaml").exists() and _identity_of(run_dir) != identity:
                outcome.status = "failed"
                outcome.error = (f"{run_dir} was made with another config (another profile, "
                                 "--set or version): remove it or use another --out")
                return outcome
            rows = _rows(run_dir)
            if _reached_its_end(run_dir, rows):
                outcome.status, outcome.rows = "skipped", rows
                outcome.seconds = float(json.loads(marker.read_text()).get("seconds", 0.0))
                if run_dir.is_symlink():
                    outcome.status, outcome.reused_from = "reused", run_dir.resolve()
                return outcome
            if (run_dir / "checkpoints" / "latest").exists():
                resume = run_dir
        if resume is None and run_dir.is_dir() and not run_dir.is_symlink():
            # An interrupted run with no checkpoint yet: started again from nothing (trainer
            # run refuses a directory that holds a run; this one is the ablation's own).
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"overrides": overrides}, indent=1))
        t0 = time.monotonic()
        rc = self._child(overrides, log_file, resume=resume)
        outcome.seconds = time.monotonic() - t0
        outcome.rows = _rows(run_dir)
        if rc != 0:
            outcome.status = "failed"
            outcome.error = f"exit {rc}: {error_tail(log_file)}"
        elif not _reached_its_end(run_dir, outcome.rows):
            outcome.status = "interrupted"
        else:  # the run's wall-clock, reported again when a re-run skips it
            marker.write_text(json.dumps({"overrides": overrides, "seconds": outcome.seconds},
                                         indent=1))
        return outcome

    def finished_twin(self, identity: dict[str, Any] | None, variant: Variant,
                      seed: int) -> Path | None:
        """A finished run of another ablation under the same ``--out`` made with the same
        resolved config (its place aside) that may count here (:meth:`twin_counts`), or None.
        Links are skipped: a twin is a run."""
        if identity is None:
            return None
        for marker in sorted(self.out.glob(f"*/runs/*/{MARKER}")):
            run_dir = marker.parent
            if run_dir.is_symlink() or run_dir.parent.parent == self.root:
                continue
            if (_identity_of(run_dir) == identity and _reached_its_end(run_dir, _rows(run_dir))
                    and self.twin_counts(variant, seed, run_dir)):
                return run_dir
        return None

    def twin_counts(self, variant: Variant, seed: int, twin: Path) -> bool:
        """Whether another ablation's run may stand for this one: always on an exploratory
        profile; on the confirm profile only when it would be confirmatory for this ablation
        (made from a clean checkout at or after this ablation's pre-registration commit: a
        run another ablation registered earlier may predate it). One that may not is run
        again here."""
        if not self.profile.confirmatory:
            return True
        _, why = preregistration.problems(
            self.ablation, [(variant.name, seed, environment_records(twin))])
        return not why

    def _child(self, overrides: list[str], log_file: Path, resume: Path | None) -> int:
        """One ``trainer run`` child, waited for; called from the main thread or from a
        ``--jobs`` worker thread. A KeyboardInterrupt reaches the main thread only (Python
        runs signal handlers there): the main thread then stops every live child
        (:meth:`_stop_children`), whichever thread started it."""
        cmd = [sys.executable, "-m", "trainer.cli", "run"]
        cmd += ["--resume", str(resume)] if resume is not None else ["--config", str(BASE_CONFIG),
                                                                    *overrides]
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            with self._children_lock:  # no child may start once a Ctrl-C stopped the others
                if self._stop.is_set():
                    raise KeyboardInterrupt
                # Own session: a terminal's Ctrl-C reaches only this driver, which forwards it.
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                self._children.add(proc)
            try:
                return _wait(proc)
            except KeyboardInterrupt:
                self._stop_children()
                raise
            finally:
                with self._children_lock:
                    self._children.discard(proc)

    def _stop_children(self) -> None:
        """On the main thread after a Ctrl-C (or SIGTERM): SIGINT once to every live child,
        so each finishes its step and writes a checkpoint, and wait for them; a second Ctrl-C
        kills them. No child starts afterwards."""
        with self._children_lock:
            self._stop.set()
            live = list(self._children)
        for proc in live:
            proc.send_signal(signal.SIGINT)
        print("\nCtrl-C: " + ("the running variant finishes its step and writes a checkpoint"
                             if len(live) <= 1 else f"the {len(live)} running variants finish "
                             "their step and write a checkpoint") + " (Ctrl-C again to kill)",
              file=sys.stderr, flush=True)
        try:
            for proc in live:
                _wait(proc)
        except KeyboardInterrupt:
            for proc in live:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _each(self, items: Sequence[Any], work: Callable[[Any], Any]) -> list[Any]:
        """``work(item)`` for every item, ``self.jobs`` at a time on worker threads (each
        waits on its own child process; the work is the children's, so threads suffice);
        results in the items' order. A Ctrl-C or SIGTERM stops every child, drops the queued
        items and raises KeyboardInterrupt here. A worker's exception is raised here after the
        others finished."""
        if self.jobs == 1:  # in the main thread: the order and output of a plain run
            return [work(item) for item in items]
        # While workers run, a signal only sets the flag this loop reads: an exception
        # raised by a handler in the middle of futures.wait() can leave a future's lock held,
        # and the worker that then sets that future's result waits on it for ever.
        handlers = {s: signal.signal(s, lambda signum, frame: self._stop.set())
                    for s in (signal.SIGINT, signal.SIGTERM)}
        pool = futures.ThreadPoolExecutor(max_workers=self.jobs,
                                          thread_name_prefix=f"ablate-{self.ablation.name}")
        try:
            pending = [pool.submit(work, item) for item in items]
            # Only the unfinished ones: FIRST_COMPLETED returns at once while any is done,
            # which would spin this thread once the first item has finished.
            while (running := [f for f in pending if not f.done()]) and not self._stop.is_set():
                futures.wait(running, timeout=0.2, return_when=futures.FIRST_COMPLETED)
        finally:
            for s, h in handlers.items():  # a second Ctrl-C is a KeyboardInterrupt again
                signal.signal(s, h)
        try:
            if self._stop.is_set():
                self._stop_children()
                raise KeyboardInterrupt
            return [f.result() for f in pending]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def run(self) -> tuple[dict[str, Any], list[RunOutcome]]:
        """Every variant x seed; returns (summary, outcomes). KeyboardInterrupt propagates
        after the running child stopped."""
        if self.profile.confirmatory:
            self.check_confirmable()
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_data()
        undecidable, dose = None, None
        dose_plan = (preregistration.plan(self.ablation.name).dose
                     if self.profile.confirmatory else None)
        if dose_plan is not None:
            dose = self.find_dose(dose_plan)
            if dose["chosen"] is None:
                undecidable = ("no dose of the registered ladder brought the mechanism into "
                               "play: " + ", ".join(f"{dose_plan.knob}={k}: {fmt(v)}"
                                                    for k, v in dose["curve"].items())
                               + (f" (reference {dose_plan.relative_to}: "
                                  f"{fmt(dose['reference'])})" if dose_plan.relative_to else ""))
                self.variants = ()  # the arms would measure a mechanism that does not act
            else:
                undecidable = ""
                for name in dose_plan.arms or [v.name for v in self.variants]:
                    self.dose_overrides[name] = {dose_plan.knob: dose["chosen"]}
        models: dict[int, Path] = {}
        if self.variants and self.profile.warm_start_per_seed:
            models = dict(zip(self.seeds, self._each(self.seeds, self.warm_start)))
        elif self.variants:
            models = dict.fromkeys(self.seeds, self.warm_start(0))

        def one(item: tuple[Variant, int]) -> RunOutcome:
            variant, seed = item
            if self._stop.is_set():  # queued behind --jobs when a Ctrl-C came: never started
                raise KeyboardInterrupt
            print(f"[{self.ablation.name}] {variant.name} seed {seed} ...", flush=True)
            o = self.run_one(variant, seed, models[seed])
            how = {"skipped": "already finished, not run again",
                   "reused": f"reused {o.reused_from} (the same resolved config)",
                   "finished": f"finished in {o.seconds:.0f} s",
                   "interrupted": "interrupted", "failed": f"FAILED: {o.error}"}[o.status]
            print(f"[{self.ablation.name}] {variant.name} seed {seed}: {how}", flush=True)
            if o.status == "interrupted":  # its child was stopped: so is the ablation
                self._stop.set()
                raise KeyboardInterrupt
            return o

        outcomes: list[RunOutcome] = self._each(
            [(variant, seed) for variant in self.variants for seed in self.seeds], one)
        summary = build_summary(self.ablation, self.variants, outcomes, self.quadruples(),
                                base=self.out, undecidable=undecidable,
                                dose_overrides=self.dose_overrides)
        summary["profile"] = self.profile.name
        if dose is not None:
            summary["dose"] = dose
        summary.update(self.standing(outcomes))
        write_outputs(self, summary, outcomes)
        return summary, outcomes


    def find_dose(self, dose: preregistration.Dose) -> dict[str, Any]:
        """The registered dose-finding step: short runs of ``dose.measured_on`` up the ladder
        (after one reference run for a relative rule), from the dose seed's own warm start,
        stopping at the first value the rule accepts. Returns the rule, the measured curve
        (value -> metric), the reference's metric and the chosen value (None: none
        qualified). A dose run that fails stops the ablation: its arms would run at no known
        dose."""
        model = self.warm_start(dose.seed)
        known = {v.name: v for v in self.ablation.variants}

        def short(variant: Variant, extra: dict[str, str], tag: str) -> float | None:
            probe = Variant(f"dose-{tag}", {**variant.overrides, **extra,
                                            "total_steps": str(dose.steps),
                                            "eval.every_steps": "0"})
            print(f"[{self.ablation.name}] dose run {probe.name} ...", flush=True)
            o = self.run_one(probe, dose.seed, model)
            self.dose_runs.append(o.run_dir)
            if o.status == "interrupted":
                raise KeyboardInterrupt
            if o.status not in DONE:
                raise RuntimeError(f"the dose run {probe.name} failed: {o.error}")
            value = run_numbers(o.rows).get(dose.metric)
            print(f"[{self.ablation.name}] dose run {probe.name}: {dose.metric} {fmt(value)}",
                  flush=True)
            return value

        reference = (short(known[dose.relative_to], {}, dose.relative_to)
                     if dose.relative_to else None)
        curve: dict[str, float | None] = {}
        chosen = None
        for value in dose.ladder:
            curve[value] = short(known[dose.measured_on], {dose.knob: value},
                                 f"{dose.measured_on}-{value}")
            if dose.passes(curve[value], reference):
                chosen = value
                break
        return {"rule": dose.rule(), "knob": dose.knob, "curve": curve,
                "reference": reference, "chosen": chosen}

    def check_confirmable(self) -> None:
        """Refuse to start a confirmatory ablation whose runs could not count: uncommitted
        changes, or a design that is not the one committed in the pre-registration."""
        code = code_commit()
        if not code["commit"]:
            raise RuntimeError("--profile confirm needs a git checkout (the runs record their "
                               "code commit)")
        if code["dirty"]:
            raise RuntimeError("--profile confirm needs a clean checkout: commit or stash the "
                               f"changes to tracked files at {code['commit'][:12]} first")
        fp = preregistration.fingerprint(self.ablation)
        if preregistration.preregistration_commit(self.ablation.name, fp) is None:
            raise RuntimeError(f"the design of {self.ablation.name} is not the one committed in "
                               f"{preregistration.DOC}: run python -m "
                               "trainer.ablation.preregistration, commit it, then run again")

    def standing(self, outcomes: Sequence[RunOutcome]) -> dict[str, Any]:
        """summary.json's top-level record of where its runs come from: the seeds, each run's
        code commits and machines (environment.json; the dose runs' too), and, on the confirm
        profile, whether they are confirmatory (and why not)."""
        records = {(o.variant, o.seed): environment_records(o.run_dir) for o in outcomes
                   if o.status in DONE}
        dose_records = {run.name: environment_records(run) for run in self.dose_runs}
        every = [r for rs in (*records.values(), *dose_records.values()) for r in rs]
        out: dict[str, Any] = {
            "seeds": list(self.seeds),
            "code_commits": sorted({(r.get("code") or {}).get("commit") or "unknown"
                                    for r in every}),
            "machines": _machines(every),
            "confirmatory": False,
        }
        if not self.profile.confirmatory:
            out["not_confirmatory_because"] = [f"the {self.profile.name} profile is exploratory"]
            return out
        commit, why = preregistration.problems(
            self.ablation, [(v, s, rs) for (v, s), rs in records.items()])
        if commit is not None:  # the dose runs decide at which dose the arms run, or that none
            for name, rs in dose_records.items():
                why += preregistration.code_problems(f"dose run {name}", rs, commit)
        missing = [f"{o.variant} seed {o.seed}: {o.status}" for o in outcomes
                   if o.status not in DONE]
        why += missing
        out.update({"confirmatory": not why, "preregistration_commit": commit,
                    "fingerprint": preregistration.fingerprint(self.ablation)})
        if why:
            out["not_confirmatory_because"] = why
        return out

    def quadruples(self) -> dict[str, list[int]]:
        """(N_SGD, D_R, D_T, N_reuse) in numbers, as each variant's config derives it."""
        out = {}
        for v in self.variants:
            if v.quadruple is None:
                continue
            try:
                q = load_config(BASE_CONFIG, self.run_overrides(v, 0, Path("model"))) \
                    .magic.off_policy()
            except ValueError:  # an invalid variant: recorded as failed by its run
                continue
            out[v.name] = [q.n_sgd, q.rollout_batch_size, q.mini_batch_size, q.n_reuse]
        return out


def _machines(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct machines and numerical builds among environment records: CPU model and
    kernel-choosing flags, torch's CPU capability, MKL, torch's version."""
    seen: list[dict[str, Any]] = []
    for r in records:
        m = {"cpu": (r.get("cpu") or {}).get("model"),
             "flags": (r.get("cpu") or {}).get("flags"),
             "torch_cpu_capability": (r.get("numerics") or {}).get("torch_cpu_capability"),
             "mkl": (r.get("numerics") or {}).get("mkl"),
             "torch": (r.get("libraries") or {}).get("torch")}
        if m not in seen:
            seen.append(m)
    return seen


def _rows(run_dir: Path) -> list[dict]:
    try:
        return read_metrics(run_dir)
    except (FileNotFoundError, ValueError):
        return []


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run: the resolved config read back through the typed tree
    (so a config.yaml and a fresh load compare alike), without its name and output_dir."""
    plain = RunConfig.from_dict(config).to_dict()
    return {k: v for k, v in plain.items() if k not in PLACE}


def _identity_of(run_dir: Path) -> dict[str, Any] | None:
    """The run_identity of a run directory's config.yaml; None without one, or when this
    version no longer reads it (a run of another version is never the same run)."""
    made = read_run_config(run_dir)
    return run_identity(made.to_dict()) if made is not None else None


def _reached_its_end(run_dir: Path, rows: Sequence[dict]) -> bool:
    """Whether a run directory's metrics rows reach the last step of its own config.yaml (and
    its final evaluation, when it evaluates): run_finished, with the run's own shape. False
    without a readable config.yaml."""
    cfg = read_run_config(run_dir)
    if cfg is None:
        return False
    return bool(cfg.total_steps) and run_finished(rows, cfg.total_steps,
                                                  bool(cfg.eval.every_steps))


def error_tail(log_file: Path, lines: int = 3) -> str:
    """The last non-empty lines of a child's last run in its log (where its error is)."""
    if not log_file.exists():
        return "no output"
    text = log_file.read_text(errors="replace").split("\n$ ")[-1].splitlines()[1:]
    text = [ln.strip() for ln in text if ln.strip()]
    return " ".join(text[-lines:]) or "no output"


# -- outputs ---------------------------------------------------------------------------------

def write_outputs(driver: Driver, summary: dict[str, Any], outcomes: Sequence[RunOutcome]) -> None:
    root = driver.root
    if any(o.status in DONE for o in outcomes):
        plots = write_plots(root, summary, outcomes)
    else:  # no arm ran (no dose qualified): no empty figures, and none left from a rerun
        plots = []
        for *_, name, _ in PLOTS:
            (root / name).unlink(missing_ok=True)
    seconds = sum(o.seconds for o in outcomes)
    setup = {
        "command": f"trainer ablate {driver.ablation.name} --profile {driver.profile.name} "
                   f"--seeds {len(driver.seeds)}" + "".join(f" --set '{x}'"
                                                            for x in driver.opts.extra),
        "profile": f"{driver.profile.name}: {driver.profile.about}",
        "base": "trainer/configs/demo.yaml (the toy world, a tiny Qwen2 model warm-started "
                "once, 16 prompts x 8 samples, clip-higher 0.28, adaptive entropy target "
                "0.08 with step 0.005 and cap 0.5, no KL), through `trainer run`",
        **({"world": f"{driver.world.name}: {driver.world.about} (trainer/ablation/designs.py "
                     "WORLDS)"} if driver.world.name != "demo" else {}),
        "profile overrides": ", ".join(f"`{x}`" for x in driver.common()) or "none",
        "ablation overrides (every variant)":
            ", ".join(f"`{x}`" for x in _overrides_text(driver.ablation.setup)) or "none",
        "seeds": ", ".join(map(str, driver.seeds)),
        "time": f"{seconds:.0f} s: the runs' wall-clock, summed (an interrupted run counts "
                "from its resume, a reused run the time it took where it ran; the shared warm "
                "start is not counted)",
    }
    summary["setup"] = setup
    (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (root / "report.md").write_text(report_markdown(summary, driver.ablation, setup, plots))


def ablate(opts: AblateOptions) -> int:
    """The command: 0 when every run finished, 1 when any failed, 130 after Ctrl-C."""
    driver = Driver(opts)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # stop as on Ctrl-C: the running variant checkpoints

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        summary, outcomes = driver.run()
    except KeyboardInterrupt:
        print(f"\ninterrupted: run the same command again to resume ({driver.root})",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"verdict: {summary['verdict']}" + (f" ({summary['undecidable_on_cpu']})"
                                              if summary["undecidable_on_cpu"] else ""))
    print("confirmatory" if summary["confirmatory"] else
          "NOT confirmatory: " + "; ".join(summary.get("not_confirmatory_because", [])))
    for c in summary["checks"]:
        low, high = c["ci90"]
        ci = f"[{fmt(low)}, {fmt(high)}]" if low is not None else "no interval"
        print(f"  {c['role']}: {c['check']}: mean difference {fmt(c['mean_diff'])}, 90% {ci}, "
              f"{c['pairs']} pairs, detectable {fmt(c.get('detectable'))} -> {c['verdict']}")
    print(f"report:  {driver.root / 'report.md'}\nsummary: {driver.root / 'summary.json'}")
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed:
        print(f"FAILED: {o.variant} seed {o.seed}: {o.error}", file=sys.stderr)
    return 1 if failed else 0
