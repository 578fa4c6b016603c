"""``ClientConfig``: the connection and retry settings of the verifier's clients.

Its own module so that both verifier/client/clients.py (the clients) and verifier/client/fleet.py (the
replicas they drive) read it without importing each other; ``verifier.client`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ClientConfig:
    """Connection and retry settings shared by both clients."""

    timeout_s: float = 600.0
    """Deadline of one RPC, seconds: a whole batch, or one gRPC stream to one replica (a
    longer logical stream reopens it and re-sends what it left unanswered)."""
    batch_size: int = 256
    """Items per unary Score call."""
    max_retries: int = 8
    """Attempts after the first on UNAVAILABLE / RESOURCE_EXHAUSTED before giving up (per
    replica, in a row without an answer; a stream gives up when every replica is past it)."""
    backoff_s: float = 0.2
    """First retry delay, seconds; doubles each retry (with jitter) up to ``max_backoff_s``."""
    max_backoff_s: float = 5.0
    """Longest retry delay, seconds; also how often a down replica is probed again."""
    outage_window_s: float = 0.0
    """How long a stream rides out an outage, seconds: while every replica is down (none
    answering since its last failure, or no address resolves) it keeps probing them with the
    backoff above and re-sends the unanswered items to the first that comes back, logging each
    wait; it gives up (VerifierError "unavailable") only once the outage has lasted this long.
    0 (default): give up as soon as every replica has failed more than ``max_retries`` times in
    a row (~15 s with the defaults), as before this setting. ``trainer run`` sets it from
    ``verifier.outage_window_s`` (600 s: long enough for a pod to be restarted)."""
    max_message_mb: int = 256
    """Largest message either way, MiB (must match the server's for big code batches)."""
    stream_window: int = 128
    """Items one stream keeps in flight per replica, and read ahead from the caller. Bounds
    the client's memory and what a dead replica leaves to re-send; 128 keeps a 2-worker replica
    busy with ~2 ms math items. Keep it under the server's --stream-inflight (512)."""
    stream_batch: int = 64
    """Items per message on a stream, at most (ScoreBatchStream; and at most half of
    ``stream_window``): the client sends whatever is ready, up to this many, in one message, and
    the server answers with every result ready at once, so a busy stream pays gRPC's per-message cost once per batch (math: ~0.4 ms of client
    CPU per item on a message per item). 1: a message per item on ScoreStream. A server without
    ScoreBatchStream is sent ScoreStream whatever this is."""
    dns_refresh_s: float = 30.0
    """Re-resolve ``dns:///`` addresses this often, seconds (and soon after a replica fails),
    so new pods are used and removed ones dropped."""
    tls: bool = False
    """Use TLS, verifying the server against the system's CA roots (implied by --tls-ca or
    --tls-cert)."""
    tls_ca: Path | None = None
    """PEM CA bundle that signed the server's certificate; turns TLS on."""
    tls_cert: Path | None = None
    """PEM client certificate, for servers that require mutual TLS (with --tls-key)."""
    tls_key: Path | None = None
    """PEM private key of --tls-cert."""
    tls_server_name: str | None = None
    """Name to verify in the server's certificate instead of the address's host (default:
    the host, or the DNS name of a dns:/// address, not the resolved IP)."""
    token_file: Path | None = None
    """File whose first line is the bearer token sent on every call."""
    token_env: str | None = "VERIFIER_TOKEN"
    """Environment variable whose value, when set, is the bearer token sent (when no
    --token-file). Default VERIFIER_TOKEN: a trainer pod with the Secret in that variable
    authenticates without flags; unset or empty: no token."""

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.stream_window < 1:
            raise ValueError("stream_window must be >= 1")
        if self.stream_batch < 1:
            raise ValueError("stream_batch must be >= 1")
        if not self.outage_window_s >= 0:  # also refuses NaN
            raise ValueError(f"outage_window_s must be >= 0, got {self.outage_window_s}")

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None
