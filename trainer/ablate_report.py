"""What ``trainer ablate`` writes from its runs: summary.json (per check the paired differences,
their 90% interval and the verdict), report.md, overlay plots, and the README's ablation table
regenerated from committed summaries (``python -m trainer.ablate_report``), so the table cannot
drift from the runs. The statistic: trainer/ablation_stats.py; the claims: trainer/ablations.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import mean, stdev
from typing import Any

import yaml

from trainer import metric_names as mn
from trainer.ablation_stats import (
    INCONCLUSIVE,
    LEVEL,
    CheckResult,
    check_verdict,
    pair_by_seed,
    secondary_verdicts,
)
from trainer.ablations import ABLATIONS, Ablation, Check, Variant, run_numbers
from trainer.plot import plt, series, trailing_mean  # pyplot, headless (Agg)

UNDECIDABLE = "undecidable on CPU"
DONE = ("finished", "skipped", "reused")  # outcome statuses of a run that reached its end


def _config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


# -- summary -----------------------------------------------------------------------------------

def _check_entry(c: Check, r: CheckResult, role: str) -> dict[str, Any]:
    return {"check": c.describe(), "role": role, "metric": c.metric, "baseline": c.baseline,
            "treatment": c.treatment, "expect": c.expect, "margin": c.margin,
            "verdict": r.verdict, "mean_diff": r.mean, "ci90": [r.low, r.high],
            "pairs": r.pairs, "p": r.p, "reason": r.reason, "seeds": r.seeds,
            "diffs": r.diffs, "dropped": {str(k): v for k, v in r.dropped.items()}}


def decide(ablation: Ablation, per_seed: dict[str, dict[int, dict[str, float | None]]]
           ) -> tuple[str, list[dict[str, Any]]]:
    """The ablation's verdict and its checks' entries from each variant's per-seed numbers
    (variant -> seed -> :func:`run_numbers`). Only checks whose two variants ran take part; the
    primary alone decides (inconclusive when its variants did not run); the secondaries are
    Holm-corrected as one family. An ablation marked undecidable on CPU says so, whatever the
    checks found (they are still reported)."""
    ran = [v for v, seeds in per_seed.items() if seeds]
    checks = ablation.checks_for(ran)

    def paired(c: Check):
        return pair_by_seed({s: n.get(c.metric) for s, n in per_seed[c.baseline].items()},
                            {s: n.get(c.metric) for s, n in per_seed[c.treatment].items()})

    entries = []
    primary = [c for c in checks if c.primary]
    for c in primary:
        entries.append(_check_entry(c, check_verdict(paired(c), c.expect, c.margin),
                                    "primary"))
    secondary = [c for c in checks if not c.primary]
    for c, r in zip(secondary, secondary_verdicts([(paired(c), c.expect, c.margin)
                                                    for c in secondary])):
        entries.append(_check_entry(c, r, "secondary"))
    verdict = entries[0]["verdict"] if primary else INCONCLUSIVE
    if ablation.undecidable_on_cpu:
        verdict = UNDECIDABLE
    return verdict, entries


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
                  base: Path | None = None) -> dict[str, Any]:
    """summary.json's content from the runs' outcomes (objects with variant, seed, run_dir,
    status, seconds, reused_from, error, rows; trainer/ablate.py's RunOutcome) and each run's
    config.yaml (for the entropy target). ``quadruple``: the numbers of ``quadruples`` where
    given, else the report's notation (D = D_R). Run directories are written relative to
    ``base`` (the ``--out`` directory) when given, so a committed summary names no machine's
    paths."""

    def where(path: Path) -> str:
        return os.path.relpath(path, base) if base is not None else str(path)

    out_variants: dict[str, Any] = {}
    per_seed: dict[str, dict[int, dict[str, float | None]]] = {}
    for v in variants:
        mine = [o for o in outcomes if o.variant == v.name]
        ok = [o for o in mine if o.status in DONE]
        target = ((_config(ok[0].run_dir).get("magic") or {}).get("entropy_target")
                  if ok else None)
        numbers = {o.seed: run_numbers(o.rows, target) for o in ok}
        per_seed[v.name] = numbers
        means, sds = _mean_sd(list(numbers.values()))
        entry: dict[str, Any] = {
            "overrides": {**ablation.setup, **v.overrides},
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
    verdict, checks = decide(ablation, per_seed)
    return {"ablation": ablation.name, "claim": ablation.claim, "verdict": verdict,
            "undecidable_on_cpu": ablation.undecidable_on_cpu or None,
            "statistic": (f"paired by seed, treatment - baseline; two-sided {LEVEL:.0%} "
                          "Student-t interval; primary check decides, secondaries "
                          "Holm-corrected (trainer/ablation_stats.py)"),
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
    lines = [f"# Ablation `{ablation.name}`", "", f"**Claim.** {ablation.claim}", "",
             f"**Verdict: {verdict}.**" + (f" The mechanism is absent here: "
                                           f"{ablation.undecidable_on_cpu}." if
                                           ablation.undecidable_on_cpu else ""), "",
             ("How it is decided: each check pairs the two variants by seed and takes the "
              "per-seed differences, treatment minus baseline; their mean's two-sided 90% "
              "Student-t interval decides ('higher'/'lower': reproduced when it excludes 0 on "
              "the claim's side, not reproduced on the other side, else inconclusive; "
              "'similar': reproduced when it lies inside +-margin). The primary check, from the "
              "report's own figure, alone gives the verdict; secondary checks are "
              "Holm-corrected and reported (trainer/ablation_stats.py)."), "", "## Setup", ""]
    for k, v in setup.items():
        lines.append(f"- {k}: {v}")
    if ablation.notes:
        lines.append(f"- notes: {ablation.notes}")
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
              ("| role | check | mean difference | interval | pairs | "
              "verdict | why | seeds left out |"), "|---|---|---|---|---|---|---|---|"]
    for c in summary["checks"]:
        dropped = "; ".join(f"seed {k}: {why}" for k, why in c["dropped"].items()) or "-"
        lines.append(f"| {c['role']} | {c['check']} | {fmt(c['mean_diff'])} | {_interval(c)} | "
                     f"{c['pairs']} | **{c['verdict']}** | {c['reason']} | {dropped} |")
    if not summary["checks"]:
        lines.append("| | (no check: its variants were not run) | | | | inconclusive | | |")
    if summary["failed"]:
        lines += ["", "## Failed runs", ""] + [f"- {x}" for x in summary["failed"]]
    lines += ["", "## Plots", "", ("Each variant's mean over seeds; the band spans the seeds "
              "(min to max)."), ""] + [f"![{p}]({p})" for p in plots]
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


def readme_table(summaries: dict[str, tuple[Path, dict[str, Any]]], base: Path) -> str:
    """The README's ablation table: one row per ablation of trainer/ablations.py, in its order,
    from its summary.json (name -> (path, content); path relative to ``base``): verdict, the
    primary check with its mean difference, 90% interval and pairs, the secondary checks'
    verdicts, the wall time; an ablation without a summary says so and how to make one."""
    rows = ["| ablation | verdict | primary check: mean difference [90% interval], pairs | "
            "secondary checks | wall time | report |", "|---|---|---|---|---|---|"]
    for name, ablation in ABLATIONS.items():
        if name not in summaries:
            verdict = "not yet run with this statistic"
            if ablation.undecidable_on_cpu:
                verdict += f"; marked {UNDECIDABLE} ({ablation.undecidable_on_cpu})"
            rows.append(f"| `{name}` | {verdict} | {ablation.primary.describe()} | - | - | "
                        f"`trainer ablate {name} --profile full` |")
            continue
        path, s = summaries[name]
        prim = next((c for c in s["checks"] if c["role"] == "primary"), None)
        prim_text = (f"{prim['check']}: {fmt(prim['mean_diff'])} {_interval(prim)}, "
                     f"{prim['pairs']} pairs ({prim['verdict']})" if prim else
                     "not run")
        second = "; ".join(f"{c['check']}: {c['verdict']}" for c in s["checks"]
                           if c["role"] == "secondary") or "-"
        verdict = f"**{s['verdict']}**"
        if s.get("undecidable_on_cpu"):
            verdict += f" ({s['undecidable_on_cpu']})"
        report = (path.resolve().parent / "report.md").relative_to(base)
        minutes = s.get("seconds", 0.0) / 60
        rows.append(f"| `{name}` | {verdict} | {prim_text} | {second} | "
                    f"{minutes:.0f} min | [report]({report}) |")
    return "\n".join(rows)


def update_readme(readme: Path, summaries_dir: Path) -> str:
    """Replace the text between the README's table markers with the table made from every
    ``summaries_dir/*/summary.json``."""
    found = {p.parent.name: p for p in summaries_dir.glob("*/summary.json")}
    unknown = sorted(set(found) - set(ABLATIONS))
    if unknown:
        raise ValueError(f"summaries of unknown ablations under {summaries_dir}: {unknown}")
    summaries = {n: (p, json.loads(p.read_text())) for n, p in found.items()}
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {BEGIN} ... {END} markers")
    table = readme_table(summaries, readme.parent.resolve())
    readme.write_text(pattern.sub(lambda _m: f"{BEGIN}\n{table}\n{END}", text))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trainer.ablate_report",
        description="Regenerate the README's ablation table from the committed summaries.")
    ap.add_argument("summaries", type=Path, help="directory of NAME/summary.json "
                    "(e.g. docs/ablations/full)")
    ap.add_argument("--readme", type=Path, default=Path("README.md"))
    args = ap.parse_args(argv)
    try:
        print(update_readme(args.readme, args.summaries))
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
