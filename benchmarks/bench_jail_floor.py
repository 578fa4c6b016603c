"""What a fresh jail per sample costs, measured: what a forkserver design could reach (issue 29).

Issue 29 asks code verdicts at twice the naive run's throughput (a fresh unsandboxed ``python3``
per test) while every sample keeps a world of its own. On a CPU-bound machine the throughput
ratio is the ratio of whole-machine CPU per sample, so this compares, per sample of the
benchmark's workload (``bench_code.make_samples``: 5 stdin/stdout tests, half of them wrong):

- ``naive``: one ``python3 -S prog.py`` per test, stopping at the first failure (bench_code's
  baseline, run one sample at a time);
- ``floor``: a per-sample jail forked from this process, in this process's own code: fork; the
  child unshares new user, mount, PID, network, IPC, UTS and cgroup namespaces; this
  process writes its uid/gid maps (an outside uid of its own, as the pool gives); the child
  forks the namespace's PID 1, which makes its mounts private, mounts a fresh tmpfs root with
  ``/usr``, ``/lib``, ``/lib64`` and ``/bin`` bound read-only into it, chroots there and runs each
  test in a forked child (the program compiled once, stdin and stdout on pipes), comparing
  outputs. It leaves out what nsjail's policy also does (seccomp, cgroups, rlimits, the
  harness's framing and signing, ``pivot_root``, dropping to uid 65534). It is NOT a lower
  bound, though it was taken for one (docs/benchmarks.md "The cost of a jail per sample"): it forks this
  process (the benchmark with the verifier imported) for every jail and every test and builds
  the root per sample, and the ``zygote`` mode, which does all of that and more from a small
  process, costs less;
- ``floor+cg``: the floor, each jail also in a memory, pids and cpu cgroup (v1) of its own with
  the limits nsjail writes, made before and removed after the sample, as nsjail does;
- ``1proc+cg``: ``floor+cg`` with the sample's tests run one after another in the jail's PID 1
  (stdin and stdout in memory), LiveCodeBench's own judge's model, where a test can see the
  state earlier tests left: what a change of the judging rules, not of the sandbox, would buy;
- ``forked``: the floor's processes without its namespaces, mounts and chroot (a fork per
  sample, a fork per test): the floor minus this is the kernel's work for the isolation;
- ``zygote``: the forkserver design of issue 29, every step of nsjail's policy included: a small
  warm process (the jails' own ``python3 -I -S``, benchmarks/jail_floor_zygote.py) with a
  minimal read-only root made once forks each sample, which enters a memory, pids and cpu cgroup
  of its own, drops to its outside uid, unshares a user namespace (65534 inside) and the mount,
  PID, network, IPC, UTS and cgroup namespaces, mounts its scratch tmpfs, and forks its PID 1,
  which sets the rlimits, drops every capability and loads nsjail's own seccomp filter (read
  out of a running nsjail jail with ``PTRACE_SECCOMP_GET_FILTER``) before the tests run, a fork
  each: what a forkserver costs per sample before the harness's framing and the service;
- ``zygote+judge``: the same jails running the judge's own harness as their PID 1 (loaded once
  in the zygote, ``main()`` per sample) under ``score_code`` in this process: a forkserver with
  today's harness and judge, everything of a verdict but the gRPC service;
- ``nsjail``: a cold jail per sample through the judge (``score_code`` on ``NsjailSandbox``
  with no pre-started jails), what the service runs, without the gRPC server.

Before measuring, benchmarks/jail_probe.py runs in an nsjail jail and in a zygote jail, and the
script stops if the program sees any difference (ids, limits, mounts, environment, descriptors,
the errno of each denied syscall): the zygote stands for a forkserver only while its jails are
nsjail's.

CPU is the whole machine's (``/proc/stat``: every process and the kernel's own threads, such as
the network namespace's deferred cleanup, which no process is charged for), so run it on an
otherwise idle machine; samples run one at a time; the modes alternate for ``--rounds`` rounds of
``--n`` samples and the medians are printed. Root only (it creates namespaces and mounts).

    .venv/bin/python benchmarks/bench_jail_floor.py [--n 200] [--rounds 3] [--parallel]

``--parallel`` measures throughput instead, the way bench_code.py does: samples per second of
the naive run two at a time against two zygotes and two zygote+judge pairs, interleaved rounds.
``--split`` shows where a zygote+judge jail's CPU goes: the harness's own process against its
test processes (``getrusage`` in the jail), with their page faults.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_code import _lines, make_samples, naive_sample  # noqa: E402
from common import machine_cpu_s  # noqa: E402
from jail_floor_zygote import run_test  # noqa: E402

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
    run = _run_test_here if one_process else run_test
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


PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH, PTRACE_SECCOMP_GET_FILTER = 0x4206, 0x4207, 17, 0x420c


def nsjail_seccomp_filter(binary: str, config: str) -> bytes:
    """The classic BPF program nsjail compiles from the policy file's ``seccomp_string``s, read
    out of a jail it started (``PTRACE_SECCOMP_GET_FILTER``: root, a stopped tracee)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    jail = subprocess.Popen(
        [binary, "--config", config, "--user", f"65534:{OUTSIDE_UID}:1", "--group",
         f"65534:{OUTSIDE_UID}:1", "--time_limit", "30", "-m", "none:/tmp:tmpfs:size=1048576",
         "--really_quiet", "--", "/bin/sleep", "30"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:  # the jail's process: nsjail's child, once it runs sleep
            kids = Path(f"/proc/{jail.pid}/task/{jail.pid}/children").read_text().split()
            if kids and Path(f"/proc/{kids[0]}/exe").resolve().name == "sleep":
                pid = int(kids[0])
                break
            if time.monotonic() > deadline or jail.poll() is not None:
                raise RuntimeError("nsjail did not start its jail")
            time.sleep(0.01)
        _check(libc.ptrace(PTRACE_SEIZE, pid, None, None), "PTRACE_SEIZE")
        _check(libc.ptrace(PTRACE_INTERRUPT, pid, None, None), "PTRACE_INTERRUPT")
        os.waitpid(pid, 0x40000000)  # __WALL
        n = libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, None, None)
        if n <= 0 or libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(1), None) != -1:
            raise RuntimeError(f"expected one seccomp filter in the jail, found count {n}")
        buf = ctypes.create_string_buffer(8 * n)
        if libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, None, buf) != n:
            raise RuntimeError("PTRACE_SECCOMP_GET_FILTER failed")
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        return buf.raw
    finally:
        jail.kill()
        jail.wait()


