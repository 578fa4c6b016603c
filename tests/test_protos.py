"""The committed stubs in verifier/proto are exactly what protos/verifier.proto generates."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUBS = ("verifier_pb2.py", "verifier_pb2.pyi", "verifier_pb2_grpc.py")


def test_regenerating_stubs_changes_nothing(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)],
        check=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    for name in STUBS:
        fresh = (tmp_path / name).read_text()
        committed = (ROOT / "verifier" / "proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run `make protos` and commit the result"


def test_status_enum_matches_python_enum() -> None:
    from verifier.items import Status
    from verifier.proto import verifier_pb2 as pb

    proto_names = {v.name for v in pb.Status.DESCRIPTOR.values if v.number != 0}
    assert proto_names == {s.value for s in Status}
