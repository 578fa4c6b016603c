"""The checker runner: a ground truth's checker program (testlib's convention) judging the outputs
of one sample, in a jail of its own (verifier/scoring/checker_jail.py starts it; never in the jail of
the program it judges).

Mode "checker" of the payload: ``source`` is the checker, ``tests`` a list of
``[input, output, answer, selfcheck]`` (bytes, bytes, bytes, bool): the test's input, the
program's stdout (the only thing of the program's that reaches this jail), the expected output.
For each test, in order, the three are written to fresh files and the checker runs as
``checker.py INPUT_FILE OUTPUT_FILE ANSWER_FILE`` (``sys.argv``; as ``__main__``), in a child
forked from this harness under the test's limits, stdin /dev/null. One record per test says
how it ended (``verdict``):

- "accepted" (exit 0), "wrong" (exit 1), "presentation" (exit 2), "failed" (exit 3): testlib's
  exit codes (testlib.h: ``_ok`` 0, ``_wa`` 1, ``_pe`` 2, ``_fail`` 3; MikeMirzayanov/testlib),
  by ``sys.exit``/``os._exit`` or the end of the module (0);
- "crashed": anything else (an uncaught exception or MemoryError, a signal, the time limit,
  more than ``output_bytes`` printed, another exit code): no verdict of the checker's.

After the first "crashed" test whose ``selfcheck`` is set, the checker runs once more on that
test with the expected answer as the output file, and a "selfcheck" record says how that
ended: the judge counts the crash as the program's wrong answer only if the checker accepts its
own answer. With ``stop_on_fail`` the run stops at the first test not accepted. When the
sample's time for checks (``budget_s``) is spent, the test at hand is "crashed" (status
"timeout") and its self-check, if asked for, still gets its own time limit.
"""

import os
import sys
import time

from .control import _limits_in_child, kill_all, run_main_program, spawn, Watch
from .framing import ERR_TAIL, write_all

# testlib.h's exit codes (MikeMirzayanov/testlib): _ok 0, _wa 1, _pe 2, _fail 3.
CHECKER_EXITS = {0: "accepted", 1: "wrong", 2: "presentation", 3: "failed"}
CHECKER_FILES = ("input.txt", "output.txt", "answer.txt")


def _write_case(i, parts):
    """The three files of test ``i`` in a new directory of the scratch (the working
    directory); their absolute paths. O_EXCL | O_NOFOLLOW: nothing an earlier run of the
    checker left behind (a link, a file) is written through."""
    d = os.path.abspath("judge-check-%d-%d" % (i, time.monotonic_ns()))
    os.mkdir(d, 0o700)
    paths = []
    for name, data in zip(CHECKER_FILES, parts):
        path = os.path.join(d, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        paths.append(path)
    return d, paths


def _remove_case(d):
    """Free the scratch space and inodes of a test's files (what else the checker wrote
    stays)."""
    for name in CHECKER_FILES:
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass
    try:
        os.rmdir(d)
    except OSError:  # the checker left something in it
        pass


def _check_once(cfg, code, i, parts, deadline):
    """Run the checker on one (input, output, answer); its record (without type and id) and
    its stdout and stderr tails."""
    tt = float(cfg["test_timeout"])
    try:
        d, paths = _write_case(i, parts)
    except OSError as e:  # the scratch is full (of what the checker wrote before): its crash
        return {"status": "error", "verdict": "crashed",
                "detail": "could not be given its files (%s)" % e}, []
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    st_r, st_w = os.pipe()

    def body():
        _limits_in_child(cfg, tt + 1)
        sys.argv = ["checker.py", *paths]
        run_main_program(code, 3)

    t0 = time.monotonic()
    pid = spawn({0: None, 1: out_w, 2: err_w, 3: st_w}, body)
    for fd in (out_w, err_w, st_w):
        os.close(fd)
    w = Watch(pid, out_r, err_r, st_r, int(cfg["output_bytes"]))
    how = w.run(min(t0 + tt, deadline))
    if how != "exited":
        w.kill()
    w.reap(True)
    kill_all([pid])
    w.drain()
    _remove_case(d)
    rec = w.describe(cfg, tt + 1, how)
    st = bytes(w.st)
    if rec["status"] != "exited" or b"E" in st or b"M" in st:
        rec["verdict"] = "crashed"
    else:
        rec["verdict"] = CHECKER_EXITS.get(rec["exit"], "crashed")
    rec["time"] = round(time.monotonic() - t0, 4)
    return rec, [bytes(w.out[-ERR_TAIL:]), bytes(w.err[-ERR_TAIL:])]


def run_checker(cfg, code, rep):
    deadline = cfg["_deadline"]
    tt = float(cfg["test_timeout"])
    selfchecked = False
    for i, case in enumerate(cfg["tests"]):
        inp, out, ans, selfcheck = case
        if time.monotonic() > deadline:
            rec, blobs = {"status": "timeout", "verdict": "crashed",
                          "detail": "the checker's time for this sample ran out"}, []
        else:
            rec, blobs = _check_once(cfg, code, i, (inp, out, ans), deadline)
        rec.update(type="test", i=i)
        rep.emit(rec, blobs)
        if rec["verdict"] == "crashed" and selfcheck and not selfchecked:
            # The checker's own answer as the output, under a time limit of its own (after
            # the budget of the checks: a checker that never ends is told apart from one
            # that a program's output made slow).
            selfchecked = True
            own, own_blobs = _check_once(cfg, code, i, (inp, ans, ans), time.monotonic() + tt)
            own.update(type="selfcheck", i=i)
            rep.emit(own, own_blobs)
        if rec["verdict"] != "accepted" and cfg["stop_on_fail"]:
            return
        if rec.get("status") == "timeout" and time.monotonic() > deadline:
            return
