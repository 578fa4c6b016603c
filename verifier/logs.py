"""Process-wide logging set-up for the verifier's commands and the trainer's (one format for
both: text for people, JSON lines for log collectors)."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

__all__ = ["setup_logging"]


def setup_logging(fmt: str, level: int = logging.INFO) -> None:
    """Send every logger's records to stderr as ``fmt`` ("json" or "text"), replacing the root
    logger's handlers."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
