"""Process-wide logging set-up for the verifier's commands and the trainer's (one format for
both: text for people, JSON lines for log collectors)."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

__all__ = ["setup_logging"]


_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message",
                                                                                 "asctime"}
"""A log record's own attributes; the others were given as ``extra={...}``."""


class TextFormatter(logging.Formatter):
    """``TIME LEVEL NAME: MESSAGE key=value ...``: the fields a record was given as ``extra``
    follow its message, so the text format says what the JSON one does (the address and
    ports of "verifier listening", for one)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = [f"{k}={v}" for k, v in vars(record).items()
                 if k not in _STANDARD and not k.startswith("_")]
        if not extra:
            return text
        head, sep, tail = text.partition("\n")  # a traceback stays below the line
        return f"{head} {' '.join(extra)}{sep}{tail}"


def setup_logging(fmt: str, level: int = logging.INFO) -> None:
    """Send every logger's records to stderr as ``fmt`` ("json" or "text"), replacing the root
    logger's handlers."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
