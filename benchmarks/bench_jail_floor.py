"""The floor of a fresh jail per sample, measured: what any forkserver design could reach (issue 29).

Issue 29 asks code verdicts at twice the naive run's throughput (a fresh unsandboxed ``python3``
per test) while every sample keeps a world of its own. On a CPU-bound machine the throughput
ratio is the ratio of whole-machine CPU per sample, so this compares, per sample of the
benchmark's workload (``bench_code.make_samples``: 5 stdin/stdout tests, half of them wrong):

- ``naive``: one ``python3 -S prog.py`` per test, stopping at the first failure (bench_code's
  baseline, run one sample at a time);
- ``floor``: the least a per-sample jail can do, from a warm process, in this process's own code:
  fork; the child unshares new user, mount, PID, network, IPC, UTS and cgroup namespaces; this
  process writes its uid/gid maps (an outside uid of its own, as the pool gives); the child
  forks the namespace's PID 1, which makes its mounts private, mounts a fresh tmpfs root with
  ``/usr``, ``/lib``, ``/lib64`` and ``/bin`` bound read-only into it, chroots there and runs each
  test in a forked child (the program compiled once, stdin and stdout on pipes), comparing
  outputs. It leaves out what nsjail's policy also does (seccomp, cgroups, rlimits, the
  harness's framing and signing, ``pivot_root``, dropping to uid 65534), so every real design
  costs more than this;
- ``floor+cg``: the floor, each jail also in a memory, pids and cpu cgroup (v1) of its own with
  the limits nsjail writes, made before and removed after the sample, as nsjail does;
- ``1proc+cg``: ``floor+cg`` with the sample's tests run one after another in the jail's PID 1
  (stdin and stdout in memory), LiveCodeBench's own judge's model, where a test can see the
  state earlier tests left: what a change of the judging rules, not of the sandbox, would buy;
- ``forked``: the floor's processes without its namespaces, mounts and chroot (a fork per
  sample, a fork per test): the floor minus this is the kernel's work for the isolation;
- ``nsjail``: a cold jail per sample through the judge (``score_code`` on ``NsjailSandbox``
  with no pre-started jails), what the service runs, without the gRPC server.

CPU is the whole machine's (``/proc/stat``: every process and the kernel's own threads, such as
the network namespace's deferred cleanup, which no process is charged for), so run it on an
otherwise idle machine; samples run one at a time; the modes alternate for ``--rounds`` rounds of
``--n`` samples and the medians are printed. Root only (it creates namespaces and mounts).

    .venv/bin/python benchmarks/bench_jail_floor.py [--n 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_code import _lines, make_samples, naive_sample  # noqa: E402
from common import machine_cpu_s  # noqa: E402

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
ALL_NS = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
          | CLONE_NEWCGROUP)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
OUTSIDE_UID = 1900500000
"""Outside the uid pool's default range (sandbox/uidpool.py), owned by no file."""
BINDS = ("/usr", "/lib", "/lib64", "/bin")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None), f"mount {dst}")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _run_test(code, stdin_text: str) -> bytes:
    """In the jail's PID 1: fork one test's process, feed its stdin, return its stdout."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            for fd in (in_r, in_w, out_r, out_w):
                os.close(fd)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            exec(code, {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(in_r)
    os.close(out_w)
    os.write(in_w, stdin_text.encode())
    os.close(in_w)
    out = _read_all(out_r)
    os.close(out_r)
    _, status = os.waitpid(pid, 0)
    return out if os.waitstatus_to_exitcode(status) == 0 else None


def _run_test_here(code, stdin_text: str) -> bytes | None:
    """One test in this very process (LiveCodeBench's own judge's model: a sample's tests share
    one process), stdin and stdout swapped for in-memory files."""
    saved = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = io.StringIO(stdin_text), io.StringIO()
    try:
        exec(code, {"__name__": "__main__"})
        return sys.stdout.getvalue().encode()
    except BaseException:  # noqa: BLE001 - the program's failure
        return None
    finally:
        sys.stdin, sys.stdout = saved


def _jail_pid1(sample: dict, root: str | None, one_process: bool = False) -> int:
    if root is not None:
        _enter_root(root)
    code = compile(sample["program"], "<program>", "exec")
    run = _run_test_here if one_process else _run_test
    for x, y in zip(sample["ground_truth"]["inputs"], sample["ground_truth"]["outputs"]):
        out = run(code, x)
        if out is None or _lines(out.decode()) != _lines(y):
            return 1
    return 0


def _enter_root(root: str) -> None:
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("none", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096")
    for d in BINDS:
        if os.path.exists(d):
            os.mkdir(root + d)
            _mount(d, root + d, None, MS_BIND | MS_REC)
            _mount(d, root + d, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/")


def forked(sample: dict) -> bool:
    """The floor's processes without its namespaces and mounts: a fork per sample, a fork per
    test (what the floor's jail costs beyond them is the kernel's work for the isolation)."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = _jail_pid1(sample, None)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


CGROUPS_V1 = {  # what nsjail's cgroup v1 options write for a jail (sandbox/cgroups.py)
    "memory": {"memory.limit_in_bytes": str(576 << 20), "memory.memsw.limit_in_bytes":
               str(576 << 20)},
    "pids": {"pids.max": "32"},
    "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"},
}


