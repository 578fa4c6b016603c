"""The judge's harness. It runs INSIDE the sandbox as its first process (PID 1 of the jail's PID
namespace under nsjail and docker), on the sandbox's Python, with the standard library only.

Protocol (judge -> harness, on stdin): an 8-byte big-endian length, a JSON payload of that
length, then a stream of 32-byte keys. The payload holds the program, the test INPUTS and the
limits; expected outputs of stdin/stdout and call-based tests never enter the sandbox.

Protocol (harness -> judge, on stdout): records ``b"MGK1" + len(head) (4 bytes) + head (JSON)
+ blobs + HMAC-SHA256``. Record n is authenticated with key n, which the harness reads from
stdin only when it emits record n: at that moment no process holding the program's code has a
copy of it (keys are read after a test's processes are gone, or in a process the program never
runs in), so even a process that somehow reached the judge's channel could not forge a record.

What the program controls and what it does not:

- Each test runs in a child forked from this (pristine) harness, with its own stdin/stdout/
  stderr pipes, rlimits and wall deadline. Before the program's first instruction the child
  has closed every other descriptor: it cannot reach the judge channel or the key stream.
- The harness is PID 1: processes inside the namespace cannot kill it (the kernel drops signals
  to init that it has no handler for), and after every test it kills every other process in
  the namespace (``kill(-1, SIGKILL)``), so nothing a test starts survives into the next.
- The seccomp policy denies ptrace, process_vm_readv/writev, pidfd_getfd and kcmp, so one
  jailed process cannot read or write another's memory or descriptors.
- stdin/stdout tests: the harness reports the raw stdout, the exit status and whether the
  program raised; the judge compares outside.
- call-based tests: the program's process returns the value, encoded as plain data (never
  pickled); the judge compares it outside, on the encoding: a rigged ``__eq__`` never runs.
- assert / LeetCode tests embed expected values in code. They run in an *evaluator* process
  (forked from the harness, never runs program code) that talks to the program's process over
  a pipe: it sends call arguments as data and receives results as data (objects of the
  prefix's classes such as ListNode are rebuilt from their attributes with the evaluator's own
  classes; other objects stay remote handles that compare equal to nothing). The asserts, the
  builtins they use and the comparison all live in the evaluator. The program's process of
  these tests is NOT forked from the harness, which holds the test code: it is a fresh
  interpreter (``harness --program``) that receives only the program and the prefix, so no
  expected value exists anywhere in the memory the program can search.
- whatever the program sends on its pipes is untrusted: a malformed message, an over-cap length
  or a 100,000-deep array ends the test as the program's failure, never the harness's. The only
  message of the program's process that the harness believes about the ground truth (the
  prefix failed) is the first, sent before any code of the program's runs.
- every process that runs program code installs an audit hook first (``deny_in_process_hooks``):
  no tracing or profiling hook, no ctypes, so the program cannot run code inside the harness's
  frames or rewrite its process's memory; the "raised" marker of stdin/stdout tests is written
  with references bound before the program started.
"""

import _signal as signal  # the C module: `signal` would import enum (2.5 ms)
import builtins
import fcntl
import marshal
import os
import resource
import select
import sys
import time

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
        import json as _json

        globals()["json"] = _json
        return getattr(_json, name)


json = _LazyJson()

MAGIC = b"MGK1"
KEY_BYTES = 32
MAC_BYTES = 32
MSG_CAP = 64 * 1024 * 1024  # largest message between the evaluator and the program
ERR_TAIL = 4096
SIGPENDING_MAX = 256  # signals queued at once in a whole jail
PID1 = os.getpid() == 1
# This file, for starting fresh program processes (``--program``). Absolute: the program may
# change the working directory of its own process, never the harness's.
HARNESS_PATH = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""


# ---------------------------------------------------------------------------------------------
# Plain-data encoding shared by the program process, the evaluator and the judge.
#
# JSON values stand for themselves (lists are lists); everything else is an object with a "$"
# tag: tuple, dict (as key/value pairs), set, frozenset, bytes, bytearray, complex, deque, big
# int (hex), obj (an entry of the object table, for instances of the shared classes: attributes
# only, so cycles and long linked lists are fine), ref (a remote handle), opaque (not data).

_MAX_DEPTH = 400


class EncodeError(Exception):
    pass


