"""The judge's harness. It runs INSIDE the sandbox as its first process (PID 1 of the jail's PID
namespace under nsjail and docker), on the sandbox's Python, with the standard library only.

Protocol (judge -> harness, on stdin): an 8-byte big-endian length, a marshal payload of that
length (a dict of the fields ``framing.PAYLOAD_FIELDS`` declares, checked on arrival: a payload
of another shape is answered with one "payload_error" record), then a stream of 32-byte keys.
The payload holds the program, the test INPUTS and the limits; expected outputs of stdin/stdout
and call-based tests never enter the sandbox.

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

The source is six modules: runners.py (the three test runners: stdin/stdout, call-based,
assert/LeetCode; and ``main``), codec.py, framing.py, control.py, lcb_runner.py (the lcb
profile's stdin/stdout and call-based tests, with LiveCodeBench's harness semantics) and
checker.py (mode "checker": a ground truth's checker program judging a sample's outputs, run in
a jail of its own, never in the program's). ``harness.py``, the one
file shipped into the jail, is generated from them (build.py).
"""


import _signal as signal  # the C module: `signal` would import enum (2.5 ms)
import builtins
import marshal
import os
import resource
import sys
import time

from .codec import DecodeError, Decoder, EncodeError, Encoder, decode_message, encode_message
from .control import (
    HARNESS_PATH,
    SIGPENDING_MAX,
    Watch,
    _limits_in_child,
    deny_in_process_hooks,
    kill_all,
    program_globals,
    program_settings,
    run_main_program,
    spawn,
)
from .framing import (
    ERR_TAIL,
    MsgReader,
    Reporter,
    json,
    payload_problem,
    read_exact,
    recv_msg,
    send_msg,
    write_all,
)
from .checker import run_checker
from .lcb_runner import run_lcb


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
            program_settings(cfg["int_digits"])
            run_main_program(code, st, prefix_code, cfg["exit_ok"])

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
        send_msg(4, {"fatal": f"program process start-up: {type(e).__name__}: {e}",
                     "phase": "exec"})
        os._exit(0)
    program_server(code, prefix_code, req, announce_prefix=True)


def program_server(code, prefix_code, req, announce_prefix=False):
    """Run the prefix and the program's module once, then answer requests. With
    ``announce_prefix`` the prefix's success is sent as the first message, before any code of
    the program's runs: the only "prefix failed" message the harness believes."""
    g = program_globals("solution")
    known = _load_prefix(prefix_code, g)
    if announce_prefix:
        send_msg(4, {"prefix": "ok"})
    names = _load_program(code, g)
    classes = {k: v for k, v in g.items() if isinstance(v, type)}
    handles = _Handles(g)
    send_msg(4, {"ready": True, "names": names, "known": known})
    while True:
        try:
            m = req.next_blocking()
        except BaseException:
            os._exit(0)
        if m is None:
            os._exit(0)
        # Each answer runs program code: whatever it raises is the answer, never the end of
        # this loop.
        try:
            if m.get("op") == "fn":  # call-based: Solution().f(*args) or f(*args)
                resp = _call_function(m, g, classes)
            else:
                resp = _object_op(m, classes, known, handles)
            send_msg(4, resp)
        except MemoryError:
            try:
                send_msg(4, {"exc": "MemoryError", "msg": "", "memory": True})
            except BaseException:
                os._exit(1)
        except BaseException as e:
            _send_exception(e)


def _load_prefix(prefix_code, g):
    """Run the prefix in ``g``; the names of its classes (the process ends, reporting why, if
    it fails)."""
    try:
        if prefix_code is not None:
            exec(prefix_code, g)
        return [k for k, v in g.items() if isinstance(v, type)]
    except BaseException as e:
        send_msg(4, {"fatal": f"import_prefix failed: {type(e).__name__}: {e}", "phase": "prefix"})
        os._exit(0)


