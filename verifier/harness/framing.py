"""Framing: the judge's payload (its one declaration, ``PAYLOAD_FIELDS``), length-prefixed JSON
messages between the jail's processes (the evaluator and the program's process), and the
HMAC-authenticated record stream from the harness to the judge (see runners.py's docstring for
the protocol).

Part of the judge's harness (generated into ``harness.py`` by ``python -m
verifier.harness.build``); the judge imports its constants. Standard library only, and only
modules that are cheap to import in the jail (no hashlib, no json until a message needs it).
"""

import os
import resource
import select
import time

from .codec import DecodeError

try:  # builtin on most builds; hashlib would pull in OpenSSL (2 ms of start-up)
    from _sha256 import sha256 as _sha256
except ImportError:  # pragma: no cover
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        from hashlib import sha256 as _sha256


class _LazyJson:
    """``json`` costs ~4 ms to import (it pulls in ``re``); the stdin/stdout path never needs it."""

    def __getattr__(self, name):
        import json as _json  # lazy: ~4 ms in the jail; stdin/stdout tests never need it

        globals()["json"] = _json
        return getattr(_json, name)


json = _LazyJson()

MAGIC = b"MGK1"
KEY_BYTES = 32
MAC_BYTES = 32
MSG_CAP = 64 * 1024 * 1024  # largest message between the evaluator and the program
ERR_TAIL = 4096  # the most of a test's stderr a record carries
TEXT_CAP = 1000  # the longest string in a record header (details can hold the program's text)

# ---------------------------------------------------------------------------------------------
# The payload, judge -> harness: a marshal-dumped dict (the trusted direction: marshal is cheap
# to load in the jail). Declared here, once: the judge builds it in one function
# (verifier.scoring.code_score.harness_payload) and the harness checks it on arrival (runners.main),
# both with ``payload_problem``. Each field with the exact types its value may have (a bool is
# not an int here).

_NONE = type(None)
PAYLOAD_FIELDS = {
    "mode": (str,),  # the runner: "stdio", "call", "check" (asserts, LeetCode-style) or
    # "checker" (a ground truth's checker program judging a sample's outputs)
    "source": (str,),  # the program's text (compiled in the jail)
    "prefix": (str,),  # the profile's preamble + the ground truth's imports and helper classes
    "int_digits": (int, _NONE),  # sys.set_int_max_str_digits for the program (None: default)
    "exit_ok": (bool,),  # stdin/stdout: a SystemExit of any status ends the program cleanly
    "sys_path": (str, _NONE),  # the extra packages' directory (numpy), or None
    "test_timeout": (float,),  # seconds of wall time per test
    "memory_mb": (int,),  # RLIMIT_AS of each process that runs program code
    "output_bytes": (int,),  # the cap on one test's stdout
    "lcb_rules": (str,),  # stdio and call run by lcb_runner.py: "lcb" (LiveCodeBench's
    # harness semantics), "skywork" (Skywork-OR1's older copy of them), "" (this project's)
    "stop_on_fail": (bool,),  # stop at the first failed test
    "oom_is_memory": (bool,),  # a SIGKILL nobody here sent is the memory limit (cgroups)
    "budget_s": (float,),  # the whole sample's wall time, from the payload's arrival
    "n_units": (int,),  # the number of tests
}
PAYLOAD_MODE_FIELDS = {
    "stdio": {"inputs": (list,)},  # each test's stdin text
    "call": {"inputs": (list,), "fn_name": (str,)},  # each test's arguments; the function
    "check": {"units": (dict,)},  # the test code (ground_truth.Spec.units)
    # a checker program (checker.py): per test [input, the program's stdout, the expected
    # output, whether to self-check on a crash] (bytes, bytes, bytes, bool)
    "checker": {"tests": (list,)},
}


def payload_problem(cfg):
    """Why ``cfg`` is not a payload of the declared shape ("" when it is): not a dict, an
    unknown mode, a field missing, one not declared, or a value of another type."""
    if type(cfg) is not dict:
        return f"the payload is a {type(cfg).__name__}, not a dict"
    fields = PAYLOAD_MODE_FIELDS.get(cfg.get("mode"))
    if fields is None:
        return f"unknown mode {cfg.get('mode')!r}"
    fields = {**PAYLOAD_FIELDS, **fields}
    missing = [k for k in fields if k not in cfg]
    if missing:
        return f"field(s) missing: {', '.join(missing)}"
    extra = sorted(repr(k) for k in cfg if k not in fields)
    if extra:
        return f"field(s) not declared for mode {cfg['mode']!r}: {', '.join(extra)}"
    for k, types in fields.items():
        if type(cfg[k]) not in types:
            return f"field {k!r} is a {type(cfg[k]).__name__}"
    return ""