TEST_LIMITS = {"memory_mb": 1024, "cpu_s": 10, "fsize_mb": 16, "nproc": 32, "scratch_mb": 64,
               "scratch_files": 4096}
"""The per-run limits of the ``zygote`` mode's jails (SandboxLimits' defaults)."""


class Zygote:
    """benchmarks/jail_floor_zygote.py running, one sample at a time. With ``harness`` (the
    judge's harness file) it is a sandbox for ``score_code`` (``ZygoteSandbox``), else it
    compares each test's output in the jail (``zygote`` mode)."""

    def __init__(self, python: str, root: str, bpf_path: str, uid: int = OUTSIDE_UID,
                 harness: str = "", split: bool = False, binds: tuple = ()) -> None:
        from sandbox.base import policy_environment
        from sandbox.forkserver import build_jailsys

        self.uid = uid
        cfg = {"root": root, "cgroup_root": "jail-floor-bench", "bpf": bpf_path,
               "harness": harness, "split": split, "binds": list(binds),
               "jailsys": build_jailsys(python, os.path.dirname(root))}
        self.proc = subprocess.Popen(
            [python, "-I", "-S", str(Path(__file__).with_name("jail_floor_zygote.py")),
             json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=policy_environment(),
            stderr=subprocess.PIPE if split else None)
        self._lines: dict[str, bytes] = {}

    def __call__(self, sample: dict) -> bool:
        line = self._lines.get(sample["id"])
        if line is None:
            line = self._lines[sample["id"]] = json.dumps(
                {"program": sample["program"], "ground_truth": sample["ground_truth"],
                 "uid": self.uid, "limits": TEST_LIMITS}).encode() + b"\n"
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        code = self.proc.stdout.readline().strip()
        if code not in (b"0", b"1"):
            raise RuntimeError(f"zygote jail failed (exit {code!r})")
        return code == b"0"

    def harness_run(self, stdin: bytes, limits: dict, wall_s: float,
                    argv: list[str] | None = None) -> tuple[int, bytes]:
        """The harness (or ``argv``, exec'd) in a fresh jail: its wait status and stdout."""
        head = {"uid": self.uid, "limits": limits, "wall_s": wall_s, "stdin": len(stdin)}
        if argv:
            head["exec"] = argv
        self.proc.stdin.write(json.dumps(head).encode() + b"\n" + stdin)
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return answer["status"], self.proc.stdout.read(answer["out"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


class ZygoteSandbox:
    """The Sandbox interface over a harness zygote, for ``score_code``: the judge's own harness
    run in the zygote's jails (``zygote+judge`` mode). It runs only the harness (the argv is
    checked), its stdout whole at the end (no streaming: the judge's hook is fed after)."""

    name = "zygote-bench"
    isolated = True
    cgroup_mode = "v1"

    def __init__(self, zygote: Zygote, python: str) -> None:
        self.zygote, self.python = zygote, python

    def run(self, argv, *, stdin=b"", files={}, limits=None, on_stdout=None):
        from sandbox.base import RunResult, SandboxLimits, ceil_s

        if argv[-1] != "judge_harness.py":  # the harness's compile-to-bytecode run: refused
            return RunResult("error", detail="the zygote runs only the harness")
        lim = limits or SandboxLimits()
        status, out = self.zygote.harness_run(stdin, {
            "memory_mb": lim.memory_mb, "cpu_s": ceil_s(lim.cpu_s), "fsize_mb": lim.file_size_mb,
            "nproc": lim.max_procs, "scratch_mb": lim.scratch_mb,
            "scratch_files": lim.scratch_files}, lim.wall_s)
        if status < 0:
            return RunResult("error", detail="the zygote's jail failed")
        if on_stdout is not None:
            on_stdout(out)
            out = b""
        if os.WIFSIGNALED(status):
            return RunResult("signal", signal=os.WTERMSIG(status), stdout=out)
        return RunResult("ok", exit_code=os.WEXITSTATUS(status), stdout=out)

    def self_test(self) -> None:
        pass

    def describe(self) -> str:
        return "the zygote of benchmarks/jail_floor_zygote.py"

    def close(self) -> None:
        pass


def _parallel(samples: list[dict], tmp: Path, candidates: dict, rounds: int) -> None:
    """Samples per second, two at a time: the naive run (bench_code's baseline) against each
    candidate, a pair of callables (each on its own zygote, with its own outside uid, as the
    pool gives), alternating for ``rounds`` rounds."""
    def rate(pair) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(lambda i: [pair[i](s) for s in samples[i::2]], (0, 1)))
        return len(samples) / (time.perf_counter() - t0)

    naive = (lambda s: naive_sample(s, tmp),) * 2
    ratios: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(rounds):
        base = rate(naive)
        line = f"round {r + 1}: naive {base:.1f} samples/s"
        for name, pair in candidates.items():
            got = rate(pair)
            ratios[name].append(got / base)
            line += f", {name} {got:.1f} ({got / base:.2f})"
        print(line, flush=True)
    for name, rs in ratios.items():
        print(f"two at a time, {len(samples)} samples: {name} / naive, median of {rounds} "
              f"rounds: {median(rs):.2f}")
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="samples per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", action="store_true",
                    help="throughput instead, two samples at a time: the naive run (2 at a time, "
                         "bench_code's baseline) against two zygotes, interleaved rounds")
    ap.add_argument("--split", action="store_true",
                    help="instead, where a zygote+judge jail's CPU goes: the harness's own process "
                         "(PID 1) against its test processes, with their page faults")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_jail_floor: needs root (namespaces, mounts, uid maps)")

    from sandbox.nsjail import NsjailSandbox
    from verifier.code_score import score_code
    from verifier.harness import harness_source
    from verifier.items import Limits

    samples = make_samples(args.n)
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="jail-floor-"))
        tmp = Path(work)
        root = str(tmp / "root")  # the jails' tmpfs root is mounted here, in their mount namespace
        os.mkdir(root)
        os.chmod(work, 0o755)
        for controller in CGROUPS_V1:
            os.makedirs(f"/sys/fs/cgroup/{controller}/jail-floor-bench", exist_ok=True)
            stack.callback(os.rmdir, f"/sys/fs/cgroup/{controller}/jail-floor-bench")
        want = [naive_sample(s, tmp) for s in samples[:20]]
        sb = NsjailSandbox(warm=0)
        sb.self_test()
        stack.callback(sb.close)
        bpf_path = str(tmp / "nsjail.bpf")
        Path(bpf_path).write_bytes(nsjail_seccomp_filter(sb.binary, sb.config))
        harness_path = str(tmp / "judge_harness.py")
        Path(harness_path).write_bytes(harness_source())

        binds = [(d, d) for d in sb._host_ro]
        if sb.packages_path:
            binds.append((str(sb._packages_dir), sb.packages_path))

        def start_zygote(uid: int, harness: str = "") -> Zygote:
            zroot = tempfile.mkdtemp(dir=work)
            z = Zygote(sb.python, zroot, bpf_path, uid, harness, binds=binds)
            stack.callback(z.close)
            return z

        def judge(sandbox) -> Callable[[dict], bool]:
            return lambda s: score_code(s["response"], s["ground_truth"], Limits(),
                                        sandbox).status.name == "CORRECT"

        if args.split:
            _split(samples, Zygote(sb.python, tempfile.mkdtemp(dir=work), bpf_path, OUTSIDE_UID,
                                   harness_path, split=True, binds=binds), sb.python, judge)
            return
        zygotes = [start_zygote(OUTSIDE_UID + i) for i in range(2)]
        _parity(sb, zygotes[0])
        judges = [judge(ZygoteSandbox(start_zygote(OUTSIDE_UID + 2 + i, harness_path), sb.python))
                  for i in range(2)]
        if args.parallel:
            _parallel(samples, tmp, {"zygote": zygotes, "zygote+judge": judges}, args.rounds)
            return
        _serial(samples, tmp, root, want, args, {"zygote": zygotes[0],
                                                 "zygote+judge": judges[0],
                                                 "nsjail": judge(sb)})