def _load_program(code, g):
    """Run the program's module in ``g``; the names it defined or rebound (the process ends,
    reporting why, if it fails)."""
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
    return [
        k
        for k, v in list(g.items())
        if not k.startswith("__") and (k not in before or before[k] is not v)
    ]


class _Handles:
    """The program's objects the evaluator holds handles to: numbered as they are sent, or a
    global by its name ("g:NAME")."""

    def __init__(self, g):
        self.g = g
        self.objs = {}

    def add(self, obj):
        """A new handle to ``obj``."""
        self.objs[len(self.objs) + 1] = obj
        return len(self.objs)

    def resolve(self, h):
        """The object behind handle ``h`` (an evaluator's message: may be anything)."""
        if isinstance(h, str) and h.startswith("g:"):
            name = h[2:]
            if name not in self.g:
                raise NameError(f"name {name!r} is not defined")
            return self.g[name]
        if h in self.objs:
            return self.objs[h]
        raise LookupError("stale program handle")


def _call_function(m, g, classes):
    """A call-based test's call: ``Solution().NAME(*args)`` or ``NAME(*args)``, its result
    encoded as data."""
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
    return encode_message(result, (), None)


def _object_op(m, classes, known, handles):
    """The evaluator's request on a program object (a global, a call, an attribute, an item,
    len, iteration): the result encoded as data, the program's other objects as handles."""
    op = m.get("op")
    after = None
    dec, (args, kwargs) = decode_message(
        m.get("args", {"v": [[], {"$": "dict", "v": []}], "objs": []}),
        classes,
        lambda i, t: handles.resolve(i),
    )
    target = handles.resolve(m.get("h"))
    if op == "global":
        result = target
    elif op == "call":
        result = target(*args, **kwargs)
        if (
            any(isinstance(a, (list, dict, set)) for a in list(args) + list(kwargs.values()))
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
    return _encode_answer(result, after, known, handles)


def _encode_answer(result, after, known, handles):
    """A result as data; ``after``: a call's arguments as the call left them (in-place
    changes), its argument objects first in the object table."""
    enc = Encoder(known, handles.add, seed=after[2] if after else ())
    resp = {"v": enc.value(result)}
    if after is not None:
        resp["after"] = [enc.value(a) for a in after[0]]
        resp["kwafter"] = {k: enc.value(a) for k, a in after[1].items()}
        resp["seeded"] = len(after[2])
    resp["objs"] = enc.finish()
    return resp


def _send_exception(e):
    """Answer with the program's exception (its name and text: the program's, so cut short and
    guarded); the process ends if even that fails."""
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
    program_settings(cfg["int_digits"])
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
                        "prefix": cfg["prefix"],
                        "int_digits": cfg["int_digits"],
                        "sys_path": cfg["sys_path"],
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


def _text(v, n=500):
    """Program data as a short text for a record: a string's first ``n`` characters, anything
    else its type's name (``str`` of a 1,000-deep list could raise here, in the harness)."""
    return v[:n] if type(v) is str else f"<{type(v).__name__}>"


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
                    detail=_text(ready["fatal"]),
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
                    "detail": f"{_text(resp['exc'], 100)}: {_text(resp.get('msg', ''))}",
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
    fd 5 = results to the harness. Never returns: the process ends with ``os._exit``."""
    sys.set_int_max_str_digits(0) if hasattr(sys, "set_int_max_str_digits") else None
    _limits_in_child(cfg, cfg["_budget"] + 1)
    ev = _Evaluation(cfg, units, resume_after)
    remote_ref = _remote_ref_class(ev)
    judge = _judge_class(ev)
    _run_prefix(ev, prefix_code)
    ev.ns["__judge__"] = judge
    _bind_program_names(ev, names, remote_ref)
    ev.refresh_classes()
    if units["kind"] == "asserts":
        _run_asserts(ev, judge)
    else:
        _run_leetcode(ev)
    ev.report({"t": "end"})
    os._exit(0)


class _Evaluation:
    """The evaluator's state: the test namespace, the program's classes known here, where the
    evaluation is (the test begun, skipping to resume), and the pipes to the program and to
    the harness."""

    def __init__(self, cfg, units, resume_after):
        self.cfg = cfg
        self.units = units
        self.resume_after = resume_after
        self.reader = MsgReader(4)
        self.tt = float(cfg["test_timeout"])
        self.deadline = time.monotonic() + self.tt
        self.skipping = resume_after is not None
        self.current = None  # the last test begun
        self.open = False  # inside that test (begun, not yet decided)
        self.calls = 0  # requests sent to the program
        self.ns = {"__name__": "__judge_ns__", "__builtins__": builtins}
        self.classes = {}

    def report(self, obj):
        send_msg(5, obj)

    def refresh_classes(self):
        self.classes.clear()
        for k, v in self.ns.items():
            if isinstance(v, type) and getattr(v, "__module__", None) == "__judge_ns__":
                self.classes[k] = v

    def decided(self):
        """A test was decided: the next one gets its own time."""
        self.open = False
        self.deadline = time.monotonic() + self.tt

    def rpc(self, msg):
        """One request to the program's process and its answer; the program's exceptions are
        re-raised here as builtin exceptions (or RemoteError), its death as ProgramGone."""
        if self.skipping:
            return Skipped()
        self.calls += 1
        try:
            send_msg(3, msg)
        except OSError:
            raise ProgramGone("died")
        try:
            m = recv_msg(self.reader, self.deadline)
        except DecodeError as e:
            raise ProgramGone(("garbage", str(e)))
        if m == "timeout":
            raise ProgramGone("timeout")
        if m == "eof":
            raise ProgramGone("died")
        if "fatal" in m:
            raise ProgramGone(("fatal", m["fatal"], bool(m.get("memory")), m.get("phase")))
        if "exc" in m:
            _raise_program_exception(m)
        return m

    def blamed(self):
        """The test a failure outside any assert belongs to: the one begun and not decided,
        else the next one (code between two asserts prepares the second)."""
        cur = self.current
        if self.open or self.units["kind"] == "asserts":
            return cur
        return 0 if cur is None else cur + 1

    def on_gone(self, e):
        why = e.why
        self.report({"t": "gone", "id": self.blamed(),
                     "why": why if isinstance(why, str) else list(why)})
        os._exit(0)


def _raise_program_exception(m):
    """The program's function raised: the same builtin exception here (so ``pytest.raises``-
    style test code sees it), anything else as RemoteError."""
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


def _exc_text(e):
    try:
        return f"{type(e).__name__}: {e}"[:500]
    except BaseException:
        return type(e).__name__


def _remote_ref_class(ev):
    """The class of handles to the program's objects: calls, attributes, items, len and
    iteration go to the program's process as data; the truth value is not data."""

    class RemoteRef:
        __slots__ = ("_h", "_t")

        def __init__(self, h, t):
            object.__setattr__(self, "_h", h)
            object.__setattr__(self, "_t", t)

        def _do(self, op, args=(), kwargs=None, **extra):
            enc = Encoder(ev.classes.keys(), handle=_no_handle)
            payload = {"v": enc.value([list(args), dict(kwargs or {})])}
            payload["objs"] = enc.finish()
            seed = [o for _n, _a, o in enc.objs]
            msg = dict(op=op, h=self._h, args=payload, **extra)
            m = ev.rpc(msg)
            if isinstance(m, Skipped):
                return m
            # The argument objects come back first in the table (updated in place) only when
            # the program says it seeded its table with them.
            dec = Decoder(ev.classes, RemoteRef,
                          seed=seed if m.get("seeded") == len(seed) else ())
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

    return RemoteRef