# ---------------------------------------------------------------------------------------------
# Low-level plumbing.


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError(f"stream ended after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_msg(fd, obj):
    data = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()
    write_all(fd, len(data).to_bytes(4, "big") + data)


class MsgReader:
    """Length-prefixed JSON messages from a non-blocking fd, with a size cap."""

    def __init__(self, fd, cap=MSG_CAP):
        self.fd = fd
        self.buf = bytearray()
        self.cap = cap
        self.eof = False

    def feed(self):
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
        self.buf += chunk

    def take(self):
        """The next whole message, or None. Raises DecodeError for anything that is not a
        length-prefixed JSON object under the cap (the stream is then unusable)."""
        if len(self.buf) < 4:
            return None
        n = int.from_bytes(self.buf[:4], "big")
        if n > self.cap:
            raise DecodeError(f"message of {n} bytes over the {self.cap}-byte cap")
        if len(self.buf) < 4 + n:
            return None
        data = bytes(self.buf[4 : 4 + n])
        del self.buf[: 4 + n]
        try:
            msg = json.loads(data)
        except (ValueError, RecursionError, MemoryError) as e:
            raise DecodeError(f"malformed message ({type(e).__name__})")
        if not isinstance(msg, dict):
            raise DecodeError("malformed message (not an object)")
        return msg

    def next_blocking(self):
        """Block until a whole message (returned) or the end of the stream (None)."""
        os.set_blocking(self.fd, True)
        while True:
            m = self.take()
            if m is not None:
                return m
            self.feed()
            if self.eof:
                return None


def recv_msg(reader, deadline):
    """Wait for one message until ``deadline``. Returns the message, "timeout" or "eof";
    raises DecodeError for a malformed one."""
    os.set_blocking(reader.fd, False)
    poller = select.poll()
    poller.register(reader.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        m = reader.take()
        if m is not None:
            return m
        if reader.eof:
            return "eof"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        for _fd, _ev in poller.poll(remaining * 1000):
            reader.feed()


def hmac_sha256(key, parts):
    """RFC 2104 HMAC-SHA256 (the same as ``hmac.new(key, msg, sha256)``) without importing
    hashlib/hmac."""
    k = key.ljust(64, b"\0") if len(key) <= 64 else _sha256(key).digest().ljust(64, b"\0")
    inner = _sha256(bytes(b ^ 0x36 for b in k))
    for p in parts:
        inner.update(p)
    return _sha256(bytes(b ^ 0x5C for b in k) + inner.digest()).digest()


_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. ")
# What json.dumps (ensure_ascii) writes for the characters a JSON string cannot hold as they are.
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "\b": "\\b", "\f": "\\f"}
_FLOATS = {float("inf"): "Infinity", float("-inf"): "-Infinity"}


def _json_str(v):
    """``v`` as json.dumps writes a string (ASCII only: the rest as \\u escapes, astral
    characters as surrogate pairs), without importing json: a record's detail often holds
    other characters (a syntax error's message), and importing json costs ~4 ms in a jail."""
    if set(v) <= _SAFE:
        return '"' + v + '"'
    out = []
    for c in v:
        o = ord(c)
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif 0x20 <= o < 0x7F:
            out.append(c)
        elif o <= 0xFFFF:
            out.append("\\u%04x" % o)
        else:
            o -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 | (o >> 10), 0xDC00 | (o & 0x3FF)))
    return '"' + "".join(out) + '"'


def _dumps(d):
    """JSON for flat records of plain values, as json.dumps writes them (compact separators),
    without importing json when it can be avoided."""
    out = []
    for k, v in d.items():
        if v is None:
            t = "null"
        elif v is True:
            t = "true"
        elif v is False:
            t = "false"
        elif type(v) is int:
            t = str(v)
        elif type(v) is float:
            t = repr(v) if v == v and v not in _FLOATS else _FLOATS.get(v, "NaN")
        elif type(v) is str:
            t = _json_str(v)
        elif type(v) is list and all(type(x) is int for x in v):
            t = "[" + ",".join(map(str, v)) + "]"
        else:
            return json.dumps(d, separators=(",", ":")).encode()
        out.append(_json_str(k) + ":" + t)
    return ("{" + ",".join(out) + "}").encode()


def header_value(v):
    """A record header's value as the judge reads it (code_score._HEAD_TYPES): None, bools,
    ints, finite floats and strings of at most TEXT_CAP characters stand for themselves;
    anything else (program data that reached a record: a list, a dict, a huge string) becomes
    a short text. So no value of a header can be unhashable, oversized or of a type the judge
    does not expect, whatever a runner put into it."""
    t = type(v)
    if v is None or t is bool or t is int or t is float:
        return v
    if t is str:
        return v[:TEXT_CAP]
    return f"<{t.__name__}>"


class Reporter:
    """The authenticated record stream to the judge (stdout). See the module docstring."""

    def __init__(self):
        self.seq = 0

    def emit(self, rec, blobs=()):
        key = read_exact(0, KEY_BYTES)
        # CPU so far of the harness itself and of its reaped children (the tests), for the
        # judge's cost breakdown (docs/verifier.md 3); informational, never part of a verdict.
        # (process_time and getrusage: microsecond clocks; os.times counts 10 ms ticks.)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        rec = {k: header_value(v) for k, v in rec.items()}
        rec.update(seq=self.seq, blobs=[len(b) for b in blobs],
                   hcpu_us=int(time.process_time() * 1e6),
                   ccpu_us=int((ru.ru_utime + ru.ru_stime) * 1e6))
        head = _dumps(rec)
        frame = [MAGIC, len(head).to_bytes(4, "big"), head, *blobs]
        frame.append(hmac_sha256(key, frame))
        write_all(1, b"".join(frame))
        self.seq += 1