def _cgroups_enter(pid: int, n: int) -> list[str]:
    """Make a memory, pids and cpu cgroup (v1) for one jail, set its limits, put ``pid`` in."""
    made = []
    for controller, files in CGROUPS_V1.items():
        path = f"/sys/fs/cgroup/{controller}/jail-floor-bench/jail-{os.getpid()}-{n}"
        os.makedirs(path)
        made.append(path)
        for name, value in files.items():
            if os.path.exists(f"{path}/{name}"):
                Path(f"{path}/{name}").write_text(value)
        Path(f"{path}/cgroup.procs").write_text(str(pid))
    return made


_n_jails = 0


def floor(sample: dict, root: str, cgroups: bool = False, one_process: bool = False) -> bool:
    """One sample in fresh namespaces forked from this (warm) process; see the docstring.
    ``cgroups``: also in a memory, pids and cpu cgroup of its own, made and removed as nsjail
    does; ``one_process``: its tests run one after another in the jail's PID 1."""
    global _n_jails
    _n_jails += 1
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = 2
        try:
            os.close(go_w)
            os.close(ready_r)
            _check(_libc.unshare(ALL_NS), "unshare")
            os.write(ready_w, b"u")
            os.read(go_r, 1)  # the maps are written
            os.setgid(0)  # become the mapped ids (the outside uid): files it makes need them
            os.setuid(0)
            inner = os.fork()  # PID 1 of the new PID namespace
            if inner == 0:
                code = 2
                try:
                    code = _jail_pid1(sample, root, one_process)
                except BaseException as e:  # noqa: BLE001 - said, then the jail's exit code
                    print(f"floor jail: {e!r}", file=sys.stderr, flush=True)
                finally:
                    os._exit(code)
            _, status = os.waitpid(inner, 0)
            rc = os.waitstatus_to_exitcode(status)
        except BaseException as e:  # noqa: BLE001 - said, then the jail's exit code
            print(f"floor jail: {e!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(rc)
    os.close(go_r)
    os.close(ready_w)
    if os.read(ready_r, 1) != b"u":
        raise RuntimeError("the jail's first process died before unsharing")
    made = _cgroups_enter(pid, _n_jails) if cgroups else []
    Path(f"/proc/{pid}/setgroups").write_text("deny")
    Path(f"/proc/{pid}/uid_map").write_text(f"0 {OUTSIDE_UID} 1")
    Path(f"/proc/{pid}/gid_map").write_text(f"0 {OUTSIDE_UID} 1")
    os.write(go_w, b"g")
    os.close(go_w)
    os.close(ready_r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    for path in made:
        os.rmdir(path)
    if code not in (0, 1):
        raise RuntimeError(f"floor jail failed (exit {code})")
    return code == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="samples per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_jail_floor: needs root (namespaces, mounts, uid maps)")

    from sandbox.nsjail import NsjailSandbox
    from verifier.code_score import score_code
    from verifier.items import Limits

    samples = make_samples(args.n)
    work = tempfile.TemporaryDirectory(prefix="jail-floor-")
    tmp = Path(work.name)
    root = str(tmp / "root")  # the jails' tmpfs root is mounted here, in their mount namespace
    os.mkdir(root)
    os.chmod(work.name, 0o755)
    for controller in CGROUPS_V1:
        os.makedirs(f"/sys/fs/cgroup/{controller}/jail-floor-bench", exist_ok=True)
    want = [naive_sample(s, tmp) for s in samples[:20]]
    sb = NsjailSandbox(warm=0)
    sb.self_test()

    def nsjail(s: dict) -> bool:
        return score_code(s["response"], s["ground_truth"], Limits(), sb).status.name == "CORRECT"

    modes = {"naive": lambda s: naive_sample(s, tmp), "forked": forked,
             "floor": lambda s: floor(s, root), "floor+cg": lambda s: floor(s, root, True),
             "1proc+cg": lambda s: floor(s, root, True, one_process=True), "nsjail": nsjail}
    for name, fn in modes.items():  # the same verdicts, and every path warm once
        got = [fn(s) for s in samples[:20]]
        if got != want:
            sys.exit(f"bench_jail_floor: {name} judged {got} where the naive run judged {want}")
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for r in range(args.rounds):
            for name, fn in modes.items():
                c0, t0 = machine_cpu_s(), time.perf_counter()
                for s in samples:
                    fn(s)
                cpu[name].append((machine_cpu_s() - c0) / len(samples) * 1e3)
                wall[name].append((time.perf_counter() - t0) / len(samples) * 1e3)
            print(f"round {r + 1}: " + ", ".join(
                f"{m} {cpu[m][-1]:.1f} ms CPU / {wall[m][-1]:.1f} ms wall" for m in modes),
                flush=True)
    finally:
        sb.close()
        work.cleanup()
        for controller in CGROUPS_V1:
            os.rmdir(f"/sys/fs/cgroup/{controller}/jail-floor-bench")
    print(f"per sample ({args.n} samples of 5 stdin/stdout tests, half wrong; one at a time; "
          f"median of {args.rounds} rounds; CPU of the whole machine, load average "
          f"{os.getloadavg()[0]:.1f} at the end):")
    for m in modes:
        print(f"  {m:8s} CPU {median(cpu[m]):6.2f} ms  wall {median(wall[m]):6.2f} ms  "
              f"(CPU by round: " + ", ".join(f"{x:.2f}" for x in cpu[m]) + ")")
    base = median(cpu["naive"])
    for m in ("forked", "floor", "floor+cg", "1proc+cg", "nsjail"):
        print(f"  throughput bound on a CPU-bound machine, {m} / naive = naive CPU / {m} CPU: "
              f"{base / median(cpu[m]):.2f}")


if __name__ == "__main__":
    main()