def _judge_class(ev):
    """``__judge__`` of the rewritten asserts (verifier/data/ground_truth.py): begin a test, record
    its result or its error."""
    cfg = ev.cfg

    class Judge:
        Control = Control

        @staticmethod
        def begin(i):
            ev.current = i
            if ev.skipping:
                if i == ev.resume_after:
                    ev.skipping = False
                return False
            ev.open = True
            return True

        @staticmethod
        def result(i, ok):
            ev.decided()
            ev.report(
                {"t": "res", "id": i, "ok": bool(ok), "detail": "" if ok else "assertion failed"}
            )
            if not ok and cfg["stop_on_fail"]:
                raise StopEvaluation()

        @staticmethod
        def error(i, exc):
            ev.decided()
            ev.report({"t": "res", "id": i, "ok": False, "error": True, "detail": _exc_text(exc)})
            if cfg["stop_on_fail"]:
                raise StopEvaluation()

    return Judge


def _run_prefix(ev, prefix_code):
    try:
        if prefix_code is not None:
            exec(prefix_code, ev.ns)
    except BaseException as e:
        ev.report(
            {
                "t": "setup_error",
                "detail": f"import_prefix failed in the judge: {type(e).__name__}: {e}",
            }
        )
        os._exit(0)


def _bind_program_names(ev, names, remote_ref):
    # The program's names: what its module defined or rebound after the prefix ran. They take
    # the place of the prefix's names of the same spelling (a program's own ``add`` beside a
    # preamble's ``from operator import *``), as in one file where the program comes after the
    # prefix; builtins stay the evaluator's own (a program cannot rig ``sorted`` or ``max``).
    for n in names:
        if (type(n) is str and n.isidentifier() and not n.startswith("__")
                and not hasattr(builtins, n)):
            ev.ns[n] = remote_ref("g:" + n, n)