class Encoder:
    def __init__(self, known_classes=(), handle=None, seed=()):
        self.known = set(known_classes)
        self.handle = handle
        self.objs = []
        self.memo = {}
        self.pending = []
        for o in seed:
            self._add_obj(o)

    def _add_obj(self, o):
        i = self.memo.get(id(o))
        if i is None:
            i = len(self.objs)
            self.memo[id(o)] = i
            self.objs.append([type(o).__name__, None, o])
            self.pending.append(i)
        return i

    def value(self, v, depth=0):
        if depth > _MAX_DEPTH:
            raise EncodeError("value nested too deeply")
        t = type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            if -(1 << 1000) < v < (1 << 1000):
                return v
            return {"$": "int", "v": format(v, "x")}
        if t is float:
            return v
        if t is list:
            return [self.value(x, depth + 1) for x in v]
        if t is tuple:
            return {"$": "tuple", "v": [self.value(x, depth + 1) for x in v]}
        if t is dict:
            return {
                "$": "dict",
                "v": [[self.value(k, depth + 1), self.value(x, depth + 1)] for k, x in v.items()],
            }
        if t is set or t is frozenset:
            return {"$": t.__name__, "v": [self.value(x, depth + 1) for x in v]}
        if t is bytes or t is bytearray:
            return {"$": t.__name__, "v": bytes(v).decode("latin-1")}
        if t is complex:
            return {"$": "complex", "v": [v.real, v.imag]}
        if t.__name__ in self.known and hasattr(v, "__dict__") and not isinstance(v, type):
            return {"$": "obj", "i": self._add_obj(v)}
        if t.__module__ == "numpy" and getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
            # A numpy scalar stands for its plain value (np.int64(5) == 5, as LiveCodeBench's
            # judge compares); arrays stay opaque (their == is elementwise: never a pass there).
            return self.value(v.item(), depth + 1)
        # Subclasses of plain types are sent as their plain value.
        if isinstance(v, bool):
            return bool(v)
        if isinstance(v, int):
            return self.value(int.__int__(v), depth)
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, str):
            return str.__str__(v)
        if isinstance(v, dict):
            return {
                "$": "dict",
                "v": [
                    [self.value(k, depth + 1), self.value(x, depth + 1)] for k, x in dict.items(v)
                ],
            }
        if t.__name__ == "deque" and t.__module__ == "collections":
            return {"$": "deque", "v": [self.value(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return [self.value(x, depth + 1) for x in list.__iter__(v)]
        if isinstance(v, tuple):
            return {"$": "tuple", "v": [self.value(x, depth + 1) for x in tuple.__iter__(v)]}
        if self.handle is not None:
            return {"$": "ref", "i": self.handle(v), "t": t.__name__}
        return {"$": "opaque", "t": t.__name__}

    def finish(self):
        """Encode the attributes of every table object (iteratively: no recursion along
        ``next`` pointers) and return the table."""
        while self.pending:
            i = self.pending.pop()
            entry = self.objs[i]
            o = entry[2]
            attrs = []
            for k, x in list(vars(o).items()):
                if type(k) is str:
                    attrs.append([k, self.value(x, 1)])
            entry[1] = attrs
        return [[name, attrs] for name, attrs, _ in self.objs]


def encode_message(value, known_classes=(), handle=None, **extra):
    enc = Encoder(known_classes, handle)
    msg = dict(extra)
    msg["v"] = enc.value(value)
    msg["objs"] = enc.finish()
    return msg


class Opaque:
    """A value the other side could not send as data. Equal to nothing, not even itself."""

    __slots__ = ("type_name",)

    def __init__(self, type_name):
        self.type_name = type_name

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(f"truth value of an opaque {self.type_name} object")

    def __repr__(self):
        return f"<opaque {self.type_name}>"


class DecodeError(Exception):
    pass


class Decoder:
    """Rebuild values. ``classes`` maps class names to the receiver's own classes for table
    objects; ``make_ref`` turns remote handles into proxies (else they become Opaque);
    ``seed`` are existing objects that the first table entries update in place."""

    def __init__(self, classes=None, make_ref=None, seed=()):
        self.classes = classes or {}
        self.make_ref = make_ref
        self.seed = list(seed)
        self.objs = []

    def table(self, objs):
        if not isinstance(objs, list):
            raise DecodeError("bad object table")
        made = []
        for i, entry in enumerate(objs):
            if not (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], list)
            ):
                raise DecodeError("bad object entry")
            if i < len(self.seed):
                made.append(self.seed[i])
                continue
            cls = self.classes.get(entry[0])
            if cls is None:
                made.append(Opaque(entry[0]))
            else:
                made.append(cls.__new__(cls))
        self.objs = made
        for o, entry in zip(made, objs):
            if isinstance(o, Opaque):
                continue
            attrs = {}
            for pair in entry[1]:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                    raise DecodeError("bad attribute")
                attrs[pair[0]] = self.value(pair[1])
            d = vars(o)
            d.clear()
            d.update(attrs)

    def value(self, x, depth=0):
        if depth > _MAX_DEPTH + 5:
            raise DecodeError("value nested too deeply")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.value(i, depth + 1) for i in x]
        if not isinstance(x, dict):
            raise DecodeError("bad value")
        tag = x.get("$")
        v = x.get("v")
        if tag == "tuple":
            return tuple(self._items(v, depth))
        if tag == "dict":
            if not isinstance(v, list):
                raise DecodeError("bad dict")
            out = {}
            for pair in v:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise DecodeError("bad dict item")
                k = self.value(pair[0], depth + 1)
                try:
                    out[k] = self.value(pair[1], depth + 1)
                except TypeError as e:
                    raise DecodeError(f"unhashable key: {e}")
            return out
        if tag in ("set", "frozenset"):
            try:
                s = set(self._items(v, depth))
            except TypeError as e:
                raise DecodeError(f"unhashable element: {e}")
            return s if tag == "set" else frozenset(s)
        if tag in ("bytes", "bytearray"):
            if not isinstance(v, str):
                raise DecodeError("bad bytes")
            b = v.encode("latin-1")
            return b if tag == "bytes" else bytearray(b)
        if tag == "complex":
            if not (
                isinstance(v, list)
                and len(v) == 2
                and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in v)
            ):
                raise DecodeError("bad complex")
            return complex(v[0], v[1])
        if tag == "deque":
            import collections

            return collections.deque(self._items(v, depth))
        if tag == "int":
            if not isinstance(v, str) or not v or len(v) > 1_000_000:
                raise DecodeError("bad int")
            try:
                return int(v, 16)
            except ValueError:
                raise DecodeError("bad int")
        if tag == "obj":
            i = x.get("i")
            if not isinstance(i, int) or not 0 <= i < len(self.objs):
                raise DecodeError("bad object reference")
            return self.objs[i]
        if tag == "ref":
            i = x.get("i")
            if not isinstance(i, (int, str)):
                raise DecodeError("bad handle")
            if self.make_ref is not None:
                return self.make_ref(i, str(x.get("t", "?")))
            return Opaque(str(x.get("t", "?")))
        if tag == "opaque":
            return Opaque(str(x.get("t", "?")))
        raise DecodeError(f"unknown tag {tag!r}")

    def _items(self, v, depth):
        if not isinstance(v, list):
            raise DecodeError("bad sequence")
        return [self.value(i, depth + 1) for i in v]


def decode_message(msg, classes=None, make_ref=None, seed=()):
    dec = Decoder(classes, make_ref, seed)
    dec.table(msg.get("objs", []))
    return dec, dec.value(msg.get("v"))


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


def recv_msg(reader, deadline, extra_fds=()):
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


def _dumps(d):
    """JSON for flat records of plain values, without importing json when it can be avoided."""
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
        elif type(v) is float and v == v and v not in (float("inf"), float("-inf")):
            t = repr(v)
        elif type(v) is str and set(v) <= _SAFE:
            t = '"' + v + '"'
        elif type(v) is list and all(type(x) is int for x in v):
            t = "[" + ",".join(map(str, v)) + "]"
        else:
            return json.dumps(d, separators=(",", ":")).encode()
        out.append('"' + k + '":' + t)
    return ("{" + ",".join(out) + "}").encode()


class Reporter:
    """The authenticated record stream to the judge (stdout). See the module docstring."""

    def __init__(self):
        self.seq = 0

    def emit(self, rec, blobs=()):
        key = read_exact(0, KEY_BYTES)
        rec = dict(rec, seq=self.seq, blobs=[len(b) for b in blobs])
        head = _dumps(rec)
        frame = [MAGIC, len(head).to_bytes(4, "big"), head, *blobs]
        frame.append(hmac_sha256(key, frame))
        write_all(1, b"".join(frame))
        self.seq += 1


def kill_all(pids=()):
    """Kill every process of the test. As PID 1 of the namespace: all of them (daemons that
    called setsid included), repeatedly until none is left. Otherwise (unsafe backend): the
    process groups of the children we started."""
    if PID1:
        for _ in range(1000):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                while True:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
            except ChildProcessError:
                return
            time.sleep(0.0005)
        return
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _limits_in_child(cfg, cpu_s):
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    try:
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    except (ValueError, OSError):
        pass
    cpu = max(1, int(cpu_s + 0.999))
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        new_hard = cpu + 1 if hard == resource.RLIM_INFINITY else min(hard, cpu + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, new_hard), new_hard))
    except (ValueError, OSError):
        pass


