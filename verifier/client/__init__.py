"""The verifier's clients: sync and asyncio gRPC clients, their settings, many replicas
behind one client, and a local verifier for one job.

This package's face is public (docs/integrations.md): ``from verifier.client import
VerifierClient, AsyncVerifierClient, ClientConfig``."""

from verifier.client.clients import (
    AsyncVerifierClient,
    VerifierClient,
    nothing_listens,
)
from verifier.client.config import ClientConfig

__all__ = ["AsyncVerifierClient", "ClientConfig", "VerifierClient", "nothing_listens"]
