"""The README is a front door that stays true: at most 450 lines; every relative link in it (and
in the docs it sends readers to for details) names a file of the repository; every `make TARGET`
it names is a target of the Makefile; every `trainer ...` / `verifier ...` command line in its
code blocks names a subcommand and flags that the CLI has (and config keys `trainer run`
knows); every script a command runs exists and defines the flags given to it. The CLIs' help is
read in this process (their parsers answer in well under a second, torch never imported)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README and the documents it hands its details to: their links are checked as its own.
LINKED_DOCS = [README] + [ROOT / "docs" / n for n in (
    "benchmarks.md", "verifier-service.md", "evaluation.md", "trainer.md", "demo.md", "fleet.md",
    "integrations.md", "ablations/README.md")]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def code_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def command_lines(text: str) -> list[str]:
    """The command lines of the bash blocks, continuation lines joined."""
    out = []
    for block in code_blocks(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [x.strip() for x in joined.splitlines() if x.strip()]
    return out


def words(line: str) -> list[str]:
    """A command line's words, without its trailing comment and a final `&`."""
    line = re.split(r"\s#\s", line, maxsplit=1)[0]
    try:
        w = shlex.split(line)
    except ValueError:
        w = line.split()
    return [x for x in w if x != "&"]


def test_the_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 450, f"README.md has {n} lines; move details to docs/"


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file(doc: Path) -> None:
    assert doc.exists(), doc
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or ROOT not in (path, *path.parents):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to nothing in the repository: {broken}"


def test_the_readme_links_nowhere_outside_the_repository() -> None:
    text = README.read_text(encoding="utf-8")
    outside = [t for t in LINK.findall(text) if re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert not outside, outside


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def test_every_make_target_named_exists() -> None:
    named = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", README.read_text(encoding="utf-8")))
    assert {"demo", "test", "demo-verifier"} <= named
    missing = named - makefile_targets()
    assert not missing, f"README.md names make targets the Makefile lacks: {sorted(missing)}"


@cache
def help_text(program: str, sub: tuple[str, ...]) -> tuple[int, str]:
    """`program SUB... --help`, run in this process: its exit status and text."""
    if program == "trainer":
        from trainer.cli import main
    else:
        from verifier.cli import main
    buf = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = main([*sub, "--help"]) or 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, buf.getvalue()


def cli_commands() -> list[tuple[str, list[str]]]:
    found = []
    for line in command_lines(README.read_text(encoding="utf-8")):
        w = words(line)
        if w and Path(w[0]).name in ("trainer", "verifier"):
            found.append((line, [Path(w[0]).name, *w[1:]]))
    return found


def test_the_readme_shows_the_quickstart_commands() -> None:
    shown = {" ".join(w[:2]) for _, w in cli_commands()}
    assert {"verifier serve", "verifier check", "trainer run", "verifier eval"} <= shown
    assert "trainer/configs/quickstart.yaml" in README.read_text(encoding="utf-8")


def ids(pairs: list[tuple[str, list[str]]]) -> list[str]:
    return [f"{' '.join(argv[:2])}-{i}" for i, (_, argv) in enumerate(pairs)]


@pytest.mark.parametrize("line,argv", cli_commands(), ids=ids(cli_commands()))
def test_every_cli_command_parses(line: str, argv: list[str]) -> None:
    program, rest = argv[0], argv[1:]
    sub = [rest[0]] if rest and not rest[0].startswith("-") else []
    if program == "trainer" and sub == ["config"] and len(rest) > 1 and rest[1] == "show":
        sub.append("show")
    code, top = help_text(program, ())
    assert sub and sub[0] in top, f"{line!r}: no subcommand of `{program}` named {sub}"
    code, text = help_text(program, tuple(sub))
    assert code == 0 and text.strip(), f"{line!r}: `{program} {' '.join(sub)} --help` failed"
    keys = set(re.findall(r"^  ([a-z_][\w.]*)  \(", help_text("trainer", ("run",))[1], re.M))
    for word in rest[len(sub):]:
        word = word.strip("[]")
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert re.search(re.escape(flag) + r"(?![\w-])", text), (
                f"{line!r}: `{program} {' '.join(sub)}` has no flag {flag}")
        elif program == "trainer" and re.match(r"[a-z_][\w.]*=", word) and word != "key=value":
            key = word.split("=", 1)[0]
            assert key in keys, f"{line!r}: `trainer run` has no config key {key}"


REPO_PATH = re.compile(r"\b((?:benchmarks|scripts|trainer|verifier|datasets|docs|deploy|sandbox|"
                       r"tests)/[\w./-]*\.(?:py|yaml|jsonl|json|md|txt|cfg|c|sh|parquet))\b")


def test_every_file_the_readme_names_exists() -> None:
    missing = sorted({p for p in REPO_PATH.findall(README.read_text(encoding="utf-8"))
                      if not (ROOT / p).exists()})
    assert not missing, f"README.md names files that do not exist: {missing}"


SCRIPT_COMMANDS = [
    re.compile(r"python ((?:benchmarks|scripts)/\w+\.py)((?: +[^|`;\n]+)?)"),  # code blocks, cells
    re.compile(r"`(?:\.venv/bin/)?(?:python )?((?:benchmarks|scripts)/\w+\.py)([^`\n]*)`"),  # `...`
]


@pytest.mark.parametrize("doc", [README, ROOT / "docs" / "benchmarks.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_command_has_its_flags(doc: Path) -> None:
    """`python benchmarks/X.py --flag ...` and `python scripts/X.py ...` in the README and in
    docs/benchmarks.md (code blocks, table cells, inline code): the script exists and defines
    every flag given to it."""
    text = doc.read_text(encoding="utf-8")
    bad = []
    for pattern in SCRIPT_COMMANDS:
        for m in pattern.finditer(text):
            script = ROOT / m.group(1)
            if script.name == "X.py":  # a placeholder: "benchmarks/X.py means ..."
                continue
            if not script.exists():
                bad.append(m.group(0))
                continue
            source = script.read_text(encoding="utf-8")
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2)):
                if f'"{flag}"' not in source and f"'{flag}'" not in source:
                    bad.append(f"{m.group(1)} {flag}")
    assert not bad, f"{doc.name} runs scripts or flags that do not exist: {bad}"



def config_commands() -> list[tuple[str, list[str]]]:
    """`trainer run` / `trainer config show` lines of the README that name a config file of the
    repository, as `trainer config show` arguments (the file and the line's key=value words)."""
    out = []
    for line, argv in cli_commands():
        if argv[:2] not in (["trainer", "run"], ["trainer", "config"]) or "--config" not in argv:
            continue
        config = argv[argv.index("--config") + 1]
        if not (ROOT / config).is_file():
            continue
        overrides = [w for w in argv if re.match(r"[a-z_][\w.]*=", w) and w != "key=value"]
        out.append((line, ["config", "show", "--config", str(ROOT / config), *overrides]))
    return out


def test_the_quickstart_runs_a_config_of_the_repository() -> None:
    assert any("quickstart.yaml" in line for line, _ in config_commands())


@pytest.mark.parametrize("line,argv", config_commands(), ids=ids(config_commands()))
def test_every_config_command_resolves(line: str, argv: list[str]) -> None:
    """`trainer config show` with the line's config file and overrides: a valid run config
    (types, keys, stages, required values), checked without loading a model."""
    from trainer.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = main(argv) or 0
        except SystemExit as e:
            code = e.code
    assert code == 0 and "\nname: " in buf.getvalue(), f"{line!r}: {buf.getvalue()[-2000:]}"