def spawn(fd_map, body):
    """Fork a child whose descriptors are exactly ``fd_map`` (target fd -> source fd, None for
    /dev/null), all others closed, default signal handling, then run ``body()``; the child never
    returns into the harness."""
    pid = os.fork()
    if pid:
        if not PID1:
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass
        return pid
    try:
        if not PID1:
            os.setpgid(0, 0)
        devnull = os.open("/dev/null", os.O_RDWR)
        top = max(fd_map) + 1 if fd_map else 3
        # Move sources out of the way first so that dup2 cannot clobber one with another.
        moved = {}
        for target, src in fd_map.items():
            # Above every target, so that no dup2 below can clobber a source not yet used.
            moved[target] = fcntl.fcntl(devnull if src is None else src, fcntl.F_DUPFD, top)
        for target, src in moved.items():
            os.dup2(src, target)
        os.closerange(top, 1 << 16)
        for sig in (
            signal.SIGTERM,
            signal.SIGCHLD,
            signal.SIGHUP,
            signal.SIGUSR1,
            signal.SIGUSR2,
            signal.SIGALRM,
        ):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in any Python program
        body()
    except:  # noqa: E722 - bare: the program may have rebound BaseException in our globals
        pass
    os._exit(70)


# Audit events a judged program may not raise. A tracing or profiling hook would let it run code
# inside the harness's own frames (between its exception and the "raised" marker, or rewriting
# the harness's locals); ctypes (or its C module alone: a function pointer made from memmove's
# address writes anywhere) would let it rewrite any memory of its process. Audit hooks cannot be
# removed from Python code, and these events are the only ways to install either.
DENIED_EVENTS = frozenset(("sys.settrace", "sys.setprofile"))
DENIED_MODULES = frozenset(("ctypes", "_ctypes", "_testcapi", "_testinternalcapi"))


def deny_in_process_hooks():
    """Install, in a process about to run program code, the audit hook that refuses tracing,
    profiling and ctypes. Tracing raises RuntimeError; ctypes raises ImportError, as if it were
    not installed, so libraries that use it optionally (numpy) import without it."""
    denied, modules = DENIED_EVENTS, DENIED_MODULES

    def audit(event, args):
        if event in denied:
            raise RuntimeError(f"{event} is not available to programs in the judge's sandbox")
        if (event == "import" and args and args[0] in modules) or event[:7] == "ctypes.":
            what = args[0] if event == "import" else event
            raise ImportError(f"{what} is not available to programs in the judge's sandbox")

    sys.addaudithook(audit)


def program_settings(digits):
    """The judging profile's interpreter settings for a process about to run program code:
    ``digits`` is ``sys.set_int_max_str_digits`` (None: Python's default)."""
    if digits:
        sys.set_int_max_str_digits(int(digits))


def run_main_program(code, st, prefix_code=None, exit_ok=False):
    """Body of the child of one stdin/stdout test: run the program as ``__main__`` and write
    on fd ``st`` what ended it: nothing (ran to the end, or SystemExit with status 0), ``X``
    (SystemExit with another status), ``M`` (MemoryError) or ``E`` (any other exception).
    ``prefix_code`` (the judging profile's preamble) runs first in the same namespace;
    ``exit_ok``: a SystemExit of any status ends the program cleanly (LiveCodeBench's judge
    swallows it and compares the output).

    The marker is written by the first instruction after the exception reaches this frame,
    before any code of the program's can run again (its exception's ``__str__``, its hooks),
    with references bound before the program started: the program may replace ``os.write``,
    ``os._exit``, builtins or this module's globals, but not these locals, and it cannot install
    a tracing hook that would reach them (``deny_in_process_hooks``)."""
    write, exit_now, exc_info, kind = os.write, os._exit, sys.exc_info, type
    SysExit, MemErr, Int = SystemExit, MemoryError, int
    deny_in_process_hooks()
    rc = 0
    g = program_globals("__main__")
    try:
        if prefix_code is not None:
            exec(prefix_code, g)
        exec(code, g)
    except:  # noqa: E722 - bare: no name lookup that the program could have rebound
        exc = exc_info()[1]
        cls = kind(exc)
        if cls is SysExit:
            c = exc.code  # the exact class: a plain member, no property of the program's
            rc = 0 if c is None else (c & 0xFF if kind(c) is Int else 1)
            if exit_ok:
                rc = 0
            marker = b"X" if rc else b""
        elif cls is MemErr:
            rc, marker = 1, b"M"
        else:
            rc, marker = 1, b"E"
        if marker:
            try:
                write(st, marker)
            except:  # noqa: E722 - the marker pipe is gone: never report a clean exit
                exit_now(1)
        if cls is SysExit:
            if kind(exc.code) is not Int and exc.code is not None:
                try:
                    sys.stderr.write(str(exc.code) + "\n")
                except:  # noqa: E722
                    pass
        elif cls is not MemErr:
            try:
                import traceback

                traceback.print_exc()
            except:  # noqa: E722
                pass
    finish_like_interpreter(rc)


def finish_like_interpreter(rc):
    """What the interpreter does at exit: join non-daemon threads, run atexit hooks, flush."""
    th = sys.modules.get("threading")  # only if the program used it
    if th is not None:
        try:
            th._shutdown()
        except BaseException:
            pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(rc)


def program_globals(name):
    return {
        "__name__": name,
        "__builtins__": builtins,
        "__file__": "solution.py",
        "__doc__": None,
        "__package__": None,
    }


