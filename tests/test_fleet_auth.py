"""Access control for real, on loopback: bearer tokens (file and environment variable, rotation),
TLS and mutual TLS with a CA generated at test time, health checks without a token, and the
rule that ``verifier serve`` refuses a non-loopback address without TLS, a token or --insecure."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

pytest.importorskip("cryptography")  # the test CA is generated at test time

from tests.certs import SERVER_DNS_NAME, Pki, make_pki  # noqa: E402
from tests.conftest import ServerProcess, math_item  # noqa: E402
from verifier.client import ClientConfig, VerifierClient  # noqa: E402
from verifier.items import Status  # noqa: E402
from verifier.scoring.scorer import ScoringConfig  # noqa: E402
from verifier.service.server import ServeConfig, create_server  # noqa: E402

TOKEN = "s3cret-token-for-tests"
ENV_TOKEN = "another-token-from-the-environment"
ENV_NAME = "VERIFIER_TEST_TOKEN"


def items(n: int, prefix: str) -> list[dict]:
    return [math_item(f"{prefix}{i}", rf"\boxed{{{i}}}", str(i)) for i in range(n)]


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch) -> None:
    monkeypatch.delenv("VERIFIER_TOKEN", raising=False)  # the client's default token variable


def no_retry(**kw) -> ClientConfig:
    return ClientConfig(max_retries=0, timeout_s=20, **kw)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def token_server(token_file) -> Iterator[str]:
    """A server that accepts TOKEN (from a file) and ENV_TOKEN (from an environment variable)."""
    old = os.environ.get(ENV_NAME)
    os.environ[ENV_NAME] = ENV_TOKEN
    try:
        srv, port = create_server("127.0.0.1:0", ServeConfig(
            scoring=ScoringConfig(workers=1), token_file=token_file, token_env=ENV_NAME))
    finally:
        if old is None:
            os.environ.pop(ENV_NAME, None)
        else:
            os.environ[ENV_NAME] = old
    yield f"127.0.0.1:{port}"
    srv.stop(grace_s=1.0)


def _code(excinfo) -> grpc.StatusCode:
    return excinfo.value.code()


def test_call_without_token_is_unauthenticated(token_server) -> None:
    with VerifierClient(token_server, no_retry()) as client:
        with pytest.raises(grpc.RpcError) as batch:
            client.score(items(2, "a"))
        with pytest.raises(grpc.RpcError) as streamed:
            list(client.stream(items(2, "b")))
    assert _code(batch) is grpc.StatusCode.UNAUTHENTICATED
    assert _code(streamed) is grpc.StatusCode.UNAUTHENTICATED
    assert "missing bearer token" in batch.value.details()


def test_wrong_token_is_unauthenticated(token_server, tmp_path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text(TOKEN + "x\n")
    with VerifierClient(token_server, no_retry(token_file=wrong)) as client:
        with pytest.raises(grpc.RpcError) as batch:
            client.score(items(2, "c"))
        with pytest.raises(grpc.RpcError) as streamed:
            list(client.stream(items(2, "d")))
    assert _code(batch) is grpc.StatusCode.UNAUTHENTICATED
    assert _code(streamed) is grpc.StatusCode.UNAUTHENTICATED
    assert "invalid bearer token" in batch.value.details()
    # Not a bearer token at all
    ch = grpc.insecure_channel(token_server)
    from verifier.proto import verifier_pb2 as pb
    from verifier.proto import verifier_pb2_grpc as pb_grpc

    with pytest.raises(grpc.RpcError) as basic:
        pb_grpc.VerifierStub(ch).Score(pb.ScoreRequest(), timeout=5,
                                       metadata=(("authorization", f"Basic {TOKEN}"),))
    assert _code(basic) is grpc.StatusCode.UNAUTHENTICATED
    ch.close()


def test_right_token_from_file_and_from_env(token_server, token_file, monkeypatch) -> None:
    with VerifierClient(token_server, no_retry(token_file=token_file)) as client:
        batch = client.score(items(3, "e"))
        streamed = list(client.stream(items(3, "f")))
    assert [r.status for r in batch] == [Status.CORRECT] * 3
    assert sorted(r.id for r in streamed) == ["f0", "f1", "f2"]
    monkeypatch.setenv("MY_VERIFIER_TOKEN", ENV_TOKEN)
    with VerifierClient(token_server, no_retry(token_env="MY_VERIFIER_TOKEN")) as client:
        assert [r.status for r in client.score(items(2, "g"))] == [Status.CORRECT] * 2
    # VERIFIER_TOKEN is read by default: a trainer pod with the Secret there needs no flag
    monkeypatch.setenv("VERIFIER_TOKEN", ENV_TOKEN)
    with VerifierClient(token_server, no_retry()) as client:
        assert [r.status for r in client.score(items(2, "h"))] == [Status.CORRECT] * 2


def test_health_needs_no_token_but_reflection_does(token_server) -> None:
    ch = grpc.insecure_channel(token_server)
    try:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refl:
            list(reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        assert _code(refl) is grpc.StatusCode.UNAUTHENTICATED
    finally:
        ch.close()
    with VerifierClient(token_server, no_retry()) as client:
        assert client.health()


def test_token_file_is_reread_for_rotation(tmp_path) -> None:
    tok = tmp_path / "rotating"
    tok.write_text("old-token\nnew-token\n")
    srv, port = create_server("127.0.0.1:0", ServeConfig(scoring=ScoringConfig(workers=1),
                                                         token_file=tok))
    addr = f"127.0.0.1:{port}"
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_text("old-token")
    new.write_text("new-token")
    try:
        for f in (old, new):
            with VerifierClient(addr, no_retry(token_file=f)) as client:
                assert client.score(items(1, "r"))[0].status is Status.CORRECT
        tok.write_text("new-token\n")
        os.utime(tok, ns=(1, 1))  # a different mtime even within the clock's granularity
        with VerifierClient(addr, no_retry(token_file=old)) as client:
            with pytest.raises(grpc.RpcError) as e:
                client.score(items(1, "s"))
            assert _code(e) is grpc.StatusCode.UNAUTHENTICATED
        with VerifierClient(addr, no_retry(token_file=new)) as client:
            assert client.score(items(1, "t"))[0].status is Status.CORRECT
    finally:
        srv.stop(1)


def test_empty_token_sources_are_refused(tmp_path, monkeypatch) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no token"):
        ServeConfig(token_file=empty)
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    with pytest.raises(ValueError, match="no token"):
        ServeConfig(token_env="NO_SUCH_TOKEN_VAR")


# -------------------------------------------------------------------------------------------
# TLS
# -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(pki) -> Iterator[int]:
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1), tls_cert=pki.server_cert, tls_key=pki.server_key,
        health_port=0))
    yield port, srv.health_port
    srv.stop(grace_s=1.0)


@pytest.fixture(scope="module")
def mtls_server(pki) -> Iterator[int]:
    srv, port = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1), tls_cert=pki.server_cert, tls_key=pki.server_key,
        tls_client_ca=pki.ca))
    yield port
    srv.stop(grace_s=1.0)


def test_tls_with_the_test_ca(tls_server, pki) -> None:
    port, _ = tls_server
    for addr in (f"localhost:{port}", f"127.0.0.1:{port}", f"dns:///localhost:{port}"):
        with VerifierClient(addr, no_retry(tls_ca=pki.ca)) as client:
            assert [r.status for r in client.score(items(2, "t"))] == [Status.CORRECT] * 2
            assert sorted(r.id for r in client.stream(items(2, "u"))) == ["u0", "u1"]
    # the certificate names verifier.test, not the address dialled
    with VerifierClient(f"127.0.0.1:{port}",
                        no_retry(tls_ca=pki.ca, tls_server_name=SERVER_DNS_NAME)) as client:
        assert client.score(items(1, "v"))[0].status is Status.CORRECT


def test_tls_refuses_plaintext_and_unknown_ca(tls_server, pki) -> None:
    port, health_port = tls_server
    for cfg in (no_retry(), no_retry(tls_ca=pki.stranger_ca)):
        with VerifierClient(f"127.0.0.1:{port}", cfg) as client:
            with pytest.raises(grpc.RpcError) as e:
                client.score(items(1, "w"))
            assert _code(e) is grpc.StatusCode.UNAVAILABLE
            assert not client.health(timeout_s=2)
    # the plaintext health-only port answers probes, and serves nothing else
    with VerifierClient(f"127.0.0.1:{health_port}", no_retry()) as client:
        assert client.health()
        with pytest.raises(grpc.RpcError) as e:
            client.score(items(1, "x"))
        assert _code(e) is grpc.StatusCode.UNIMPLEMENTED


def test_mutual_tls(mtls_server, pki) -> None:
    addr = f"localhost:{mtls_server}"
    with VerifierClient(addr, no_retry(tls_ca=pki.ca, tls_cert=pki.client_cert,
                                       tls_key=pki.client_key)) as client:
        assert [r.status for r in client.score(items(2, "m"))] == [Status.CORRECT] * 2
    for cert, key in ((None, None), (pki.stranger_cert, pki.stranger_key)):
        with VerifierClient(addr, no_retry(tls_ca=pki.ca, tls_cert=cert, tls_key=key)) as client:
            with pytest.raises(grpc.RpcError) as e:
                client.score(items(1, "n"))
            assert _code(e) is grpc.StatusCode.UNAVAILABLE


def test_cli_tls_and_token_end_to_end(pki, token_file, tmp_path) -> None:
    """`verifier serve` with TLS + token in a child process; `verifier check` and `verifier
    health` through the CLI with the matching options."""
    from verifier.cli import main

    sp = ServerProcess(0, "--workers", "1", "--tls-cert", str(pki.server_cert), "--tls-key",
                       str(pki.server_key), "--token-file", str(token_file))
    try:
        port = sp.address.rsplit(":", 1)[1]
        addr = f"localhost:{port}"
        src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        src.write_text("".join(json.dumps(it) + "\n" for it in items(4, "k")))
        args = ["check", "-i", str(src), "-o", str(out), "--addr", addr, "--progress", "off",
                "--tls-ca", str(pki.ca), "--max-retries", "0"]
        assert main([*args, "--token-file", str(token_file)]) == 0
        assert [json.loads(x)["status"] for x in out.read_text().splitlines()] == ["CORRECT"] * 4
        with pytest.raises(grpc.RpcError) as e:
            main(args)
        assert _code(e) is grpc.StatusCode.UNAUTHENTICATED
        assert main(["health", "--addr", addr, "--tls-ca", str(pki.ca)]) == 0
        assert main(["health", "--addr", addr]) == 1  # plaintext to a TLS port
    finally:
        sp.terminate()


# -------------------------------------------------------------------------------------------
# Binding rules
# -------------------------------------------------------------------------------------------


def test_non_loopback_needs_tls_token_or_insecure(pki, token_file, capsys) -> None:
    from verifier.cli import main

    with pytest.raises(SystemExit) as exited:  # tyro reports the config's ValueError
        main(["serve", "--host", "0.0.0.0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to bind" in err and "--insecure" in err
    with pytest.raises(ValueError, match="without TLS"):
        ServeConfig(host="0.0.0.0")
    with pytest.raises(ValueError, match="without TLS"):
        ServeConfig(host="10.1.2.3")
    assert ServeConfig(host="0.0.0.0", token_file=token_file).host == "0.0.0.0"
    assert ServeConfig(host="::", tls_cert=pki.server_cert, tls_key=pki.server_key).tls
    assert ServeConfig(host="0.0.0.0", insecure=True).insecure
    with pytest.raises(ValueError, match="go together"):
        ServeConfig(tls_cert=pki.server_cert)
    with pytest.raises(ValueError, match="mutual TLS"):
        ServeConfig(tls_client_ca=pki.ca)
    with pytest.raises(ValueError, match="no such file"):
        ServeConfig(tls_cert=Path("/nonexistent.pem"), tls_key=pki.server_key)
