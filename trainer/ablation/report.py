"""What ``trainer ablate`` writes from its runs: summary.json (per check the paired differences,
their 90% interval and the verdict), report.md, overlay plots, and the ablation tables of
docs/ablations/README.md, regenerated from committed summaries (``python -m
trainer.ablation.report``), so the tables cannot drift from the runs. The statistic:
trainer/ablation/stats.py; the claims: trainer/ablation/designs.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from trainer import metric_names as mn
from trainer.ablation.stats import (
    INCONCLUSIVE,
    LEVEL,
    CheckResult,
    Paired,
    check_verdict,
    detectable,
    pair_by_seed,
    secondary_verdicts,
)
from trainer.ablation.designs import ABLATIONS, LABELS, Ablation, Check, Variant, run_numbers
from trainer.config import read_run_config
from trainer.ablation.preregistration import plan
from trainer.plot import plt, series, trailing_mean  # pyplot, headless (Agg)

UNDECIDABLE = "undecidable on CPU"
DONE = ("finished", "skipped", "reused")  # outcome statuses of a run that reached its end


# -- summary -----------------------------------------------------------------------------------

def _check_entry(c: Check, r: CheckResult) -> dict[str, Any]:
    return {"check": c.describe(), "role": c.role, "metric": c.metric, "baseline": c.baseline,
            "treatment": c.treatment, "expect": c.expect, "margin": c.margin,
            "verdict": r.verdict, "mean_diff": r.mean, "ci90": [r.low, r.high],
            "pairs": r.pairs, "p": r.p, "reason": r.reason,
            "detectable": (detectable(c.expect, stdev(r.diffs), len(r.diffs))
                           if len(r.diffs) >= 2 else None),
            "seeds": r.seeds, "diffs": r.diffs,
            "dropped": {str(k): v for k, v in r.dropped.items()}}


def decide(ablation: Ablation, per_seed: dict[str, dict[int, dict[str, float | None]]],
           undecidable: str | None = None
           ) -> tuple[dict[str, dict[str, Any] | None], list[dict[str, Any]]]:
    """The ablation's two labels and its checks' entries from each variant's per-seed numbers
    (variant -> seed -> :func:`run_numbers`). Only checks whose two variants ran take part. The
    mechanism and the benefit are each decided by their own check, at the plain level (each is
    its own hypothesis); a label whose check did not run is inconclusive, a claim without that
    part has None. The secondaries are Holm-corrected as one family. An ablation marked
    undecidable on CPU says so in both labels, whatever the checks found (still reported);
    ``undecidable`` overrides the ablation's mark ("" when a dose brought its mechanism into
    play, the measured reason when none did)."""
    if undecidable is None:
        undecidable = ablation.undecidable_on_cpu
    ran = [v for v, seeds in per_seed.items() if seeds]
    checks = ablation.checks_for(ran)

    def paired(c: Check):
        return pair_by_seed({s: n.get(c.metric) for s, n in per_seed[c.baseline].items()},
                            {s: n.get(c.metric) for s, n in per_seed[c.treatment].items()})

    entries = [_check_entry(c, check_verdict(paired(c), c.expect, c.margin))
               for c in checks if c.role in LABELS]
    secondary = [c for c in checks if c.role == "secondary"]
    for c, r in zip(secondary, secondary_verdicts([(paired(c), c.expect, c.margin)
                                                    for c in secondary])):
        entries.append(_check_entry(c, r))
    labels: dict[str, dict[str, Any] | None] = {}
    for role in LABELS:
        wanted = ablation.labelled(role)
        got = next((e for e in entries if e["role"] == role), None)
        if wanted is None:
            labels[role] = None
        elif got is None:
            labels[role] = {"check": wanted.describe(), "verdict": INCONCLUSIVE,
                            "mean_diff": None, "ci90": [None, None], "pairs": 0,
                            "detectable": None, "reason": "its variants were not run"}
        else:
            labels[role] = {k: got[k] for k in ("check", "verdict", "mean_diff", "ci90",
                                                 "pairs", "detectable", "reason")}
        if labels[role] is not None and undecidable:
            labels[role] = {**labels[role], "verdict": UNDECIDABLE}
    return labels, entries


def verdict_text(labels: dict[str, dict[str, Any] | None]) -> str:
    """"mechanism reproduced, benefit not reproduced" (a part the claim lacks is left out)."""
    return ", ".join(f"{role} {labels[role]['verdict']}" for role in LABELS
                     if labels.get(role) is not None)


def _mean_sd(values: Sequence[dict[str, float | None]]) -> tuple[dict, dict]:
    means: dict[str, float | None] = {}
    sds: dict[str, float | None] = {}
    for k in (values[0] if values else {}):
        vals = [f[k] for f in values if f.get(k) is not None]
        means[k] = mean(vals) if vals else None
        sds[k] = stdev(vals) if len(vals) > 1 else None
    return means, sds


def build_summary(ablation: Ablation, variants: Sequence[Variant], outcomes: Sequence[Any],
                  quadruples: dict[str, list[int]] | None = None,
                  base: Path | None = None, undecidable: str | None = None,
                  dose_overrides: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """summary.json's content from the runs' outcomes (objects with variant, seed, run_dir,
    status, seconds, reused_from, error, rows; trainer/ablation/runner.py's RunOutcome) and each run's
    config.yaml (for the entropy target). ``quadruple``: the numbers of ``quadruples`` where
    given, else the report's notation (D = D_R). Run directories are written relative to
    ``base`` (the ``--out`` directory) when given, so a committed summary names no machine's
    paths. ``undecidable``: as :func:`decide`'s; ``dose_overrides``: variant -> the override of
    the dose it ran at (trainer/ablation/preregistration.py's Dose)."""

    def where(path: Path) -> str:
        return os.path.relpath(path, base) if base is not None else str(path)

    out_variants: dict[str, Any] = {}
    per_seed: dict[str, dict[int, dict[str, float | None]]] = {}
    for v in variants:
        mine = [o for o in outcomes if o.variant == v.name]
        ok = [o for o in mine if o.status in DONE]
        cfg = read_run_config(ok[0].run_dir) if ok else None
        target = cfg.magic.entropy_target if cfg is not None else None
        numbers = {o.seed: run_numbers(o.rows, target) for o in ok}
        per_seed[v.name] = numbers
        means, sds = _mean_sd(list(numbers.values()))
        entry: dict[str, Any] = {
            "overrides": {**ablation.setup, **v.overrides,
                          **(dose_overrides or {}).get(v.name, {})},
            "seeds": [o.seed for o in ok],
            "run_dirs": [where(o.run_dir) for o in ok],
            "mean": means, "sd": sds,
            "per_seed": {str(s): n for s, n in numbers.items()},
            "seconds": sum(o.seconds for o in mine),
        }
        reused = {o.seed: where(o.reused_from) for o in ok if o.reused_from is not None}
        if reused:  # seed -> the other ablation's run this variant links to
            entry["reused_from"] = reused
        if v.quadruple is not None:
            entry["quadruple"] = (quadruples or {}).get(v.name, list(v.quadruple))
            entry["quadruple_notation"] = list(v.quadruple)
        failed = [o for o in mine if o.status == "failed"]
        if failed:
            entry["failed"] = [{"seed": o.seed, "run_dir": where(o.run_dir), "error": o.error}
                               for o in failed]
        out_variants[v.name] = entry
    labels, checks = decide(ablation, per_seed, undecidable)
    if undecidable is None:
        undecidable = ablation.undecidable_on_cpu
    return {"ablation": ablation.name, "claim": ablation.claim,
            "verdict": verdict_text(labels), **labels,
            "undecidable_on_cpu": undecidable or None,
            "statistic": (f"paired by seed, treatment - baseline; two-sided {LEVEL:.0%} "
                          "Student-t interval; the mechanism and the benefit each decided by "
                          "its own check, secondaries Holm-corrected "
                          "(trainer/ablation/stats.py)"),
            "variants": out_variants, "checks": checks,
            "seconds": sum(o.seconds for o in outcomes),
            "failed": [f"{o.variant} seed {o.seed}: {o.error}" for o in outcomes
                       if o.status == "failed"]}


# -- report and plots --------------------------------------------------------------------------

def fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _interval(c: dict[str, Any]) -> str:
    low, high = c["ci90"]
    if low is None:
        return "-"
    return f"[{fmt(low)}, {fmt(high)}]"


def report_markdown(summary: dict[str, Any], ablation: Ablation, setup: dict[str, Any],
                    plots: Sequence[str]) -> str:
    """report.md: claim, verdict, setup, the variants' table, the checks, failures, plots."""
    verdict = summary["verdict"]
    # The summary's reason (a dose-finding step's measured curve replaces the ablation's mark).
    absent = (summary["undecidable_on_cpu"] if "undecidable_on_cpu" in summary
              else ablation.undecidable_on_cpu)
    if summary.get("confirmatory"):
        standing = (f"**Confirmatory**: pre-registered at {summary['preregistration_commit']} "
                    "(docs/ablations/preregistration.md), every run made after it.")
    else:
        standing = ("**Exploratory** (not confirmatory"
                    + (": " + "; ".join(summary["not_confirmatory_because"])
                       if summary.get("not_confirmatory_because") else "") + ").")
    lines = [f"# Ablation `{ablation.name}`", "", f"**Claim.** {ablation.claim}", "",
             f"**Verdict: {verdict}.**" + (f" The mechanism is absent here: {absent}."
                                           if absent else ""), "", standing, "",
             ("How it is decided: each check pairs the two variants by seed and takes the "
              "per-seed differences, treatment minus baseline; their mean's two-sided 90% "
              "Student-t interval decides ('higher'/'lower': reproduced when it excludes 0 on "
              "the claim's side, not reproduced on the other side, else inconclusive; "
              "'similar': reproduced when it lies inside +-margin; 'not lower by more than M': "
              "when it lies above -M). The mechanism check and the benefit check each give "
              "their own label; secondary checks are Holm-corrected and reported "
              "(trainer/ablation/stats.py). 'detectable': the effect the check's own spread "
              "finds 80% of the time at its pairs."), "", "## Setup", ""]
    for k, v in setup.items():
        lines.append(f"- {k}: {v}")
    if ablation.notes:
        lines.append(f"- notes: {ablation.notes}")
    dose = summary.get("dose")
    if dose:
        lines += ["", "## Dose", "", f"Found first, as registered: {dose['rule']}"
                  + (f" (reference: {fmt(dose['reference'])})" if dose.get("reference")
                     is not None else "") + ".", "", f"| {dose['knob']} | measured |",
                  "|---|---|"]
        lines += [f"| {k} | {fmt(v)} |" for k, v in dose["curve"].items()]
        lines += ["", f"Chosen: {dose['chosen']}." if dose["chosen"] is not None else
                  "Chosen: none; the arms were not run."]
    lines += ["", "## Variants", "",
              ("Means over seeds (± the standard deviation over seeds). Final entropy, length "
               "and truncation: mean of the last 10 steps; accuracy AUC: mean over the "
               "evaluations after step 0; tokens: response tokens generated for training."), "",
              ("| variant | overrides | seeds | final held-out acc | accuracy AUC | "
               "final entropy | mean length | truncated | tokens | time | status |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in summary["variants"].items():
        f, s = v["mean"], v.get("sd", {})
        ov = ", ".join(f"`{k}={val}`" for k, val in v["overrides"].items()) or "(base)"
        if "quadruple" in v:
            ov = f"({', '.join(v['quadruple_notation'])}) = {tuple(v['quadruple'])} " + ov

        def pm(key: str, pct: bool = False, f: dict = f, s: dict = s) -> str:
            if f.get(key) is None:
                return "-"
            sd = s.get(key)
            if pct:
                return f"{100 * f[key]:.1f}%" + (f" ± {100 * sd:.1f}" if sd is not None else "")
            return f"{f[key]:.4g}" + (f" ± {sd:.2g}" if sd is not None else "")

        status = "ok" if v["seeds"] else "not run"
        if v.get("reused_from"):
            status += " (reused: " + ", ".join(
                f"seed {k}: {'/'.join(Path(p).parts[-3:])}" for k, p in v["reused_from"].items()
            ) + ")"
        if "failed" in v:
            status = "FAILED: " + "; ".join(f"seed {x['seed']}: {x['error']}"
                                            for x in v["failed"])
        lines.append(f"| {name} | {ov} | {len(v['seeds'])} | {pm('eval/accuracy', True)} | "
                     f"{pm('eval/accuracy_auc', True)} | {pm('entropy')} | "
                     f"{fmt(f.get('response_length/mean'))} | {pm('truncated/frac', True)} | "
                     f"{fmt(f.get('tokens'))} | {v['seconds']:.0f} s | {status} |")
    lines += ["", "## Checks", "", ("The interval is the 90% one, except for a secondary check tested at "
              "its Holm level: then that level's wider interval (named in 'why')."), "",
              ("| role | check | mean difference | interval | pairs | detectable | "
              "verdict | why | seeds left out |"), "|---|---|---|---|---|---|---|---|---|"]
    for c in summary["checks"]:
        dropped = "; ".join(f"seed {k}: {why}" for k, why in c["dropped"].items()) or "-"
        lines.append(f"| {c['role']} | {c['check']} | {fmt(c['mean_diff'])} | {_interval(c)} | "
                     f"{c['pairs']} | {fmt(c.get('detectable'))} | **{c['verdict']}** | "
                     f"{c['reason']} | {dropped} |")
    if not summary["checks"]:
        lines.append("| | (no check: its variants were not run) | | | | | - | | |")
    if summary["failed"]:
        lines += ["", "## Failed runs", ""] + [f"- {x}" for x in summary["failed"]]
    lines += ["", "## Plots", "", ("Each variant's mean over seeds; the band spans the seeds "
              "(min to max)." if plots else "None: no run of the arms."), ""]
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


PLOTS = ((mn.ENTROPY, "entropy (nats per token, 10-step mean)", "entropy.png", True),
         (mn.EVAL_ACCURACY, "held-out accuracy", "accuracy.png", False),
         (mn.RESPONSE_LENGTH_MEAN, "response length (tokens, 10-step mean)", "length.png", True),
         (mn.TRUNCATED_FRAC, "truncated fraction (10-step mean)", "truncated.png", True))


def band(per_seed: Sequence[tuple[list[int], list[float]]]) -> tuple[list[int], list[float],
                                                                       list[float], list[float]]:
    """(steps, mean, min, max) over the seeds at the steps every seed logged."""
    common = sorted(set.intersection(*(set(xs) for xs, _ in per_seed))) if per_seed else []
    maps = [dict(zip(xs, ys)) for xs, ys in per_seed]
    mid = [mean(m[x] for m in maps) for x in common]
    lo = [min(m[x] for m in maps) for x in common]
    hi = [max(m[x] for m in maps) for x in common]
    return common, mid, lo, hi


def write_plots(root: Path, summary: dict[str, Any], outcomes: Sequence[Any]) -> list[str]:
    written = []
    for key, title, name, smooth in PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = False
        for i, variant in enumerate(summary["variants"]):
            runs = [o for o in outcomes if o.variant == variant and o.status in DONE and o.rows]
            per_seed = []
            for o in runs:
                xs, ys = series(o.rows, key)
                if smooth:
                    ys = trailing_mean(ys)
                if xs:
                    per_seed.append((xs, ys))
            if not per_seed:
                continue
            xs, mid, lo, hi = band(per_seed)
            color = f"C{i}"
            ax.plot(xs, mid, "o-" if not smooth else "-", markersize=3, color=color,
                    label=f"{variant} ({len(per_seed)} seed{'s' if len(per_seed) > 1 else ''})")
            if len(per_seed) > 1:
                ax.fill_between(xs, lo, hi, color=color, alpha=0.2)
            drawn = True
        ax.set_title(f"{summary['ablation']}: {title}")
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(root / name, dpi=80)
        plt.close(fig)
        written.append(name)
    return written


# -- the README's table ------------------------------------------------------------------------

BEGIN, END = "<!-- ablation-table:begin -->", "<!-- ablation-table:end -->"
CONFIRMATORY_DIR = "confirmatory"
"""Under the summaries directory: NAME/summary.json of the confirmatory runs."""


def _label_cell(label: dict[str, Any] | None) -> str:
    if label is None:
        return "- (no such part)"
    if not label["pairs"] and label["verdict"] == UNDECIDABLE:
        return f"**{UNDECIDABLE}** (no arm was run: the report says why)"
    interval = _interval(label)
    return (f"**{label['verdict']}**: {fmt(label['mean_diff'])} {interval}, "
            f"{label['pairs']} pairs")


def exploratory_labels(ablation: Ablation, summary: dict[str, Any]
                       ) -> dict[str, dict[str, Any] | None]:
    """Mechanism and benefit labels for a summary written before the labels existed (one
    "primary" check and secondaries): for each label, the registered check if the summary has
    its arms and metric, else the first check of the summary on the same arms and of the same
    kind (held-out accuracy for the benefit, anything else for the mechanism), re-decided from
    its stored per-seed differences with the registered expectation and margin. Each label
    names the check it was measured on."""
    out: dict[str, dict[str, Any] | None] = {}
    for role in LABELS:
        want = ablation.labelled(role)
        if want is None:
            out[role] = None
            continue
        kind = (lambda m: m.startswith("eval/")) if role == "benefit" else \
            (lambda m: not m.startswith("eval/"))
        candidates = [want] + [c for c in ablation.checks if c.role == "secondary" and
                               kind(c.metric)]
        found = None
        for c in candidates:
            same_arms = [e for e in summary["checks"] if (e["baseline"], e["treatment"]) ==
                         (c.baseline, c.treatment) and kind(e["metric"])]
            match = next((e for e in same_arms if e["metric"] == c.metric),
                         same_arms[0] if same_arms else None)
            if match is not None:
                found = (c, match)
                break
        if found is None:
            out[role] = {"check": want.describe(), "verdict": INCONCLUSIVE, "mean_diff": None,
                         "ci90": [None, None], "pairs": 0, "measured_on": "not run"}
            continue
        c, e = found
        r = check_verdict(Paired(e["diffs"], e["seeds"]), c.expect, c.margin)
        expect = replace(c, metric=e["metric"])
        out[role] = {"check": expect.describe(), "verdict": r.verdict, "mean_diff": r.mean,
                     "ci90": [r.low, r.high], "pairs": r.pairs,
                     "measured_on": e["metric"]}
        if ablation.undecidable_on_cpu:
            out[role]["verdict"] = UNDECIDABLE
    return out


def readme_table(summaries: dict[str, tuple[Path, dict[str, Any]]],
                 confirmatory: dict[str, tuple[Path, dict[str, Any]]], base: Path) -> str:
    """The README's ablation tables, one row per ablation of trainer/ablation/designs.py in its order.
    The first from the confirmatory summaries only (NAME -> (path, content), paths relative to
    ``base``): the mechanism and benefit labels with their intervals and pairs, the
    pre-registration commit, the wall time; an ablation without one says whether it is
    registered (trainer/ablation/preregistration.py). The second from the exploratory summaries, marked
    as such, labelled by :func:`exploratory_labels`."""
    rows = ["**Confirmatory** (pre-registered in docs/ablations/preregistration.md, fresh seeds, "
            "one warm start per seed):", "",
            "| ablation | status | mechanism: label, mean difference [90% interval], pairs | "
            "benefit: label, mean difference [90% interval], pairs | wall time | report |",
            "|---|---|---|---|---|---|"]
    for name, ablation in ABLATIONS.items():
        p = plan(name)
        if name not in confirmatory:
            status = ("not registered yet (see preregistration.md)" if p.pending else
                      f"registered, {p.seeds} seeds, not yet run: `trainer ablate {name} "
                      "--profile confirm`")
            rows.append(f"| `{name}` | {status} | - | - | - | - |")
            continue
        path, s = confirmatory[name]
        if not s.get("confirmatory"):
            raise ValueError(f"{path} is not confirmatory: "
                             + "; ".join(s.get("not_confirmatory_because") or ["no mark"]))
        report = (path.resolve().parent / "report.md").relative_to(base)
        rows.append(f"| `{name}` | confirmatory, pre-registered at "
                    f"{s['preregistration_commit'][:10]}, seeds {s['seeds'][0]}-{s['seeds'][-1]}"
                    f" | {_label_cell(s.get('mechanism'))} | {_label_cell(s.get('benefit'))} | "
                    f"{s.get('seconds', 0.0) / 60:.0f} min | [report]({report}) |")
    rows += ["", "**Exploratory** (seeds 0-5 from one shared warm start; some checks and windows "
             "were chosen after 3-seed pilots on seeds 0-2: not evidence, kept to show where the "
             "confirmatory runs start; each label names the metric it was measured on):", "",
             "| ablation | mechanism | benefit | wall time | report |", "|---|---|---|---|---|"]
    for name, ablation in ABLATIONS.items():
        if name not in summaries:
            rows.append(f"| `{name}` | not run | not run | - | - |")
            continue
        path, s = summaries[name]
        labels = exploratory_labels(ablation, s)
        cells = []
        for role in LABELS:
            lab = labels[role]
            cells.append(_label_cell(lab) + (f" ({lab['measured_on']})" if lab else ""))
        report = (path.resolve().parent / "report.md").relative_to(base)
        rows.append(f"| `{name}` | {cells[0]} | {cells[1]} | "
                    f"{s.get('seconds', 0.0) / 60:.0f} min | [report]({report}) |")
    return "\n".join(rows)


def update_readme(readme: Path, summaries_dir: Path) -> str:
    """Replace the text between the README's table markers with the table made from every
    ``summaries_dir/*/summary.json``."""
    def read(where: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
        found = {p.parent.name: p for p in where.glob("*/summary.json")}
        unknown = sorted(set(found) - set(ABLATIONS))
        if unknown:
            raise ValueError(f"summaries of unknown ablations under {where}: {unknown}")
        return {n: (p, json.loads(p.read_text())) for n, p in found.items()}

    summaries = read(summaries_dir)
    confirmatory = read(summaries_dir / CONFIRMATORY_DIR)
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {BEGIN} ... {END} markers")
    table = readme_table(summaries, confirmatory, readme.parent.resolve())
    readme.write_text(pattern.sub(lambda _m: f"{BEGIN}\n{table}\n{END}", text))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trainer.ablation.report",
        description="Regenerate the ablation tables of docs/ablations/README.md (or --readme) "
                    "from the committed summaries.")
    ap.add_argument("summaries", type=Path, help="directory of NAME/summary.json "
                    "(e.g. docs/ablations/full)")
    ap.add_argument("--readme", type=Path, default=Path("docs/ablations/README.md"),
                    help="the Markdown file whose <!-- ablation-table --> markers to fill "
                    "(default: docs/ablations/README.md)")
    args = ap.parse_args(argv)
    try:
        print(update_readme(args.readme, args.summaries))
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