class Watch:
    """Supervise one child: read its stdout (capped), stderr (tail) and marker pipe until it
    exits or the deadline passes."""

    def __init__(self, pid, out_fd, err_fd, st_fd, out_cap):
        self.pid = pid
        self.out_cap = out_cap
        self.out = bytearray()
        self.err = bytearray()
        self.st = bytearray()
        self.fds = {}
        for fd, kind in ((out_fd, "out"), (err_fd, "err"), (st_fd, "st")):
            if fd is not None:
                os.set_blocking(fd, False)
                self.fds[fd] = kind
        self.status = None
        self.over_cap = False
        self.wait_status = None
        self.killed_by_us = False
        self.cpu = 0.0
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def _read(self, fd):
        """Read once from ``fd``: True (read or EOF), None (nothing to read now), False (the
        stdout cap was exceeded)."""
        kind = self.fds[fd]
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        if not chunk:
            del self.fds[fd]
            os.close(fd)
            return True
        if kind == "out":
            room = self.out_cap - len(self.out)
            self.out += chunk[:room]
            if len(chunk) > room:
                self.over_cap = True
                return False
        elif kind == "err":
            self.err += chunk
            if len(self.err) > 2 * ERR_TAIL:
                del self.err[:-ERR_TAIL]
        else:
            if len(self.st) < 64:
                self.st += chunk[: 64 - len(self.st)]
        return True

    def reap(self, block):
        if self.wait_status is not None:
            return True
        try:
            pid, status, ru = os.wait4(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.wait_status = 0
            return True
        if pid == 0:
            return False
        self.wait_status = status
        self.cpu = ru.ru_utime + ru.ru_stime
        return True

    def run(self, deadline, others=()):
        """Returns "exited", "timeout" or "output_limit". ``others``: extra fds to watch; when
        one becomes readable, returns ("fd", fd)."""
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        watch_exit = self.wait_status is None
        if self.pidfd is not None and watch_exit:
            poller.register(self.pidfd, select.POLLIN)
        for fd in others:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            timeout_ms = (
                remaining * 1000
                if (self.pidfd is not None or not watch_exit)
                else min(remaining * 1000, 5)
            )
            events = poller.poll(timeout_ms)
            for fd, _ev in events:
                if fd in others:
                    return ("fd", fd)
                if fd == self.pidfd:
                    poller.unregister(fd)
                    self.reap(True)
                    return "exited"
                if fd in self.fds:
                    if self._read(fd) is False:
                        return "output_limit"
                    if fd not in self.fds:
                        poller.unregister(fd)
            if watch_exit and self.pidfd is None and self.reap(False):
                return "exited"

    def drain(self):
        """After the process tree is dead: read what is left (every writer is gone, so this
        reaches EOF at once)."""
        for fd in list(self.fds):
            try:
                # Stop at EOF, at the cap, or when nothing is there (a writer escaped the kill:
                # possible only without a PID namespace).
                while fd in self.fds and self._read(fd):
                    pass
            except OSError:
                pass
        for fd in list(self.fds):
            os.close(fd)
            del self.fds[fd]
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def kill(self):
        self.killed_by_us = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def describe(self, cfg, cpu_limit, how):
        """Summarise the end of the child: status, exit code, signal, markers."""
        st = bytes(self.st)
        rec = {
            "time": None,
            "exit": None,
            "signal": None,
            "raised": any(c in st for c in (b"E", b"M", b"X")),
        }
        ws = self.wait_status
        if ws is not None and os.WIFEXITED(ws):
            rec["exit"] = os.WEXITSTATUS(ws)
        elif ws is not None and os.WIFSIGNALED(ws):
            rec["signal"] = os.WTERMSIG(ws)
        sig = rec["signal"]
        if how == "timeout":
            status = "timeout"
        elif how == "output_limit" or self.over_cap:
            status = "output_limit"
        elif b"M" in st:
            status = "memory"
        # (0.85: the CPU time rusage reports at an RLIMIT_CPU kill runs ~10% short on a loaded
        # host; sandbox/nsjail.py's CPU_LIMIT_SEEN.)
        elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and self.cpu >= 0.85 * cpu_limit):
            status = "timeout"
        elif sig == signal.SIGKILL and not self.killed_by_us and cfg.get("oom_is_memory"):
            status = "memory"  # the cgroup OOM killer: nothing else sends SIGKILL unasked
        elif sig is not None:
            status = "signal"
        else:
            status = "exited"
        rec["status"] = status
        return rec


# ---------------------------------------------------------------------------------------------
# stdin/stdout tests.


