"""The output cap per test: a server maximum (``verifier serve --max-output-mb``, default 64 MiB)
that lcb and skywork items get whole (LiveCodeBench's judge and Skywork-OR1's copy of it have no
cap) and that no other profile exceeds (default keeps its own 8 MiB, or the maximum when it is
lower). Real servers on port 0, real nsjail."""

from __future__ import annotations

from typing import Iterator

import pytest

from verifier.cli import main
from verifier.client import VerifierClient
from verifier.items import Status
from verifier.scoring.profiles import DEFAULT_MAX_OUTPUT_MB, PROFILE_TABLE, output_cap
from verifier.scoring.scorer import Scorer, ScoringConfig
from verifier.service.server import ServeConfig, create_server

MIB = 1 << 20


def printer(item_id: str, mib: float, profile: str) -> dict:
    """A stdin item whose correct program prints ``mib`` MiB (one line of x's)."""
    n = int(mib * MIB)
    return {"id": item_id, "domain": "code", "profile": profile,
            "response": f"```python\nprint('x' * {n})\n```",
            "ground_truth": {"inputs": ["\n"], "outputs": ["x" * n + "\n"]}}


@pytest.fixture(scope="module")
def small_server() -> Iterator[str]:
    """A server whose maximum is 2 MiB: under the default profile's own 8 MiB."""
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1, max_output_mb=2)))
    yield f"127.0.0.1:{port}"
    srv.stop(grace_s=1.0)


def statuses(addr: str, items: list[dict]) -> dict[str, Status]:
    with VerifierClient(addr) as client:
        return {r.id: r.status for r in client.score(items)}


def test_the_rule() -> None:
    lcb, default = PROFILE_TABLE["lcb"], PROFILE_TABLE["default"]
    assert lcb.output_bytes is None                       # no cap of its own, as LiveCodeBench
    assert output_cap(lcb, DEFAULT_MAX_OUTPUT_MB) == 64 * MIB
    assert output_cap(lcb, 512) == 512 * MIB              # lcb follows a raised maximum
    assert output_cap(default, 512) == 8 * MIB
    assert output_cap(default, 2) == 2 * MIB              # and no profile exceeds a lower one
    assert PROFILE_TABLE["skywork"].output_bytes is None   # nor has Skywork-OR1's copy
    assert output_cap(PROFILE_TABLE["skywork"], 512) == 512 * MIB
    with pytest.raises(ValueError, match="max_output_mb"):
        Scorer(ScoringConfig(max_output_mb=0))


def test_lcb_items_get_the_servers_maximum_and_others_keep_8_mib(server) -> None:
    # The shared server has the default maximum, 64 MiB: 9 MiB of correct output passes under
    # lcb and skywork and is OUTPUT_LIMIT under the default profile (its own 8 MiB).
    got = statuses(server[1], [printer("lcb", 9, "lcb"), printer("default", 9, "default"),
                               printer("skywork", 9, "skywork")])
    assert got == {"lcb": Status.CORRECT, "default": Status.OUTPUT_LIMIT,
                   "skywork": Status.CORRECT}


def test_a_lower_maximum_binds_every_profile(small_server: str) -> None:
    got = statuses(small_server, [printer("lcb-3", 3, "lcb"), printer("default-3", 3, "default"),
                                  printer("lcb-1", 1, "lcb"), printer("default-1", 1, "default")])
    assert got == {"lcb-3": Status.OUTPUT_LIMIT, "default-3": Status.OUTPUT_LIMIT,
                   "lcb-1": Status.CORRECT, "default-1": Status.CORRECT}


def test_serve_help_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-output-mb" in text and "LiveCodeBench has no output cap" in text