def _run_asserts(ev, judge):
    """``assert_case``: each case on its own; resuming just skips the cases already done."""
    ev.skipping = False
    for k, src in enumerate(ev.units["cases"]):
        if ev.resume_after is not None and k <= ev.resume_after:
            continue
        ev.current = k
        ev.open = True
        try:
            exec(compile(src, f"<assert {k}>", "exec"), ev.ns)
        except StopEvaluation:
            break
        except ProgramGone as e:
            ev.on_gone(e)
        except BaseException as e:
            try:
                judge.error(k, e)
            except StopEvaluation:
                break


def _run_leetcode(ev):
    """LeetCode-style: load ``test_code``, then run its ``check(candidate)`` (or its top-level
    asserts) against the program's entry point."""
    cfg, units = ev.cfg, ev.units
    try:
        exec(compile(units["test_code"], "<test_code>", "exec"), ev.ns)
        ev.refresh_classes()
    except ProgramGone as e:
        ev.on_gone(e)
    except BaseException as e:
        text = _exc_text(e)
        if ev.calls:
            # The test code called the program while loading: the program's failure.
            ev.report({"t": "res", "id": 0, "ok": False, "error": True, "detail": text})
            ev.report({"t": "end"})
        else:
            ev.report({"t": "setup_error", "detail": f"test_code failed to load: {text}"})
        os._exit(0)
    ev.skipping = False
    try:
        candidate = eval(compile(units["entry_point"], "<entry_point>", "eval"), ev.ns)
        ev.ns["__judge_candidate__"] = candidate
        ev.skipping = ev.resume_after is not None
        exec(compile(units["call"], "<check>", "exec"), ev.ns)
    except StopEvaluation:
        pass
    except ProgramGone as e:
        ev.on_gone(e)
    except BaseException as e:
        # An exception outside any assert (in setup code between asserts): the next
        # assert fails with it; with run-all, evaluation restarts after that assert.
        if not ev.skipping:
            nxt = ev.blamed()
            if nxt < int(cfg["n_units"]):
                ev.report({"t": "res", "id": nxt, "ok": False, "error": True,
                           "detail": _exc_text(e)})
                if not cfg["stop_on_fail"] and nxt + 1 < int(cfg["n_units"]):
                    ev.report({"t": "restart", "after": nxt})
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


def run_assert_tests(cfg, code, prefix_code, rep):
    """Assert and LeetCode-style tests, in rounds: each round a fresh program process and an
    evaluator; a round the program's failure ended is followed by one that resumes after the
    failed test."""
    run = _AssertRun(cfg, rep)
    while True:
        if time.monotonic() > cfg["_deadline"]:
            rep.emit(
                {
                    "type": "test",
                    "i": run.next_id(),
                    "status": "timeout",
                    "detail": "item time limit",
                }
            )
            return
        if not _assert_round(run, code, prefix_code):
            return