def run_stdio(cfg, code, prefix_code, rep):
    tt = float(cfg["test_timeout"])
    for i, inp in enumerate(cfg["inputs"]):
        if time.monotonic() > cfg["_deadline"]:
            rep.emit({"type": "test", "i": i, "status": "timeout", "detail": "item time limit"})
            return
        data = inp.encode("utf-8", "surrogatepass")
        memfd = os.memfd_create("stdin", 0)
        write_all(memfd, data)
        os.lseek(memfd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()

        def body(st=3):
            _limits_in_child(cfg, tt + 1)
            program_settings(cfg.get("int_digits"))
            run_main_program(code, st, prefix_code, bool(cfg.get("exit_ok")))

        t0 = time.monotonic()
        pid = spawn({0: memfd, 1: out_w, 2: err_w, 3: st_w}, body)
        for fd in (memfd, out_w, err_w, st_w):
            os.close(fd)
        w = Watch(pid, out_r, err_r, st_r, int(cfg["output_bytes"]))
        how = w.run(min(t0 + tt, cfg["_deadline"]))
        if how != "exited":
            w.kill()
        w.reap(True)
        kill_all([pid])
        w.drain()
        rec = w.describe(cfg, tt + 1, how)
        rec.update(type="test", i=i)
        rec["time"] = round(time.monotonic() - t0, 4)
        rep.emit(rec, [bytes(w.out), bytes(w.err[-ERR_TAIL:])])
        failed = rec["status"] != "exited" or rec["exit"] != 0 or rec["raised"]
        if failed and cfg["stop_on_fail"]:
            return


# ---------------------------------------------------------------------------------------------
# The program process ("P") for call-based and assert tests: runs the module once, then serves
# requests on fd 3, answers on fd 4.


def program_main():
    """Entry of a program process started as a fresh interpreter (``harness --program``, for
    assert and LeetCode-style tests): its memory holds nothing of the harness's, so no test
    code, expected value or key is in reach of the program, whatever it searches (frames, the
    garbage collector, freed memory). Its first message on fd 3 is the program and the prefix.
    """
    deny_in_process_hooks()
    req = MsgReader(3)
    try:
        init = req.next_blocking()
        if init is None:
            os._exit(0)
        program_settings(init.get("int_digits"))
        if init.get("sys_path"):
            sys.path.append(init["sys_path"])
        code = compile(init["source"], "solution.py", "exec")
        prefix = init.get("prefix") or ""
        prefix_code = compile(prefix, "import_prefix.py", "exec") if prefix else None
    except BaseException as e:
        send_msg(4, {"fatal": f"program process start-up: {type(e).__name__}: {e}", "phase": "exec"})
        os._exit(0)
    program_server(code, prefix_code, req, announce_prefix=True)


def program_server(code, prefix_code, req, announce_prefix=False):
    """Run the prefix and the program's module once, then answer requests. With
    ``announce_prefix`` the prefix's success is sent as the first message, before any code of
    the program's runs: the only "prefix failed" message the harness believes."""
    g = program_globals("solution")
    known = []
    try:
        if prefix_code is not None:
            exec(prefix_code, g)
        known = [k for k, v in g.items() if isinstance(v, type)]
    except BaseException as e:
        send_msg(4, {"fatal": f"import_prefix failed: {type(e).__name__}: {e}", "phase": "prefix"})
        os._exit(0)
    if announce_prefix:
        send_msg(4, {"prefix": "ok"})
    before = dict(g)
    try:
        exec(code, g)
    except SystemExit as e:
        send_msg(
            4,
            {
                "fatal": f"the program exited while loading (SystemExit: {e.code!r})",
                "phase": "module",
            },
        )
        os._exit(0)
    except MemoryError:
        send_msg(
            4, {"fatal": "MemoryError while loading the program", "phase": "module", "memory": True}
        )
        os._exit(0)
    except BaseException as e:
        send_msg(4, {"fatal": f"{type(e).__name__}: {e}", "phase": "module"})
        os._exit(0)
    names = [
        k
        for k, v in list(g.items())
        if not k.startswith("__") and (k not in before or before[k] is not v)
    ]
    handles = {}

    def handle(obj):
        handles[len(handles) + 1] = obj
        return len(handles)

    def resolve(h):
        if isinstance(h, str) and h.startswith("g:"):
            name = h[2:]
            if name not in g:
                raise NameError(f"name {name!r} is not defined")
            return g[name]
        if h in handles:
            return handles[h]
        raise LookupError("stale program handle")

    classes = {k: v for k, v in g.items() if isinstance(v, type)}
    send_msg(4, {"ready": True, "names": names, "known": known})
    while True:
        try:
            m = req.next_blocking()
        except BaseException:
            os._exit(0)
        if m is None:
            os._exit(0)
        try:
            op = m.get("op")
            after = None
            if op == "fn":  # call-based: Solution().f(*args) or f(*args)
                name = m["name"]
                sol = g.get("Solution")
                if isinstance(sol, type) and hasattr(sol, name):
                    fn = getattr(sol(), name)
                elif name in g:
                    fn = g[name]
                else:
                    raise NameError(f"the program defines neither Solution.{name} nor {name}")
                _, args = decode_message(m["args"], classes)
                result = fn(*args)
                if type(result) is tuple:  # LiveCodeBench: tuples count as lists
                    result = list(result)
                resp = encode_message(result, (), None)
            else:
                dec, (args, kwargs) = decode_message(
                    m.get("args", {"v": [[], {"$": "dict", "v": []}], "objs": []}),
                    classes,
                    lambda i, t: resolve(i),
                )
                target = resolve(m.get("h"))
                if op == "global":
                    result = target
                elif op == "call":
                    result = target(*args, **kwargs)
                    if (
                        any(
                            isinstance(a, (list, dict, set))
                            for a in list(args) + list(kwargs.values())
                        )
                        or dec.objs
                    ):
                        after = (list(args), dict(kwargs), list(dec.objs))
                elif op == "getattr":
                    result = getattr(target, m["name"])
                elif op == "getitem":
                    result = target[args[0]]
                elif op == "len":
                    result = len(target)
                elif op == "iter":
                    result = list(target)
                else:
                    raise ValueError(f"unknown op {op!r}")
                enc = Encoder(known, handle, seed=after[2] if after else ())
                resp = {"v": enc.value(result)}
                if after is not None:
                    resp["after"] = [enc.value(a) for a in after[0]]
                    resp["kwafter"] = {k: enc.value(a) for k, a in after[1].items()}
                    resp["seeded"] = len(after[2])
                resp["objs"] = enc.finish()
            send_msg(4, resp)
        except MemoryError:
            try:
                send_msg(4, {"exc": "MemoryError", "msg": "", "memory": True})
            except BaseException:
                os._exit(1)
        except BaseException as e:
            try:
                msg = str(e)[:500]
            except BaseException:
                msg = "?"
            try:
                send_msg(
                    4,
                    {
                        "exc": type(e).__name__ if isinstance(type(e).__name__, str) else "?",
                        "msg": msg,
                    },
                )
            except BaseException:
                os._exit(1)


def _forked_program(cfg, code, prefix_code):
    _limits_in_child(cfg, cfg["_budget"] + 1)
    program_settings(cfg.get("int_digits"))
    deny_in_process_hooks()
    program_server(code, prefix_code, MsgReader(3))


def _fresh_program(cfg):
    _limits_in_child(cfg, cfg["_budget"] + 1)
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", HARNESS_PATH, "--program"])
    except BaseException as e:
        send_msg(4, {"fatal": f"cannot start the program process: {e}", "phase": "exec"})
        os._exit(0)


class Program:
    """The harness's handle on a running program process.

    ``fresh``: start it as a new interpreter (``--program``) instead of a fork of the harness.
    Call-based tests fork (the harness holds nothing the program may not see: its source, the
    test inputs, spent keys); assert and LeetCode-style tests must start fresh, because the
    harness holds their test code, expected values included."""

    def __init__(self, cfg, code, prefix_code, fresh=False):
        self.req_r, self.req_w = os.pipe()
        self.resp_r, self.resp_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fd_map = {0: None, 1: out_w, 2: err_w, 3: self.req_r, 4: self.resp_w}
        body = (
            (lambda: _fresh_program(cfg))
            if fresh
            else (lambda: _forked_program(cfg, code, prefix_code))
        )
        self.pid = spawn(fd_map, body)
        for fd in (out_w, err_w, self.req_r, self.resp_w):
            os.close(fd)
        self.watch = Watch(self.pid, out_r, err_r, None, int(cfg["output_bytes"]))
        self.reader = MsgReader(self.resp_r)
        self.garbage = ""
        if fresh:
            try:
                send_msg(
                    self.req_w,
                    {
                        "source": cfg["source"],
                        "prefix": cfg.get("prefix") or "",
                        "int_digits": cfg.get("int_digits"),
                        "sys_path": cfg.get("sys_path"),
                    },
                )
            except OSError:
                pass  # it died before reading: _wait_msg reports how

    def close(self):
        for fd in (self.req_w, self.resp_r):
            try:
                os.close(fd)
            except OSError:
                pass


def _wait_msg(prog, deadline):
    """Wait for a message from the program process while draining its stdout/stderr.
    Returns the message, "timeout", "output_limit" or "eof" (the process ended without one)."""
    os.set_blocking(prog.resp_r, False)
    while True:
        try:
            m = prog.reader.take()
        except DecodeError as e:
            prog.garbage = str(e)
            return "garbage"
        if m is not None:
            return m
        if prog.reader.eof:
            return "eof"
        how = prog.watch.run(deadline, others=(prog.resp_r,))
        if how == "output_limit":
            return how
        if how == "timeout":
            return "eof" if prog.watch.wait_status is not None else "timeout"
        if how == "exited":
            # It died: what it wrote before is in the pipe; a descendant that still holds the
            # pipe open must not keep us waiting.
            deadline = min(deadline, time.monotonic() + 0.05)
            continue
        prog.reader.feed()


def _program_failure(prog, cfg, how, cpu_limit):
    """Kill the program's processes and describe how it ended."""
    if prog.watch.wait_status is None:
        if how in ("timeout", "output_limit") or not prog.watch.reap(False):
            prog.watch.kill()  # still running (it may wait for the next request): stop it
    prog.watch.reap(True)
    kill_all([prog.pid])
    prog.watch.drain()
    rec = prog.watch.describe(
        cfg, cpu_limit, how if how in ("timeout", "output_limit") else "exited"
    )
    if how == "garbage":
        rec["status"] = "error"
        rec["detail"] = f"the program wrote malformed data on the judge's channel: {prog.garbage}"
    elif rec["status"] == "exited":
        rec["status"] = "died"
        rec["detail"] = "the program process ended without answering"
    return rec


def run_call(cfg, code, prefix_code, rep):
    tt = float(cfg["test_timeout"])
    cpu_limit = cfg["_budget"] + 1
    prog = None
    for i, args in enumerate(cfg["inputs"]):
        t0 = time.monotonic()
        deadline = min(t0 + tt, cfg["_deadline"])
        rec = None
        if prog is None:
            prog = Program(cfg, code, prefix_code)
            ready = _wait_msg(prog, deadline)
            if isinstance(ready, dict) and ready.get("fatal"):
                rec = _program_failure(prog, cfg, "exited", cpu_limit)
                # A program whose module-level code fails before any test can call it is
                # LiveCodeBench's "compilation error" (the judge reports COMPILE_ERROR).
                rec.update(
                    status="memory" if ready.get("memory") else "load_error",
                    detail=ready["fatal"],
                )
            elif not isinstance(ready, dict):
                rec = _program_failure(prog, cfg, ready, cpu_limit)
        if rec is None:
            try:
                send_msg(
                    prog.req_w, {"op": "fn", "name": cfg["fn_name"], "args": encode_message(args)}
                )
                resp = _wait_msg(prog, deadline)
            except OSError:
                resp = "eof"
            if isinstance(resp, dict) and "exc" not in resp:
                blob = json.dumps(
                    {"v": resp.get("v"), "objs": resp.get("objs", [])}, allow_nan=True
                ).encode()
                rep.emit(
                    {
                        "type": "test",
                        "i": i,
                        "status": "exited",
                        "exit": 0,
                        "raised": False,
                        "time": round(time.monotonic() - t0, 4),
                    },
                    [blob, bytes(prog.watch.err[-ERR_TAIL:])],
                )
                continue
            if isinstance(resp, dict):
                rec = {
                    "status": "memory" if resp.get("memory") else "error",
                    "detail": f"{resp['exc']}: {resp.get('msg', '')}",
                }
                if resp.get("memory"):
                    _program_failure(prog, cfg, "exited", cpu_limit)
            else:
                rec = _program_failure(prog, cfg, resp, cpu_limit)
        err = bytes(prog.watch.err[-ERR_TAIL:])
        if prog.watch.wait_status is not None:  # it is dead: start a fresh one for the next test
            prog.close()
            prog = None
        rec.update(type="test", i=i, time=round(time.monotonic() - t0, 4))
        rep.emit(rec, [b"", err])
        if cfg["stop_on_fail"]:
            break
    if prog is not None:
        kill_all([prog.pid])
        prog.watch.reap(True)
        prog.watch.drain()
        prog.close()


# ---------------------------------------------------------------------------------------------
# Assert and LeetCode-style tests: the evaluator process ("E").


class Control(BaseException):
    """Stops the evaluator; never caught by test code's ``except Exception``."""


class ProgramGone(Control):
    def __init__(self, why):
        super().__init__(why)
        self.why = why


class StopEvaluation(Control):
    pass


class RemoteError(Exception):
    pass


class Skipped:
    """Stands in for remote results while the evaluator fast-forwards to where it resumes."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *a, **k):
        return self

    def __getitem__(self, k):
        return self

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __bool__(self):
        return False


def evaluator(cfg, prefix_code, units, resume_after, names):
    """Runs in the evaluator process: fd 3 = requests to the program, fd 4 = its answers,
    fd 5 = results to the harness."""
    sys.set_int_max_str_digits(0) if hasattr(sys, "set_int_max_str_digits") else None
    _limits_in_child(cfg, cfg["_budget"] + 1)
    reader = MsgReader(4)
    tt = float(cfg["test_timeout"])
    state = {
        "deadline": time.monotonic() + tt,
        "skipping": resume_after is not None,
        "current": None,  # the last test begun
        "open": False,  # inside that test (begun, not yet decided)
        "calls": 0,  # requests sent to the program
    }
    ns = {"__name__": "__judge_ns__", "__builtins__": builtins}

    def report(obj):
        send_msg(5, obj)

    def rpc(msg):
        if state["skipping"]:
            return Skipped()
        state["calls"] += 1
        try:
            send_msg(3, msg)
        except OSError:
            raise ProgramGone("died")
        try:
            m = recv_msg(reader, state["deadline"])
        except DecodeError as e:
            raise ProgramGone(("garbage", str(e)))
        if m == "timeout":
            raise ProgramGone("timeout")
        if m == "eof":
            raise ProgramGone("died")
        if "fatal" in m:
            raise ProgramGone(("fatal", m["fatal"], bool(m.get("memory")), m.get("phase")))
        if "exc" in m:
            if m.get("memory"):
                raise ProgramGone(("memory", m.get("msg", "")))
            name = m["exc"]
            cls = getattr(builtins, name, None) if isinstance(name, str) else None
            text = f"{name}: {m.get('msg', '')}"
            if (
                isinstance(cls, type)
                and issubclass(cls, Exception)
                and cls.__module__ == "builtins"
                # These two end an iteration instead of failing: raised into all(map(f, ...))
                # they would stop it early and make the assert pass.
                and not issubclass(cls, (StopIteration, StopAsyncIteration))
            ):
                try:
                    raise cls(f"(raised by the program) {m.get('msg', '')}")
                except TypeError:
                    raise RemoteError(text)
            raise RemoteError(text)
        return m

    classes = {}

    def refresh_classes():
        classes.clear()
        for k, v in ns.items():
            if isinstance(v, type) and getattr(v, "__module__", None) == "__judge_ns__":
                classes[k] = v

    class RemoteRef:
        __slots__ = ("_h", "_t")

        def __init__(self, h, t):
            object.__setattr__(self, "_h", h)
            object.__setattr__(self, "_t", t)

        def _do(self, op, args=(), kwargs=None, **extra):
            enc = Encoder(classes.keys(), handle=_no_handle)
            payload = {"v": enc.value([list(args), dict(kwargs or {})])}
            payload["objs"] = enc.finish()
            seed = [o for _n, _a, o in enc.objs]
            msg = dict(op=op, h=self._h, args=payload, **extra)
            m = rpc(msg)
            if isinstance(m, Skipped):
                return m
            # The argument objects come back first in the table (updated in place) only when
            # the program says it seeded its table with them.
            dec = Decoder(classes, RemoteRef, seed=seed if m.get("seeded") == len(seed) else ())
            try:
                dec.table(m.get("objs", []))
                result = dec.value(m.get("v"))
                if "after" in m:
                    for orig, new in zip(args, m["after"]):
                        _write_back(orig, dec.value(new))
                    for k, new in (m.get("kwafter") or {}).items():
                        if kwargs and k in kwargs:
                            _write_back(kwargs[k], dec.value(new))
            except Exception as e:  # bad data from the program: a failed call, never a pass
                raise RemoteError(f"the program's result is not plain data: {e}")
            return result

        def __call__(self, *args, **kwargs):
            return self._do("call", args, kwargs)

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return self._do("getattr", name=name)

        def __getitem__(self, key):
            return self._do("getitem", (key,))

        def __len__(self):
            n = self._do("len")
            if type(n) is not int or n < 0:
                raise TypeError("len() of a program object")
            return n

        def __iter__(self):
            items = self._do("iter")
            if type(items) is not list:
                raise TypeError("iteration over a program object")
            return iter(items)

        def __bool__(self):
            raise TypeError(f"the truth value of a program object ({self._t}) is not data")

        def __setattr__(self, name, value):
            raise TypeError("cannot set attributes on a program object")

        def __repr__(self):
            return f"<program {self._t}>"

    class Judge:
        Control = Control

        @staticmethod
        def begin(i):
            state["current"] = i
            if state["skipping"]:
                if i == resume_after:
                    state["skipping"] = False
                return False
            state["open"] = True
            return True

        @staticmethod
        def result(i, ok):
            state["open"] = False
            state["deadline"] = time.monotonic() + tt
            report(
                {"t": "res", "id": i, "ok": bool(ok), "detail": "" if ok else "assertion failed"}
            )
            if not ok and cfg["stop_on_fail"]:
                raise StopEvaluation()

        @staticmethod
        def error(i, exc):
            state["open"] = False
            state["deadline"] = time.monotonic() + tt
            try:
                text = f"{type(exc).__name__}: {exc}"[:500]
            except BaseException:
                text = type(exc).__name__
            report({"t": "res", "id": i, "ok": False, "error": True, "detail": text})
            if cfg["stop_on_fail"]:
                raise StopEvaluation()

    try:
        if prefix_code is not None:
            exec(prefix_code, ns)
    except BaseException as e:
        report(
            {
                "t": "setup_error",
                "detail": f"import_prefix failed in the judge: {type(e).__name__}: {e}",
            }
        )
        os._exit(0)
    ns["__judge__"] = Judge
    # The program's names: what its module defined or rebound after the prefix ran. They take
    # the place of the prefix's names of the same spelling (a program's own ``add`` beside a
    # preamble's ``from operator import *``), as in one file where the program comes after the
    # prefix; builtins stay the evaluator's own (a program cannot rig ``sorted`` or ``max``).
    for n in names:
        if type(n) is str and n.isidentifier() and not n.startswith("__") and not hasattr(builtins, n):
            ns[n] = RemoteRef("g:" + n, n)
    refresh_classes()

    def blamed():
        """The test a failure outside any assert belongs to: the one begun and not decided,
        else the next one (code between two asserts prepares the second)."""
        cur = state["current"]
        if state["open"] or units["kind"] == "asserts":
            return cur
        return 0 if cur is None else cur + 1

    def on_gone(e):
        why = e.why
        report({"t": "gone", "id": blamed(), "why": why if isinstance(why, str) else list(why)})
        os._exit(0)

    if units["kind"] == "asserts":
        state["skipping"] = False  # cases are independent: resuming just skips the done ones
        for k, src in enumerate(units["cases"]):
            if resume_after is not None and k <= resume_after:
                continue
            state["current"] = k
            state["open"] = True
            try:
                exec(compile(src, f"<assert {k}>", "exec"), ns)
            except StopEvaluation:
                break
            except ProgramGone as e:
                on_gone(e)
            except BaseException as e:
                try:
                    Judge.error(k, e)
                except StopEvaluation:
                    break
    else:
        try:
            exec(compile(units["test_code"], "<test_code>", "exec"), ns)
            refresh_classes()
        except ProgramGone as e:
            on_gone(e)
        except BaseException as e:
            try:
                text = f"{type(e).__name__}: {e}"[:500]
            except BaseException:
                text = type(e).__name__
            if state["calls"]:
                # The test code called the program while loading: the program's failure.
                report({"t": "res", "id": 0, "ok": False, "error": True, "detail": text})
                report({"t": "end"})
            else:
                report({"t": "setup_error", "detail": f"test_code failed to load: {text}"})
            os._exit(0)
        state["skipping"] = False
        try:
            candidate = eval(compile(units["entry_point"], "<entry_point>", "eval"), ns)
            ns["__judge_candidate__"] = candidate
            state["skipping"] = resume_after is not None
            exec(compile(units["call"], "<check>", "exec"), ns)
        except StopEvaluation:
            pass
        except ProgramGone as e:
            on_gone(e)
        except BaseException as e:
            # An exception outside any assert (in setup code between asserts): the next
            # assert fails with it; with run-all, evaluation restarts after that assert.
            if not state["skipping"]:
                nxt = blamed()
                if nxt < int(cfg["n_units"]):
                    try:
                        text = f"{type(e).__name__}: {e}"[:500]
                    except BaseException:
                        text = type(e).__name__
                    report({"t": "res", "id": nxt, "ok": False, "error": True, "detail": text})
                    if not cfg["stop_on_fail"] and nxt + 1 < int(cfg["n_units"]):
                        report({"t": "restart", "after": nxt})
                        os._exit(0)
    report({"t": "end"})
    os._exit(0)


def _no_handle(obj):
    raise EncodeError(f"cannot pass a {type(obj).__name__} to the program")


def _write_back(orig, new):
    """Make the evaluator's argument look like the program's after an in-place change."""
    try:
        if type(orig) is list and type(new) is list:
            orig[:] = new
        elif type(orig) is dict and type(new) is dict or type(orig) is set and type(new) is set:
            orig.clear()
            orig.update(new)
        elif type(orig) is bytearray and type(new) is bytearray:
            orig[:] = new
    except Exception:
        pass


def run_check(cfg, code, prefix_code, rep):
    units = cfg["units"]
    resume_after = None
    recorded = set()
    relayed_fail = set()  # an assert in a loop reports every execution: relay at most a pass
    # and a failure per assert (the judge's key budget is two records per test)
    while True:
        if time.monotonic() > cfg["_deadline"]:
            rep.emit(
                {
                    "type": "test",
                    "i": _next_id(recorded, resume_after),
                    "status": "timeout",
                    "detail": "item time limit",
                }
            )
            return
        prog = Program(cfg, code, prefix_code, fresh=True)
        t0 = time.monotonic()
        deadline = min(t0 + float(cfg["test_timeout"]), cfg["_deadline"])
        # The first message is sent before any code of the program's runs (program_main): only
        # it can say that the process could not start or that the ground truth's prefix failed.
        ready = _wait_msg(prog, deadline)
        if isinstance(ready, dict) and ready.get("phase") in ("exec", "prefix"):
            _program_failure(prog, cfg, "exited", cfg["_budget"] + 1)
            prog.close()
            kind = "setup_error" if ready["phase"] == "prefix" else "harness_error"
            rep.emit({"type": kind, "detail": str(ready.get("fatal"))[:500]})
            return
        if isinstance(ready, dict) and ready.get("prefix") == "ok":
            ready = _wait_msg(prog, deadline)
        if not isinstance(ready, dict) or ready.get("fatal") or not ready.get("ready"):
            if isinstance(ready, dict):
                rec = _program_failure(prog, cfg, "exited", cfg["_budget"] + 1)
                # A program whose module-level code fails before any test can call it is
                # LiveCodeBench's "compilation error" (the judge reports COMPILE_ERROR).
                # (Whatever it claims, e.g. "phase": "prefix": that can only be the program.)
                rec.update(
                    status="memory" if ready.get("memory") is True else "load_error",
                    detail=str(ready.get("fatal") or "the program's process sent no ready message")[:500],
                )
            else:
                rec = _program_failure(prog, cfg, ready, cfg["_budget"] + 1)
            prog.close()
            i = _next_id(recorded, resume_after)
            rec.update(type="test", i=i)
            rep.emit(rec, [b"", bytes(prog.watch.err[-ERR_TAIL:])])
            if cfg["stop_on_fail"] or i is None or i + 1 >= int(cfg["n_units"]):
                return
            resume_after = i
            recorded.add(i)
            continue
        names = ready.get("names")
        names = names if isinstance(names, list) else []
        try:
            res_r, res_w = os.pipe()
            ev_pid = spawn(
                {0: None, 1: None, 2: 2, 3: prog.req_w, 4: prog.resp_r, 5: res_w},
                lambda after=resume_after, names=names: evaluator(
                    cfg, prefix_code, units, after, names
                ),
            )
        except OSError as e:
            # The program's process exhausted the sandbox (processes, descriptors) before the
            # evaluator could start: its failure.
            rec = _program_failure(prog, cfg, "exited", cfg["_budget"] + 1)
            rec.update(type="test", i=_next_id(recorded, resume_after), status="error")
            rec["detail"] = f"the program exhausted the sandbox: {e}"
            rep.emit(rec, [b"", b""])
            prog.close()
            return
        os.close(res_w)
        reader = MsgReader(res_r)
        os.set_blocking(res_r, False)
        restart = None
        finished = False
        while not finished:
            how = prog.watch.run(cfg["_deadline"], others=(res_r,))
            if how == "output_limit":
                prog.watch.kill()
                restart = ("output_limit", None)
                break
            if how == "timeout":
                restart = ("item_timeout", None)
                break
            if how == "exited":
                # The program process died; the evaluator will notice and report "gone".
                continue
            reader.feed()
            while True:
                m = reader.take()
                if m is None:
                    break
                t = m.get("t")
                if t == "res":
                    i = m.get("id")
                    if not isinstance(i, int) or not 0 <= i < int(cfg["n_units"]):
                        continue
                    if (m["ok"] and i in recorded) or (not m["ok"] and i in relayed_fail):
                        continue
                    recorded.add(i)
                    if not m["ok"]:
                        relayed_fail.add(i)
                    status = "exited" if m["ok"] else ("error" if m.get("error") else "failed")
                    rep.emit(
                        {"type": "test", "i": i, "status": status, "detail": m.get("detail", "")},
                        [],
                    )
                elif t == "setup_error":
                    rep.emit({"type": "setup_error", "detail": m.get("detail", "")})
                    finished = True
                    restart = ("done", None)
                    break
                elif t == "gone":
                    restart = ("gone", m)
                    finished = True
                    break
                elif t == "end":
                    finished = True
                    restart = ("done", None)
                    break
                elif t == "restart":
                    finished = True
                    restart = ("restart", m)
                    break
            if reader.eof and not finished:
                restart = ("evaluator_died", None)
                break
        kind, info = restart
        if kind == "gone":
            why = info.get("why")
            rec = _program_failure(
                prog, cfg, "timeout" if why == "timeout" else "exited", cfg["_budget"] + 1
            )
            if isinstance(why, list) and why and why[0] == "memory":
                rec["status"] = "memory"
            elif isinstance(why, list) and why and why[0] == "fatal":
                rec["status"] = "memory" if why[2] else "error"
                rec["detail"] = str(why[1])[:500]
            elif isinstance(why, list) and why and why[0] == "garbage":
                rec["status"] = "error"
                rec["detail"] = f"the program wrote malformed data on the judge's channel: {why[1]}"
            elif rec["status"] == "died":
                rec["detail"] = "the program process died"
        elif kind in ("output_limit", "item_timeout"):
            rec = _program_failure(
                prog,
                cfg,
                "output_limit" if kind == "output_limit" else "timeout",
                cfg["_budget"] + 1,
            )
            info = {"id": None}
        elif kind == "evaluator_died":
            rec = {"status": "error", "detail": "the evaluator process was killed"}
            info = {"id": None}
        kill_all([prog.pid, ev_pid])
        prog.watch.reap(True)
        prog.watch.drain()
        prog.close()
        os.close(res_r)
        if kind == "done":
            return
        if kind == "restart":
            resume_after = int(info["after"])
            continue
        i = info.get("id") if info else None
        if i is None:
            i = _next_id(recorded, resume_after)
        if i is None:
            return
        rec.update(type="test", i=i)
        rep.emit(rec, [b"", bytes(prog.watch.err[-ERR_TAIL:])])
        recorded.add(i)
        if (
            cfg["stop_on_fail"]
            or kind in ("item_timeout", "evaluator_died")
            or i + 1 >= int(cfg["n_units"])
        ):
            return
        resume_after = i


def _next_id(recorded, resume_after):
    i = 0 if resume_after is None else resume_after + 1
    while i in recorded:
        i += 1
    return i


# ---------------------------------------------------------------------------------------------


class _Quitter:
    """``exit()``/``quit()`` as ``site`` defines them (the harness runs with -S)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, _Quitter(name))
    if sys.argv[1:] == ["--program"]:
        program_main()
        return
    # Pending signals count against the per-user total of the user who created the jail's user
    # namespace (root) as well as the jail's own; nsjail has no option for this limit, so the
    # harness sets it for every process of the jail.
    try:
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (SIGPENDING_MAX, SIGPENDING_MAX))
    except (ValueError, OSError, AttributeError):
        pass
    rep = Reporter()
    n = int.from_bytes(read_exact(0, 8), "big")
    # The payload comes from the judge (trusted direction), so marshal is fine and cheap.
    cfg = marshal.loads(read_exact(0, n))
    start = time.monotonic()
    cfg["_budget"] = float(cfg["budget_s"])
    if cfg.get("sys_path"):
        sys.path.append(cfg["sys_path"])  # the profile's extra packages (numpy), read-only
    cfg["_deadline"] = start + cfg["_budget"]
    try:
        code = compile(cfg["source"], "solution.py", "exec")
        prefix_code = (
            compile(cfg["prefix"], "import_prefix.py", "exec") if cfg.get("prefix") else None
        )
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
        rep.emit({"type": "syntax", "detail": f"{type(e).__name__}: {e}"[:500]})
        rep.emit({"type": "done"})
        return
    mode = cfg["mode"]
    if mode == "stdio":
        run_stdio(cfg, code, prefix_code, rep)
    elif mode == "call":
        run_call(cfg, code, prefix_code, rep)
    elif mode == "check":
        run_check(cfg, code, prefix_code, rep)
    kill_all()
    rep.emit({"type": "done"})


if __name__ == "__main__":
    main()
    os._exit(0)  # skip interpreter teardown (a few ms)