def _parity(sb, zygote: Zygote) -> None:
    """Stop unless a program sees the same jail in the zygote as under nsjail
    (benchmarks/jail_probe.py: ids, limits, mounts, environment, descriptors, seccomp errnos)."""
    import json as _json

    from sandbox.base import SandboxLimits
    from sandbox.forkserver import PLACEMENT_VIEW

    probe = Path(__file__).with_name("jail_probe.py").read_text()
    argv = [sb.python, "-I", "-S", "-c", probe]
    r = sb.run(argv, limits=SandboxLimits())
    if r.status != "ok" or r.exit_code != 0:
        sys.exit(f"bench_jail_floor: the probe failed under nsjail: {r.status} {r.stderr[-300:]!r}")
    status, out = zygote.harness_run(b"", TEST_LIMITS, 10.0, argv)
    if status != 0:
        sys.exit(f"bench_jail_floor: the probe failed in the zygote's jail (status {status})")
    want, got = _json.loads(r.stdout), _json.loads(out)
    for key in PLACEMENT_VIEW:  # a placed jail sees one CPU (sandbox/README.md "Placement")
        want.pop(key, None)
        got.pop(key, None)
    diff = {k: (want.get(k), got.get(k)) for k in want.keys() | got.keys()
            if want.get(k) != got.get(k)}
    if diff:
        sys.exit(f"bench_jail_floor: the zygote's jail differs from nsjail's: {diff}")
    print(f"the zygote's jail is nsjail's as the probe sees it ({len(want)} properties, "
          f"{len(want['syscalls'])} syscalls)")