class _AssertRun:
    """What the rounds of one sample's assert tests share: the tests recorded, the failures
    relayed, and the test the next round resumes after."""

    def __init__(self, cfg, rep):
        self.cfg = cfg
        self.rep = rep
        self.resume_after = None
        self.recorded = set()
        # An assert in a loop reports every execution: relay at most a pass and a failure per
        # assert (the judge's key budget is two records per test).
        self.relayed_fail = set()

    def next_id(self):
        """The first test not recorded after the one resumed after."""
        return _next_id(self.recorded, self.resume_after)


def _assert_round(run, code, prefix_code):
    """One round: start the program's process, then relay an evaluator's results until the
    round ends. True when a next round follows (resuming after a test the program failed)."""
    cfg = run.cfg
    prog = Program(cfg, code, prefix_code, fresh=True)
    deadline = min(time.monotonic() + float(cfg["test_timeout"]), cfg["_deadline"])
    stage, ready = _program_start(prog, deadline)
    if stage == "setup":
        _setup_failed(run, prog, ready)
        return False
    if stage == "load":
        return _record_failure(run, prog, _load_failure(cfg, prog, ready), run.next_id(), False)
    started = _start_evaluator(run, prog, prefix_code, ready)
    if started is None:
        return False
    ev_pid, res_r = started
    kind, info = _relay_results(run, prog, res_r)
    # Before everything is killed below: the record says how the program's process ended.
    rec = _round_failure(cfg, prog, kind, info)
    _stop_round(prog, ev_pid, res_r)
    return _after_round(run, prog, kind, info, rec)


def _stop_round(prog, ev_pid, res_r):
    """Kill the round's processes (the program's, the evaluator) and close their pipes."""
    kill_all([prog.pid, ev_pid])
    prog.watch.reap(True)
    prog.watch.drain()
    prog.close()
    os.close(res_r)


def _after_round(run, prog, kind, info, rec):
    """Where a round that ended ``kind`` leaves the sample: True when a next round follows
    (the failure ``rec`` emitted, or the evaluator's restart)."""
    if kind == "done":
        return False
    if kind == "restart":
        run.resume_after = int(info["after"])
        return True
    i = info.get("id") if kind == "gone" else None
    if i is None:
        i = run.next_id()
    return _record_failure(run, prog, rec, i, kind in ("item_timeout", "evaluator_died"))


def _program_start(prog, deadline):
    """Wait for the program process's start-up: ("setup", its first message) when that says the
    process could not start or the ground truth's prefix failed, ("ready", its ready message),
    or ("load", the message or how it ended) when its module did not load."""
    # The first message is sent before any code of the program's runs (program_main): only
    # it can say that the process could not start or that the ground truth's prefix failed.
    ready = _wait_msg(prog, deadline)
    if isinstance(ready, dict) and ready.get("phase") in ("exec", "prefix"):
        return "setup", ready
    if isinstance(ready, dict) and ready.get("prefix") == "ok":
        ready = _wait_msg(prog, deadline)
    if not isinstance(ready, dict) or ready.get("fatal") or not ready.get("ready"):
        return "load", ready
    return "ready", ready


def _setup_failed(run, prog, first):
    """End the sample: the program's process could not start, or the prefix failed in it."""
    _program_failure(prog, run.cfg, "exited", run.cfg["_budget"] + 1)
    prog.close()
    kind = "setup_error" if first["phase"] == "prefix" else "harness_error"
    run.rep.emit({"type": kind, "detail": _text(first.get("fatal"))})


