"""Access control: TLS / mutual TLS credentials and bearer tokens, for server and client.

- A bearer token travels as ``authorization: Bearer <token>`` metadata on every call. The server
  reads its accepted tokens from a file (one per line: several lines allow rotation without
  downtime; the file is re-read when it changes, as a Kubernetes Secret volume updates it) or
  from an environment variable, and compares in constant time.
- The call gate (verifier/service/call_gate.py) checks it when a call's headers arrive, before any
  request body is read. Health checks (``grpc.health.v1``) need no token, so Kubernetes gRPC
  probes and ``verifier health`` work without the secret: the health service reveals only
  SERVING / NOT_SERVING. Everything else (scoring, reflection) needs it. A missing or wrong
  token is UNAUTHENTICATED, mapped in ``server._abort`` like every other error.
- TLS: the server presents ``tls_cert``/``tls_key``; with ``tls_client_ca`` it also requires a
  client certificate signed by that CA (mutual TLS). Clients verify the server against
  ``tls_ca`` (or the system roots).
"""

from __future__ import annotations

import hmac
import os
import threading
from pathlib import Path
from typing import Any

import grpc

from verifier.items import VerifierError

AUTH_HEADER = "authorization"
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)
"""Methods served without a token: health checks (probes, load balancers)."""


def read_pem(path: Path | str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from e


class TokenSource:
    """The tokens a server accepts: from a file (re-read when its mtime or size changes) or from
    an environment variable (read once). Raises ValueError when the source holds no token."""

    def __init__(self, token_file: Path | str | None = None, token_env: str | None = None):
        if token_file is None and token_env is None:
            raise ValueError("a token source needs token_file or token_env")
        self._file = Path(token_file) if token_file is not None else None
        self._env_tokens: tuple[bytes, ...] = ()
        if token_env is not None:
            value = os.environ.get(token_env, "").strip()
            if not value:
                raise ValueError(f"environment variable {token_env} holds no token")
            self._env_tokens = (value.encode(),)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._file_tokens: tuple[bytes, ...] = ()
        if self._file is not None:
            self._reload(force=True)
            if not self._file_tokens:
                raise ValueError(f"token file {self._file} holds no token")

    def _reload(self, force: bool = False) -> None:
        assert self._file is not None
        try:
            st = self._file.stat()
        except OSError as e:
            if force:
                raise ValueError(f"cannot read token file {self._file}: {e}") from e
            return  # keep the last good tokens while a Secret volume swaps its files
        stamp = (st.st_mtime_ns, st.st_size)
        if not force and stamp == self._stamp:
            return
        try:
            text = self._file.read_text(encoding="utf-8")
        except OSError as e:
            if force:
                raise ValueError(f"cannot read token file {self._file}: {e}") from e
            return
        tokens = tuple(t.strip().encode() for t in text.splitlines() if t.strip())
        if tokens or force:
            self._file_tokens = tokens
            self._stamp = stamp

    def tokens(self) -> tuple[bytes, ...]:
        if self._file is not None:
            with self._lock:
                self._reload()
        return self._file_tokens + self._env_tokens

    def accepts(self, presented: str | None) -> bool:
        if not presented:
            return False
        given = presented.encode()
        ok = False
        for t in self.tokens():  # no early exit: the time does not tell which token matched
            ok |= hmac.compare_digest(given, t)
        return ok


def bearer_from_metadata(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == AUTH_HEADER:
            v = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = v.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
            return None
    return None


def server_credentials(tls_cert: Path, tls_key: Path,
                       tls_client_ca: Path | None) -> grpc.ServerCredentials:
    cert, key = read_pem(tls_cert), read_pem(tls_key)
    assert cert is not None and key is not None
    ca = read_pem(tls_client_ca)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def client_credentials(tls_ca: Path | None, tls_cert: Path | None,
                       tls_key: Path | None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls_ca), private_key=read_pem(tls_key),
        certificate_chain=read_pem(tls_cert))


def client_token(token_file: Path | None, token_env: str | None) -> str | None:
    """The token a client sends: the first line of ``token_file``, else ``$token_env`` when
    that variable is set (unset or empty: no token)."""
    if token_file is not None:
        try:
            lines = [t.strip() for t in Path(token_file).read_text(encoding="utf-8").splitlines()]
        except OSError as e:
            raise VerifierError(f"cannot read token file {token_file}: {e}", "invalid_argument")
        tokens = [t for t in lines if t]
        if not tokens:
            raise VerifierError(f"token file {token_file} holds no token", "invalid_argument")
        return tokens[0]
    if token_env is not None:
        return os.environ.get(token_env, "").strip() or None
    return None