def _split(samples: list[dict], zygote: Zygote, python: str, judge) -> None:
    """Run every sample once through the judge on a zygote whose jails report their harness's
    resource usage, and print its mean per sample."""
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(zygote.proc.stderr), daemon=True)
    reader.start()
    run = judge(ZygoteSandbox(zygote, python))
    for s in samples:
        run(s)
    zygote.close()
    reader.join(10)
    rows = [[float(x) for x in line.split()[1:]] for line in lines if line.startswith(b"SPLIT ")]
    if len(rows) != len(samples):
        sys.exit(f"bench_jail_floor: {len(rows)} split lines for {len(samples)} samples")
    mean = [sum(col) / len(rows) for col in zip(*rows)]
    print(f"per sample, mean of {len(rows)} (zygote+judge, one at a time):")
    print(f"  the harness's own process (the jail's PID 1): user {mean[0] * 1e3:.2f} ms, "
          f"system {mean[1] * 1e3:.2f} ms, {mean[2]:.0f} page faults")
    print(f"  its test processes together:                user {mean[3] * 1e3:.2f} ms, "
          f"system {mean[4] * 1e3:.2f} ms, {mean[5]:.0f} page faults")


def _serial(samples: list[dict], tmp: Path, root: str, want: list[bool], args, extra: dict
            ) -> None:
    """One sample at a time, each mode in turn, the machine's CPU per sample."""
    modes = {"naive": lambda s: naive_sample(s, tmp), "forked": forked,
             "floor": lambda s: floor(s, root), "floor+cg": lambda s: floor(s, root, True),
             "1proc+cg": lambda s: floor(s, root, True, one_process=True), **extra}
    for name, fn in modes.items():  # the same verdicts, and every path warm once
        got = [fn(s) for s in samples[:20]]
        if got != want:
            sys.exit(f"bench_jail_floor: {name} judged {got} where the naive run judged {want}")
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
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
    print(f"per sample ({args.n} samples of 5 stdin/stdout tests, half wrong; one at a time; "
          f"median of {args.rounds} rounds; CPU of the whole machine, load average "
          f"{os.getloadavg()[0]:.1f} at the end):")
    for m in modes:
        print(f"  {m:12s} CPU {median(cpu[m]):6.2f} ms  wall {median(wall[m]):6.2f} ms  "
              f"(CPU by round: " + ", ".join(f"{x:.2f}" for x in cpu[m]) + ")")
    base = median(cpu["naive"])
    for m in list(modes)[1:]:
        print(f"  throughput bound on a CPU-bound machine, {m} / naive = naive CPU / {m} CPU: "
              f"{base / median(cpu[m]):.2f}")


if __name__ == "__main__":
    main()