def _load_failure(cfg, prog, ready):
    """The record of a program whose module failed to load (its processes stopped)."""
    if isinstance(ready, dict):
        rec = _program_failure(prog, cfg, "exited", cfg["_budget"] + 1)
        # A program whose module-level code fails before any test can call it is
        # LiveCodeBench's "compilation error" (the judge reports COMPILE_ERROR).
        # (Whatever it claims, e.g. "phase": "prefix": that can only be the program.)
        rec.update(
            status="memory" if ready.get("memory") is True else "load_error",
            detail=_text(ready.get("fatal") or "the program's process sent no ready message"),
        )
    else:
        rec = _program_failure(prog, cfg, ready, cfg["_budget"] + 1)
    prog.close()
    return rec


def _start_evaluator(run, prog, prefix_code, ready):
    """Fork the evaluator on the program process's pipes: (its pid, the read end of its
    results), or None when it could not start (the program's failure, emitted here)."""
    cfg = run.cfg
    names = ready.get("names")
    names = names if isinstance(names, list) else []
    try:
        res_r, res_w = os.pipe()
        ev_pid = spawn(
            {0: None, 1: None, 2: 2, 3: prog.req_w, 4: prog.resp_r, 5: res_w},
            lambda after=run.resume_after, names=names: evaluator(
                cfg, prefix_code, cfg["units"], after, names
            ),
        )
    except OSError as e:
        # The program's process exhausted the sandbox (processes, descriptors) before the
        # evaluator could start: its failure.
        rec = _program_failure(prog, cfg, "exited", cfg["_budget"] + 1)
        rec.update(type="test", i=run.next_id(), status="error")
        rec["detail"] = f"the program exhausted the sandbox: {e}"
        run.rep.emit(rec, [b"", b""])
        prog.close()
        return None
    os.close(res_w)
    return ev_pid, res_r


def _relay_results(run, prog, res_r):
    """Relay the evaluator's results to the judge while watching the program's process, until
    the round ends: returns (how it ended, the evaluator's last message or None)."""
    reader = MsgReader(res_r)
    os.set_blocking(res_r, False)
    while True:
        # The whole item's deadline: each test's own is the evaluator's to keep.
        how = prog.watch.run(run.cfg["_deadline"], others=(res_r,))
        if how == "output_limit":
            prog.watch.kill()
            return "output_limit", None
        if how == "timeout":
            return "item_timeout", None
        if how == "exited":
            # The program process died; the evaluator will notice and report "gone".
            continue
        reader.feed()
        while True:
            m = reader.take()
            if m is None:
                break
            end = _relay_message(run, m)
            if end is not None:
                return end
        if reader.eof:
            return "evaluator_died", None


def _relay_message(run, m):
    """Act on one message of the evaluator: a result is relayed; a message that ends the round
    is returned as (how it ended, the message or None)."""
    t = m.get("t")
    if t == "res":
        _relay_result(run, m)
    elif t == "setup_error":
        run.rep.emit({"type": "setup_error", "detail": m.get("detail", "")})
        return "done", None
    elif t == "gone":
        return "gone", m
    elif t == "end":
        return "done", None
    elif t == "restart":
        return "restart", m
    return None


def _relay_result(run, m):
    """Emit one test's result, unless that test's pass (or failure) was relayed already."""
    i = m.get("id")
    if not isinstance(i, int) or not 0 <= i < int(run.cfg["n_units"]):
        return
    if (m["ok"] and i in run.recorded) or (not m["ok"] and i in run.relayed_fail):
        return
    run.recorded.add(i)
    if not m["ok"]:
        run.relayed_fail.add(i)
    status = "exited" if m["ok"] else ("error" if m.get("error") else "failed")
    run.rep.emit({"type": "test", "i": i, "status": status, "detail": m.get("detail", "")}, [])


def _round_failure(cfg, prog, kind, info):
    """The record of the program's failure that ended a round (its processes stopped), None
    for a round that ended without one ("done", "restart")."""
    cpu_limit = cfg["_budget"] + 1
    if kind == "gone":
        return _gone_failure(cfg, prog, info.get("why"))
    if kind in ("output_limit", "item_timeout"):
        return _program_failure(
            prog, cfg, "output_limit" if kind == "output_limit" else "timeout", cpu_limit
        )
    if kind == "evaluator_died":
        return {"status": "error", "detail": "the evaluator process was killed"}
    return None


