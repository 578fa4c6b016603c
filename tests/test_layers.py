"""The layers of the repository, read from the imports of every source file (``ast``: top-level
and inside functions alike), so that a forbidden import fails the suite instead of a review.

    sandbox  <-  verifier  <-  trainer

- nothing in ``verifier/`` or ``sandbox/`` imports ``trainer`` or ``torch`` (the verifier
  deploys on CPU-only pods without the training stack);
- ``sandbox/`` imports nothing from ``verifier/`` (the verifier uses the sandbox, not the
  other way round);
- ``verifier/`` imports from ``sandbox`` only what its front door publishes: the names in
  ``sandbox.__all__`` (``sandbox/__init__.py``), never one of its modules (``sandbox.nsjail``,
  ``sandbox.forkserver``, ...): what the verifier needs of a sandbox is declared there, and
  it asks a sandbox for nothing else (no ``getattr`` on one, no test of its ``name``);
- ``trainer/`` imports from ``verifier`` only its public surface (``PUBLIC_SURFACE`` below,
  written down in verifier/__init__.py too): the clients, the item/result/status types, the
  problem and ground-truth formats, the evaluation metrics, starting a local verifier and the
  shared logging set-up. Not the scorers, the sandbox, the harness, the server or the CLI.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandbox
import verifier

ROOT = Path(__file__).resolve().parents[1]

PUBLIC_SURFACE = frozenset({
    "verifier",                 # the package: Item, Limits, Outcome, Result, Status, VerifierError
    "verifier.client",          # the clients' face: VerifierClient, AsyncVerifierClient, ClientConfig
    "verifier.client.config",   # ClientConfig (re-exported by verifier.client)
    "verifier.client.fleet",    # many replicas behind one client
    "verifier.client.local",    # starting a local verifier
    "verifier.items",           # items, limits, results, statuses, NOT_A_VERDICT
    "verifier.data.problems",   # problem rows and their file formats
    "verifier.data.ground_truth",  # the code ground-truth format, parsed (pure)
    "verifier.data.lcb",        # LiveCodeBench's rows, prompts and windows
    "verifier.eval.evaluate",   # evaluation metrics and reports
    "verifier.logs",            # the shared logging set-up
})

SANDBOX_FRONT_DOOR = frozenset(sandbox.__all__)
"""The names the verifier may import from ``sandbox`` (and no module under it)."""

FORBIDDEN_BELOW_TRAINER = ("trainer", "torch")


@dataclass(frozen=True)
class Import:
    path: str
    line: int
    module: str
    names: tuple[str, ...] = ()
    """The names ``from module import ...`` takes (empty for ``import module``)."""


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports_of(source: str, path: str, package: str) -> list[Import]:
    """Every module ``source`` imports (relative imports resolved against ``package``, the
    dotted package the file is in); ``from pkg import name`` also counts ``pkg.name`` when that
    is a module, so ``from verifier import code_score`` is seen as ``verifier.scoring.code_score``."""
    out: list[Import] = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            out += [Import(path, node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append(Import(path, node.lineno, module, tuple(a.name for a in node.names)))
            for a in node.names:
                sub = f"{module}.{a.name}"
                if _module_exists(sub):
                    out.append(Import(path, node.lineno, sub))
    return out


def _module_exists(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    return (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file()


def violations(imports: list[Import], layer: str) -> list[str]:
    """The imports that break the rules of ``layer`` ("verifier", "sandbox" or "trainer")."""
    bad: list[str] = []
    for imp in imports:
        where = f"{imp.path}:{imp.line} imports {imp.module}"
        if layer in ("verifier", "sandbox"):
            if any(_is_under(imp.module, p) for p in FORBIDDEN_BELOW_TRAINER):
                bad.append(f"{where} (nothing below the trainer imports trainer or torch)")
        if layer == "sandbox" and _is_under(imp.module, "verifier"):
            bad.append(f"{where} (the sandbox does not import the verifier)")
        if layer == "verifier" and _is_under(imp.module, "sandbox"):
            if imp.module != "sandbox":
                bad.append(f"{where} (not the sandbox's front door: import from sandbox)")
            else:
                unpublished = sorted(set(imp.names) - SANDBOX_FRONT_DOOR)
                if unpublished:
                    bad.append(f"{where} {', '.join(unpublished)} (not published by "
                               "sandbox/__init__.py's __all__)")
        if layer == "trainer" and _is_under(imp.module, "verifier"):
            if imp.module not in PUBLIC_SURFACE:
                bad.append(f"{where} (not the verifier's public surface: "
                           f"{', '.join(sorted(PUBLIC_SURFACE))})")
    return bad


def layer_imports(layer: str) -> list[Import]:
    out: list[Import] = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        rel = path.relative_to(ROOT)
        package = ".".join(rel.with_suffix("").parts[:-1]) if path.name != "__init__.py" \
            else ".".join(rel.parts[:-1])
        out += imports_of(path.read_text(encoding="utf-8"), str(rel), package)
    return out


@pytest.mark.parametrize("layer", ["verifier", "sandbox", "trainer"])
def test_layer_keeps_its_imports(layer: str) -> None:
    imports = layer_imports(layer)
    assert imports, f"no imports read from {layer}/"
    assert violations(imports, layer) == []


def sandbox_probes(source: str, path: str) -> list[str]:
    """Where ``source`` asks a sandbox for what its interface does not declare: ``getattr``
    on it, or a test of its ``name`` (what the verifier needs is declared on ``Sandbox``)."""
    bad: list[str] = []
    for node in ast.walk(ast.parse(source, path)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args
                and "sandbox" in ast.unparse(node.args[0])):
            bad.append(f"{path}:{node.lineno} {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Attribute) and side.attr == "name"
                and "sandbox" in ast.unparse(side.value)
                for side in (node.left, *node.comparators)):
            bad.append(f"{path}:{node.lineno} {ast.unparse(node)}")
    return bad


def test_the_verifier_asks_a_sandbox_only_what_its_interface_declares() -> None:
    bad = [b for path in sorted((ROOT / "verifier").rglob("*.py"))
           for b in sandbox_probes(path.read_text(encoding="utf-8"),
                                   str(path.relative_to(ROOT)))]
    assert bad == []


def test_checker_catches_a_sandbox_probe() -> None:
    for source in ('x = getattr(sandbox, "cgroup_mode", "off")\n',
                   'x = self.sandbox.name == "docker"\n'):
        assert sandbox_probes(source, "<snippet>"), source
    assert sandbox_probes("x = sandbox.memory_accounting == 'jail'\n", "<snippet>") == []


def test_the_public_surface_is_written_down_in_the_package() -> None:
    doc = verifier.__doc__ or ""
    missing = [m for m in sorted(PUBLIC_SURFACE) if m != "verifier" and m not in doc]
    assert not missing, f"verifier/__init__.py's docstring does not list {missing}"
    assert all(_module_exists(m) for m in PUBLIC_SURFACE)


# -- the checker catches what it should (a test that can never fail proves nothing) ----------

SNIPPETS = {
    ("verifier", "verifier.scoring.scorer"): "def f():\n    import torch\n",
    ("verifier", "verifier"): "from trainer.loop import Trainer\n",
    ("sandbox", "sandbox.x"): "from verifier.items import Status\n",
    ("sandbox", "sandbox"): "import verifier.items as vi\n",
    ("verifier", "verifier.service.descriptors"): "from sandbox.forkserver import PreloadedEntry\n",
    ("verifier", "verifier.scoring.pool"): "def f():\n    import sandbox.scratch\n",
    ("verifier", "verifier.scoring.code_score"): "from sandbox import uidpool\n",
    ("verifier", "verifier.service.server"): "from sandbox import NsjailSandbox\n",
    ("trainer", "trainer"): "from verifier.scoring.code_score import score_code\n",
    ("trainer", "trainer.data"): "def f():\n    from verifier.scoring import code_score\n",
    ("trainer", "trainer.loop"): "from verifier.client import clients\n",
    ("trainer", "trainer.cli"): "import verifier.cli\n",
}


@pytest.mark.parametrize("layer,package", list(SNIPPETS), ids=lambda x: str(x))
def test_checker_catches_a_forbidden_import(layer: str, package: str) -> None:
    source = SNIPPETS[(layer, package)]
    assert violations(imports_of(source, "<snippet>", package), layer), source


def test_checker_allows_the_sandbox_front_door() -> None:
    source = ("from sandbox import Sandbox, SandboxLimits, create_sandbox\nimport sandbox\n"
              "def f():\n    from sandbox import JailRequest\n")
    assert violations(imports_of(source, "<snippet>", "verifier"), "verifier") == []


def test_checker_allows_the_public_surface() -> None:
    source = ("from verifier.client import VerifierClient\nfrom verifier import items\n"
              "from verifier.items import NOT_A_VERDICT\nimport verifier.client.local\n")
    assert violations(imports_of(source, "<snippet>", "trainer"), "trainer") == []
