"""The pre-registration of the ablations (trainer/ablation/preregistration.py): the committed document is
what the code renders, every registered design is on fresh seeds sized by its power
calculation, a changed design changes its fingerprint, and which runs count as confirmatory
(checked against a real git repository made here: commits before and after the registration, a
dirty tree, a pilot's seed, a design changed after the runs)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from trainer.ablation import preregistration as pr
from trainer.ablation.stats import detectable
from trainer.ablation.designs import ABLATIONS, LABELS
from trainer.cli import main as cli_main


def test_the_committed_document_is_what_the_code_renders() -> None:
    assert pr.main(["--check"]) == 0, "run: python -m trainer.ablation.preregistration"
    marks = pr.registered_fingerprints((pr.ROOT / pr.DOC).read_text())
    assert marks == {n: pr.fingerprint(a) for n, a in ABLATIONS.items()}


@pytest.mark.parametrize("name", list(ABLATIONS))
def test_every_registered_design_is_on_fresh_seeds_with_the_power_it_states(name) -> None:
    p, a = pr.plan(name), ABLATIONS[name]
    if p.pending:
        assert p.seeds == 0 and len(p.pending) > 40  # says why
        return
    assert not set(p.seed_list) & pr.USED_SEEDS
    if p.dose is not None:  # its seed is its own; its arms and measured variant exist
        assert p.dose.seed not in pr.USED_SEEDS | set(p.seed_list)
        names = {v.name for v in a.variants}
        assert {p.dose.measured_on, *(p.dose.arms or ()),
                *([p.dose.relative_to] if p.dose.relative_to else [])} <= names
        assert list(p.dose.ladder) == sorted(p.dose.ladder, key=float)
    assert p.seed_list == list(range(pr.FIRST_SEED, pr.FIRST_SEED + p.seeds))
    for role in LABELS:
        check, power = a.labelled(role), getattr(p, role)
        assert (check is None) == (power is None), (role, "a label without a power plan")
        if check is not None:
            assert p.seeds >= pr.required_seeds(check, power), role
            assert detectable(check.expect, power.sd, p.seeds) <= power.effect + 1e-12


def test_a_changed_design_gets_a_new_fingerprint() -> None:
    a = ABLATIONS["batch-size"]
    benefit = a.labelled("benefit")
    moved = replace(a, checks=(replace(benefit, metric="eval/accuracy"),
                               *[c for c in a.checks if c is not benefit]))
    assert pr.fingerprint(moved) != pr.fingerprint(a)
    assert pr.fingerprint(replace(a, notes="other prose")) == pr.fingerprint(a)


def test_confirm_refuses_an_unregistered_ablation_and_a_changed_seed_count(capsys,
                                                                          monkeypatch) -> None:
    monkeypatch.setitem(pr.PLANS, "off-policy", pr.Plan(pending="a world to build first"))
    assert cli_main(["ablate", "off-policy", "--profile", "confirm"]) != 0
    assert "no pre-registered design" in capsys.readouterr().err
    assert cli_main(["ablate", "batch-size", "--profile", "confirm", "--seeds", "3"]) != 0
    assert "no --seeds, --variants, --set or another --world" in capsys.readouterr().err


# -- which runs are confirmatory, in a real repository -----------------------------------------

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def record(sha: str, dirty: bool = False) -> dict:
    return {"code": {"commit": sha, "dirty": dirty}}


def test_only_clean_runs_after_the_registration_on_registered_seeds_are_confirmatory(
        tmp_path) -> None:
    repo = tmp_path / "repo"
    (repo / pr.DOC.parent).mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "code.py").write_text("1\n")
    before = commit(repo, "code before")
    (repo / pr.DOC).write_text(pr.render())
    registered = commit(repo, "pre-registration")
    (repo / "code.py").write_text("2\n")
    after = commit(repo, "code after")
    a = ABLATIONS["batch-size"]
    seeds = pr.plan("batch-size").seed_list
    assert pr.preregistration_commit("batch-size", pr.fingerprint(a), repo) == registered

    ok = [("b8", seeds[0], [record(after)]), ("b16", seeds[0], [record(registered)])]
    assert pr.problems(a, ok, repo) == (registered, [])
    _, why = pr.problems(a, [("b8", seeds[1], [record(before)]),
                             ("b8", seeds[2], [record(after, dirty=True)]),
                             ("b8", 0, [record(after)]),
                             ("b8", 4321, [record(after)]),
                             ("b16", seeds[3], [])], repo)
    assert any("before the pre-registration commit" in w and f"seed {seeds[1]}" in w
               for w in why)
    assert any("uncommitted changes" in w for w in why)
    assert any("seed 0 was run before" in w for w in why)
    assert any("4321 is not one of the registered seeds" in w for w in why)
    assert any("no environment.json" in w for w in why)
    # a resumed run is confirmatory only if every start was
    _, why = pr.problems(a, [("b8", seeds[0], [record(after), record(before)])], repo)
    assert len(why) == 1
    # the design changed after the registration: nothing counts until it is registered again
    changed = replace(a, checks=tuple(replace(c, margin=0.01) for c in a.checks))
    commit_of, why = pr.problems(changed, ok, repo)
    assert commit_of is None and "is not the one committed" in why[0]
    # another ablation's entry changing does not move this one's registration
    text = (repo / pr.DOC).read_text().replace(pr.fingerprint(ABLATIONS["kl"]), "0" * 64)
    (repo / pr.DOC).write_text(text)
    commit(repo, "kl's design changed")
    assert pr.preregistration_commit("batch-size", pr.fingerprint(a), repo) == registered
    assert pr.preregistration_commit("kl", pr.fingerprint(ABLATIONS["kl"]), repo) is None


def test_a_design_registered_before_doses_were_recorded_keeps_its_registration(tmp_path) -> None:
    """Commit 3ca782d added the key "dose" (null for a design without one) to what a fingerprint
    hashes: the same design, one more empty field. Its runs made between the first registration
    and that commit still count; a design whose content changed does not."""
    repo = tmp_path / "repo"
    (repo / pr.DOC.parent).mkdir(parents=True)
    git(repo, "init", "-q")
    a = ABLATIONS["batch-size"]
    now = pr.fingerprint(a)
    (earlier,) = pr.same_design_fingerprints(a) - {now}
    (repo / pr.DOC).write_text(pr.render().replace(now, earlier))
    registered = commit(repo, "registered, before doses")
    (repo / pr.DOC).write_text(pr.render())
    commit(repo, "doses recorded")
    assert pr.preregistration_commit("batch-size", now, repo) != registered  # without `same`
    seed = pr.plan("batch-size").seed_list[0]
    assert pr.problems(a, [("b8", seed, [record(registered)])], repo) == (registered, [])
    # a design with a dose has no earlier fingerprint; and another design's is not accepted
    assert pr.same_design_fingerprints(ABLATIONS["kl"]) == {pr.fingerprint(ABLATIONS["kl"])}
    text = pr.render().replace(now, pr.fingerprint(ABLATIONS["group-size"]))
    (repo / pr.DOC).write_text(text)
    commit(repo, "batch-size's entry replaced")
    (repo / pr.DOC).write_text(pr.render())
    later = commit(repo, "registered again")
    assert pr.problems(a, [("b8", seed, [record(later)])], repo) == (later, [])


def test_an_unregistered_ablation_is_never_confirmatory(monkeypatch) -> None:
    monkeypatch.setitem(pr.PLANS, "entropy-control", pr.Plan(pending="a world to build first"))
    _, why = pr.problems(ABLATIONS["entropy-control"], [])
    assert why and "not registered" in why[0]
