"""The pre-registration of the ablations' confirmatory runs: for each ablation, its design fixed
before the runs that may decide its labels (docs/ablations/preregistration.md, rendered from this
module and trainer/ablation/designs.py; a test keeps the two equal).

What is fixed, per ablation: the claim with its figure or table, the arms at their settings, the
mechanism and benefit checks (metric, window, direction or margin), the secondaries, the seeds
(fresh: disjoint from every seed run before), the smallest effect of interest and the power
calculation behind the seed count. A fingerprint of all of it is written into the document;
the pre-registration commit of an ablation is the commit from which its fingerprint has stood
unchanged in the committed document. A run counts as confirmatory only when its code was
committed, clean, at that commit or a descendant, on one of the registered seeds, and the design
it ran is the registered one; ``trainer ablate NAME --profile confirm`` runs exactly that, and
its summary names any run that falls short and is then not confirmatory (:func:`problems`).

An ablation whose design is not ready says why (``pending``): it has no confirmatory profile.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainer import metric_names as mn
from trainer.ablation.stats import check_power, detectable, seeds_for_power
from trainer.ablation.designs import ABLATIONS, LABELS, PROFILES, WORLDS, Ablation, Check

ROOT = Path(__file__).resolve().parents[2]
DOC = Path("docs/ablations/preregistration.md")
"""The rendered pre-registration, relative to the repository root."""

USED_SEEDS = frozenset(range(6))
"""Every seed an ablation or the demo's studies ran before this pre-registration: the full
profile's 0-5 (the 3-seed pilots' 0-2 among them), the demo band's 0-2. A confirmatory seed is
none of them."""
FIRST_SEED = 1000
"""Every registered ablation's seeds run FIRST_SEED, FIRST_SEED + 1, ...: the same seeds in
each, so the arm several ablations share (the demo's own config) is run once per seed."""
BUDGET_MINUTES = 60
"""An ablation's run budget on the 2-core CPU, counting runs another ablation already made."""
MINUTES_PER_RUN = 6
"""One run of the demo's 160 steps with its evaluations, measured on the 2-core CPU (the
exploratory runs: 5.5-10 minutes each)."""


@dataclass(frozen=True)
class Power:
    """What one label's seed count is sized from."""

    sd: float
    """Expected standard deviation of the per-seed paired differences (the metric's units)."""
    effect: float
    """The smallest effect of interest: the true difference the check must find 80% of the
    time (for "similar" and "not_lower": the margin, the truth being no difference)."""
    source: str
    """Where ``sd`` comes from."""


@dataclass(frozen=True)
class Dose:
    """A dose-finding step the confirm profile runs before the arms, for a claim whose
    mechanism does not act at the demo's settings: short runs of one arm up a ladder of one
    knob's values, and a rule, fixed here, that picks the smallest value at which the mechanism
    acts. The arms then run at that value; when none qualifies the ablation is undecidable on
    CPU, and its summary carries the measured curve."""

    knob: str
    """The config key varied (``magic.lr``)."""
    ladder: tuple[str, ...]
    """Its values, smallest dose first."""
    measured_on: str
    """The variant whose short runs measure the dose."""
    metric: str
    """A :func:`trainer.ablation.designs.run_numbers` key of those runs."""
    at_least: float
    """The rule: ``metric`` at least this (or, with ``relative_to``, 1 - metric / the
    reference's metric at least this)."""
    relative_to: str | None = None
    """A variant run once, without the knob, as the reference of a relative rule."""
    arms: tuple[str, ...] | None = None
    """The variants that take the chosen value (None: every arm)."""
    steps: int = 60
    """Steps of each dose run (the first stage: 60 steps at 48 tokens), no evaluation."""
    seed: int = 900
    """One seed, none of the arms' nor of the seeds run before."""

    def rule(self) -> str:
        what = (f"1 - {self.metric} / {self.relative_to}'s" if self.relative_to
                else self.metric)
        return (f"the smallest {self.knob} of {', '.join(self.ladder)} at which {what} of "
                f"{self.measured_on} is at least {self.at_least:g}, over {self.steps}-step runs "
                f"on seed {self.seed}")

    def passes(self, value: float | None, reference: float | None) -> bool:
        if value is None:
            return False
        if self.relative_to is None:
            return value >= self.at_least
        return bool(reference) and 1.0 - value / reference >= self.at_least


@dataclass(frozen=True)
class Plan:
    seeds: int = 0
    """How many registered seeds: FIRST_SEED .. FIRST_SEED + seeds - 1."""
    benefit: Power | None = None
    mechanism: Power | None = None
    pending: str = ""
    """Non-empty: the design is not registered yet, and why (no confirmatory runs)."""
    dose: Dose | None = None
    """Run first, to bring the mechanism into play (None: the demo's settings)."""

    @property
    def seed_list(self) -> list[int]:
        return list(range(FIRST_SEED, FIRST_SEED + self.seeds))


_SD_AUC = ("the exploratory full-profile runs (docs/ablations/{name}/summary.json, seeds 0-5, "
           "one shared warm start): the sd of the paired eval/accuracy_auc differences, the "
           "nearest to the last-3 mean they logged; one warm start per seed may widen it, and "
           "the summary prints the minimum detectable effect its own spread gives")
_SD_RARE_WAY = ("no run in the rare-way world has this statistic yet (a one-seed pilot of "
                "adaptive and off on seed 0, with the copy 1 in 25 and stopped at 80 steps, "
                "checked that the world trains: both arms did, neither took the copying way, "
                "so the weight was raised to 1 in 9): the spread of the other ablations' "
                "held-out accuracy differences (sd 0.012-0.026)")
_SD_ENTROPY = ("the ways world's entropy-control runs (docs/entropy-world, 3 seeds): paired "
               "final-entropy differences of -0.052 with a 90% interval of +-0.003, so sd about "
               "0.002; taken as 0.005 for a new world; effect 0.01 nats")

PLANS: dict[str, Plan] = {
    "off-policy": Plan(8, benefit=Power(0.02, 0.02, _SD_RARE_WAY),
                       mechanism=Power(0.005, 0.01, _SD_ENTROPY)),
    "entropy-control": Plan(8, benefit=Power(0.02, 0.02, _SD_RARE_WAY),
                            mechanism=Power(0.005, 0.01, _SD_ENTROPY)),
    "kl": Plan(
        10, benefit=Power(0.02, 0.02, "no exploratory run with this statistic: the spread of the "
                          "other ablations' held-out accuracy differences (sd 0.012-0.026)"),
        mechanism=Power(0.01, 0.01, "a 3-seed pilot logged losses/kl of 0.05-0.08 at the end of "
                        "beta 0 runs; sd taken as 0.01"),
        dose=Dose("magic.kl_coef", ("0.001", "0.01", "0.1"), measured_on="beta0.001",
                  metric=f"{mn.LOSS_KL}@run", at_least=0.25, relative_to="beta0",
                  arms=("beta0.001",))),
    "clip-higher": Plan(
        10, benefit=Power(0.0221, 0.02, _SD_AUC.format(name="clip-higher")),
        mechanism=Power(0.0032, 0.005, "the exploratory runs' sd of the paired entropy@run "
                        "differences (0.265 against 0.2); effect 0.005 nats"),
        dose=Dose("magic.lr", ("2.0e-4", "4.0e-4", "8.0e-4", "1.6e-3"), measured_on="clip0.2",
                  metric=f"{mn.LOSS_CLIPFRAC_HIGH}@run", at_least=0.01)),
    "temperature": Plan(
        9, benefit=Power(0.0137, 0.013, _SD_AUC.format(name="temperature")
                         + "; the effect is the 3-seed pilot's (+1.3 points of accuracy AUC)"),
        mechanism=Power(0.0015, 0.01, "the exploratory runs' sd of the paired "
                        "entropy/rollout@stage1 differences (without entropy control); effect "
                        "0.01 nats")),
    "adv-mask": Plan(
        5, benefit=Power(0.0118, 0.02, _SD_AUC.format(name="adv-mask")),
        mechanism=Power(0.0114, 0.02, "the exploratory runs' sd of the paired "
                        "truncated/frac@stage1 differences; effect 2 points of truncated share")),
    "group-size": Plan(10, benefit=Power(0.0223, 0.02, _SD_AUC.format(name="group-size"))),
    "batch-size": Plan(7, benefit=Power(0.0171, 0.02, _SD_AUC.format(name="batch-size"))),
    "multi-stage": Plan(
        5, benefit=Power(0.0143, 0.02, _SD_AUC.format(name="multi-stage")),
        mechanism=Power(13808.0, 50000.0, "the exploratory runs' sd of the paired training "
                        "token differences (staged - one stage: -123,061 of 1,061,281); effect "
                        "50,000 tokens (5%)")),
}


def plan(name: str) -> Plan:
    if name not in PLANS:
        raise ValueError(f"ablation {name!r} has no entry in trainer/ablation/preregistration.py")
    return PLANS[name]


def required_seeds(check: Check, power: Power) -> int:
    """The seeds a check needs for 80% power at its smallest effect of interest: a direction or
    "not_lower" (the truth at the margin's edge for the latter) at one-sided 5%; "similar" (TOST
    with no true difference: each side needs 90%)."""
    return seeds_for_power(power.sd, power.effect, power=check_power(check.expect))


def design(ablation: Ablation) -> dict[str, Any]:
    """Everything registered for one ablation, as plain data (what the fingerprint covers). A
    world other than the demo's is part of it (its data arguments and settings); the demo's
    adds no key, so the designs registered before worlds existed keep their fingerprints."""
    p = plan(ablation.name)
    world = ({"world": asdict(WORLDS[ablation.world])} if ablation.world != "demo" else {})
    return {**world,
        "ablation": ablation.name, "claim": ablation.claim,
        "profile": list(PROFILES["confirm"].overrides),
        "setup": dict(ablation.setup),
        "variants": [{"name": v.name, "overrides": dict(v.overrides), "optional": v.optional,
                      "quick_only_left_out": v.full_only} for v in ablation.variants],
        "checks": [{"metric": c.metric, "baseline": c.baseline, "treatment": c.treatment,
                    "expect": c.expect, "margin": c.margin, "role": c.role}
                   for c in ablation.checks],
        "seeds": p.seed_list, "pending": p.pending,
        "dose": asdict(p.dose) if p.dose is not None else None,
        "power": {role: asdict(getattr(p, role)) for role in LABELS
                  if getattr(p, role) is not None},
    }


def fingerprint(ablation: Ablation) -> str:
    return hashlib.sha256(json.dumps(design(ablation), sort_keys=True).encode()).hexdigest()


def same_design_fingerprints(ablation: Ablation) -> frozenset[str]:
    """Every fingerprint this very design has been registered under: today's, and for a design
    without a dose the one it had before the registration recorded doses (commit 3ca782d added
    the key ``"dose"``, null for such a design, to what is hashed: the same design, written
    with one more empty field; its runs from before that commit must still count)."""
    out = {fingerprint(ablation)}
    d = design(ablation)
    if d["dose"] is None:
        del d["dose"]
        out.add(hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest())
    return frozenset(out)


MARK = re.compile(r"<!-- preregistered (\S+) (\w+) -->")


def render() -> str:
    """docs/ablations/preregistration.md."""
    out = ["# Pre-registration of the ablations' confirmatory runs", "",
           "Generated by `python -m trainer.ablation.preregistration` from "
           "trainer/ablation/preregistration.py and trainer/ablation/designs.py; "
           "`tests/test_ablate.py` keeps it equal to them. What it fixes and why: the module "
           "docstring of trainer/ablation/preregistration.py. Only runs made with "
           "`trainer ablate NAME --profile confirm` at this document's commit or after it, on a "
           "clean checkout and the seeds below, count as confirmatory; a changed design gets a "
           "new fingerprint and starts over.", "",
           "How a label is decided (trainer/ablation/stats.py): the per-seed paired differences, "
           "treatment - baseline, and their two-sided 90% Student-t interval: a direction is "
           "reproduced when the interval excludes 0 on the claim's side, not reproduced on the "
           "other side, inconclusive otherwise (one-sided 5% each); 'similar' by two one-sided "
           "tests against the margin; 'not lower by more than M' when the interval lies above "
           "-M. The mechanism and the benefit are each their own hypothesis; secondary checks "
           "are Holm-corrected as one family and cannot change a label.", "",
           f"Seeds: every registered ablation runs seeds {FIRST_SEED}, {FIRST_SEED + 1}, ... "
           f"(so an arm two ablations share is run once per seed), none of the seeds run "
           f"before ({', '.join(map(str, sorted(USED_SEEDS)))}). Each seed starts from a warm "
           "start of its own, made with that seed; both arms of a pair share it. Smallest "
           "effect of interest in held-out accuracy: 2 points. Budget: about "
           f"{BUDGET_MINUTES} CPU-minutes per ablation on the 2-core CPU beside the runs "
           f"another ablation already made (one run about {MINUTES_PER_RUN} minutes).", ""]
    for name, ablation in ABLATIONS.items():
        p = plan(name)
        out += [f"## `{name}`", "", f"<!-- preregistered {name} {fingerprint(ablation)} -->", "",
                f"**Claim.** {ablation.claim}", ""]
        if ablation.world != "demo":
            w = WORLDS[ablation.world]
            out += [f"**World:** `{w.name}`: {w.about}. Data: `python datasets/toyworld.py "
                    f"{' '.join(w.data_args)}`; settings for the warm start and every run, after the profile's: "
                    + ", ".join(f"`{x}`" for x in w.overrides) + ".", ""]
        if p.pending:
            out += [f"**Not registered yet:** {p.pending}.", ""]
            continue
        arms = [v for v in ablation.variants_for("confirm")]
        out += ["**Arms** (`trainer/configs/demo.yaml` with the confirm profile's overrides "
                f"{', '.join(f'`{x}`' for x in PROFILES['confirm'].overrides)}"
                + (", and for every arm " + ", ".join(f"`{k}={v}`" for k, v in
                                                      ablation.setup.items())
                   if ablation.setup else "") + "):", ""]
        out += [f"- `{v.name}`: " + (", ".join(f"`{k}={val}`" for k, val in v.overrides.items())
                                     or "the base config") for v in arms]
        out += [""]
        for role in LABELS:
            c = ablation.labelled(role)
            if c is None:
                out += [f"**{role.capitalize()}:** none (the claim has no {role} part).", ""]
                continue
            pw = getattr(p, role)
            need = required_seeds(c, pw)
            what = ("the narrowest margin shown 80% of the time at no true difference" if
                    c.expect == "similar" else "the minimum detectable effect")
            out += [f"**{role.capitalize()}:** {c.describe()}. Smallest effect of interest "
                    f"{pw.effect:g}; expected sd of the paired differences {pw.sd:g} ({pw.source})"
                    f"; {need} seeds give 80% power; at the {p.seeds} registered, {what} is "
                    f"{detectable(c.expect, pw.sd, p.seeds):.3g}.", ""]
        if p.dose is not None:
            d = p.dose
            out += [f"**Dose, found first:** {d.rule()}. The "
                    + (f"arms {', '.join(d.arms)} take" if d.arms else "arms all take")
                    + " that value; if no value qualifies, the ablation is undecidable on CPU "
                    "and its summary carries the measured curve.", ""]
        seconds = [c.describe() for c in ablation.checks if c.role == "secondary"
                   and {c.baseline, c.treatment} <= {v.name for v in arms}]
        out += ["**Secondary** (Holm-corrected): " + ("; ".join(seconds) or "none") + ".", "",
                f"**Seeds:** {p.seeds}: {', '.join(map(str, p.seed_list))}.", ""]
        if ablation.notes:
            out += [f"**Notes.** {ablation.notes}", ""]
    return "\n".join(out).rstrip() + "\n"


# -- which runs are confirmatory ---------------------------------------------------------------

def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          timeout=30)