def _gone_failure(cfg, prog, why):
    """The record of a program the evaluator reported gone, ``why`` as it reported it (its
    text is the program's: cut short)."""
    rec = _program_failure(
        prog, cfg, "timeout" if why == "timeout" else "exited", cfg["_budget"] + 1
    )
    if isinstance(why, list) and why and why[0] == "memory":
        rec["status"] = "memory"
    elif isinstance(why, list) and why and why[0] == "fatal":
        rec["status"] = "memory" if why[2] else "error"
        rec["detail"] = _text(why[1])
    elif isinstance(why, list) and why and why[0] == "garbage":
        rec["status"] = "error"
        rec["detail"] = f"the program wrote malformed data on the judge's channel: {why[1]}"
    elif rec["status"] == "died":
        rec["detail"] = "the program process died"
    return rec


def _record_failure(run, prog, rec, i, last):
    """Emit the program's failure of test ``i``; True when a next round resumes after it."""
    rec.update(type="test", i=i)
    run.rep.emit(rec, [b"", bytes(prog.watch.err[-ERR_TAIL:])])
    run.recorded.add(i)
    if last or run.cfg["stop_on_fail"] or i + 1 >= int(run.cfg["n_units"]):
        return False
    run.resume_after = i
    return True


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


PREPARED = False  # prepare_process() ran (in this process, or in the zygote it was forked from)


def prepare_process():
    """Once per harness process, before its first test: the signal dispositions that its
    tests' processes start from, which ``spawn`` then leaves alone but for SIGINT (every signal
    a Python program finds at its default, whatever this process inherited; SIGINT ignored
    here, and SIGPIPE as in any Python program), and ``exit``/``quit`` as ``site`` defines
    them. The forkserver's zygote runs it once for all its runs (sandbox/zygote.py): set in
    each test's process, it cost every test 7 system calls and their copy-on-write faults."""
    global PREPARED
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, _Quitter(name))
    PREPARED = True


def main():
    if not PREPARED:
        prepare_process()
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
    problem = payload_problem(cfg)
    if problem:  # the judge and this harness disagree on the payload: a bug of the verifier's
        rep.emit({"type": "payload_error", "detail": problem})
        return
    cfg["_budget"] = float(cfg["budget_s"])
    if cfg["sys_path"]:
        sys.path.append(cfg["sys_path"])  # the profile's extra packages (numpy), read-only
    cfg["_deadline"] = start + cfg["_budget"]
    if cfg["lcb_rules"] and cfg["mode"] in ("stdio", "call"):
        # LiveCodeBench's harness semantics, or Skywork-OR1's copy of them (lcb_runner.py,
        # cfg["lcb_rules"] says whose): the program's text is rewritten
        # and compiled there, as LiveCodeBench does, so it is not compiled as it is here.
        run_lcb(cfg, rep)
        kill_all()
        rep.emit({"type": "done"})
        return
    mode = cfg["mode"]
    try:
        code = compile(cfg["source"], "checker.py" if mode == "checker" else "solution.py",
                       "exec")
        prefix_code = (
            compile(cfg["prefix"], "import_prefix.py", "exec") if cfg["prefix"] else None
        )
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
        rep.emit({"type": "syntax", "detail": f"{type(e).__name__}: {e}"[:500]})
        rep.emit({"type": "done"})
        return
    if mode == "stdio":
        run_stdio(cfg, code, prefix_code, rep)
    elif mode == "checker":
        run_checker(cfg, code, rep)
    elif mode == "call":
        run_call(cfg, code, prefix_code, rep)
    elif mode == "check":
        run_assert_tests(cfg, code, prefix_code, rep)
    kill_all()
    rep.emit({"type": "done"})


if __name__ == "__main__":
    main()
    os._exit(0)  # skip interpreter teardown (a few ms)