def registered_fingerprints(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in MARK.finditer(text)}


def preregistration_commit(name: str, fp: str, root: Path = ROOT,
                           same: Iterable[str] = ()) -> str | None:
    """The commit from which ``name``'s fingerprint ``fp`` has stood unchanged in the committed
    document (the oldest of the newest unbroken run of commits that show it, or, before, one of
    ``same``: the same design's earlier fingerprints, ``same_design_fingerprints``); None when
    HEAD's document does not show ``fp``."""
    log = _git(root, "log", "--format=%H", "--", str(DOC))
    accepted = {fp, *same}
    found = None
    for commit in log.stdout.split() if log.returncode == 0 else []:
        shown = _git(root, "show", f"{commit}:{DOC}")
        if shown.returncode != 0 or registered_fingerprints(shown.stdout).get(name) not in accepted:
            break
        found = commit
    if found is not None:  # HEAD's document must still be the one found
        head = _git(root, "show", f"HEAD:{DOC}")
        if head.returncode != 0 or registered_fingerprints(head.stdout).get(name) != fp:
            return None
    return found


def is_descendant(commit: str, ancestor: str, root: Path = ROOT) -> bool:
    return _git(root, "merge-base", "--is-ancestor", ancestor, commit).returncode == 0


def problems(ablation: Ablation, runs: Iterable[tuple[str, int, Sequence[dict[str, Any]]]],
             root: Path = ROOT) -> tuple[str | None, list[str]]:
    """(the ablation's pre-registration commit, why its runs are not confirmatory). ``runs``:
    (variant, seed, the run's environment.json records: one per start, trainer/provenance.py).
    Empty reasons: every run is confirmatory."""
    p = plan(ablation.name)
    if p.pending:
        return None, [f"{ablation.name} is not registered: {p.pending}"]
    commit = preregistration_commit(ablation.name, fingerprint(ablation), root,
                                    same_design_fingerprints(ablation))
    if commit is None:
        return None, [f"the design of {ablation.name} in this code (fingerprint "
                      f"{fingerprint(ablation)[:12]}) is not the one committed in {DOC}: "
                      "regenerate it (python -m trainer.ablation.preregistration), commit, and "
                      "run again"]
    why = []
    registered = set(p.seed_list)
    for variant, seed, records in runs:
        run = f"{variant} seed {seed}"
        if seed in USED_SEEDS:
            why.append(f"{run}: seed {seed} was run before the pre-registration (a pilot's or an "
                       "exploratory run's)")
        elif seed not in registered:
            why.append(f"{run}: seed {seed} is not one of the registered seeds")
        why += code_problems(run, records, commit, root)
    return commit, why


def code_problems(run: str, records: Sequence[dict[str, Any]], commit: str,
                  root: Path = ROOT) -> list[str]:
    """Why a run's code does not count after the pre-registration ``commit`` (empty: it
    does): unknown, dirty, or not at or after that commit. Every start of a resumed run must
    count. ``run`` names the run in the reasons."""
    if not records:
        return [f"{run}: no environment.json: its code commit is unknown"]
    why = []
    for r in records:
        code = r.get("code") or {}
        if not code.get("commit"):
            why.append(f"{run}: made outside a git checkout")
        elif code.get("dirty"):
            why.append(f"{run}: made with uncommitted changes at {code['commit'][:12]}")
        elif not is_descendant(code["commit"], commit, root):
            why.append(f"{run}: made at {code['commit'][:12]}, before the pre-registration "
                       f"commit {commit[:12]} (or off its line)")
    return why


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.ablation.preregistration",
                                 description=f"Write {DOC} from the registered designs.")
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {DOC} differs instead "
                    "of writing it")
    args = ap.parse_args(argv)
    path = ROOT / DOC
    text = render()
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{DOC} is not what trainer/ablation/preregistration.py renders: run python -m "
                  "trainer.ablation.preregistration", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
