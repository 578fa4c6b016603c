"""The ``zygote`` mode of bench_jail_floor.py: a small warm process that forks each sample into a
jail of its own, with every step nsjail's policy takes for a jail (issue 29's forkserver, as a
measurement; not the service's code).

Run by the system's Python (``python3 -I -S``: the interpreter the jails use, nothing imported
but what is below), as root, with one argument: a JSON object (``root``: an empty directory for
its root's mount point; ``cgroup_root``: the v1 cgroups' parent under each controller; ``bpf``:
the seccomp filter's file; ``binds``: extra ``[src, dst]`` read-only directories; ``harness``:
the judge's harness file, when its jails run it; ``split``: report its resource usage). Once, at its start: a mount namespace of its own whose root is a
fresh tmpfs with ``/usr``, ``/lib``, ``/lib64``, ``/bin`` and ``/dev/{null,zero,urandom,random}``
bound read-only (the policy's mounts), and directory descriptors of ``/proc`` and the v1 cgroup
parents, kept from before the ``pivot_root``. Then, per sample (a JSON line on stdin; the answer,
the jail's exit code, a line on stdout), in a forked child:

1. a memory, pids and cpu cgroup of its own with the limits nsjail writes, itself put in them;
2. drop to the sample's outside uid (root's capabilities go with it), then a new user namespace
   in which that uid is 65534 (the policy's ``--user 65534:<pool uid>:1``, groups denied);
3. new mount, PID, network, IPC, UTS and cgroup namespaces; a fresh tmpfs on ``/tmp`` (the
   scratch), the hostname;
4. the namespace's PID 1 (a fork): the policy's rlimits and the per-run ones, ``/tmp`` as cwd,
   every capability dropped (effective, permitted, inheritable, ambient and bounding sets),
   ``no_new_privs``, and nsjail's own seccomp filter (the BPF that nsjail compiled from the
   policy, read out of a running jail by bench_jail_floor.py);
5. each test in a child forked from that PID 1 (the program compiled once), its output compared.

The child's exit code is the verdict (0 right, 1 wrong); the parent removes the cgroups.
"""

import json
import marshal
import os
import resource
import socket
import sys

# The jail's steps are the forkserver's own (sandbox/zygote.py, stdlib only like this file).
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "sandbox"))
from zygote import (  # noqa: E402
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NODEV,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    SANDBOX_ID,
    enter_seccomp,
    load_jailsys,
    mount,
)

HARNESS_IN_ZYGOTE = "/files/judge_harness.py"
HARNESS_IN_JAIL = "/tmp/judge_harness.py"
ENVIRONMENT = {}  # the policy's, from the zygote's own (the bench starts it with that one)
SPLIT = False  # argv[5] == "split": each harness jail writes its CPU split to stderr


def lines(s):
    """The comparison of bench_code.py's naive run: stripped lines."""
    return [x.strip() for x in s.strip().split("\n")]

def run_test(code, text):
    """In a jail's PID 1: fork one test's process, feed its stdin, return its stdout (None when
    it failed). bench_jail_floor.py's floor modes use it too."""
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
    os.write(in_w, text.encode())
    os.close(in_w)
    chunks = []
    while chunk := os.read(out_r, 65536):
        chunks.append(chunk)
    os.close(out_r)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks) if os.waitstatus_to_exitcode(status) == 0 else None


def main():
    cfg = json.loads(sys.argv[1])
    root, cg_root, filter_path = cfg["root"], cfg["cgroup_root"], cfg["bpf"]
    harness_file = cfg.get("harness", "")
    global SPLIT
    SPLIT = cfg.get("split", False)
    ENVIRONMENT.update(os.environ)
    bpf = open(filter_path, "rb").read()
    js = load_jailsys(cfg["jailsys"])
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    cg_fds = {c: os.open(f"/sys/fs/cgroup/{c}/{cg_root}", os.O_RDONLY | os.O_DIRECTORY)
              for c in ("memory", "pids", "cpu")}
    cg_limits = {"memory": {"memory.limit_in_bytes": str(576 << 20),
                            "memory.memsw.limit_in_bytes": str(576 << 20)},
                 "pids": {"pids.max": "32"},
                 "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}}
    js.unshare(CLONE_NEWNS)
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("none", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=64")
    for d in ("/usr", "/lib", "/lib64", "/bin", "/tmp", "/dev"):
        os.mkdir(root + d)
        if d not in ("/tmp", "/dev") and os.path.exists(d):
            mount(d, root + d, None, MS_BIND | MS_REC)
            mount(d, root + d, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for src, dst in cfg.get("binds", []):  # the sandbox's extra read-only directories
        os.makedirs(root + dst)
        mount(src, root + dst, None, MS_BIND | MS_REC)
        mount(src, root + dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for dev in ("null", "zero", "urandom", "random"):
        open(f"{root}/dev/{dev}", "w").close()
        mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
        if dev != "null":  # the policy's devices are read-only but /dev/null
            mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    harness = {}
    if harness_file:
        # The judge's harness, loaded once (its imports too) as if it were run as a jail's
        # /tmp/<name>: its --program processes exec that path, bound into each jail.
        os.mkdir(root + "/files")
        with open(root + HARNESS_IN_ZYGOTE, "wb") as f:
            f.write(open(harness_file, "rb").read())
        sys.argv = [HARNESS_IN_JAIL]
        source = open(harness_file, "rb").read()
        code = (marshal.loads(source[16:]) if harness_file.endswith(".pyc")
                else compile(source, HARNESS_IN_JAIL, "exec"))
        harness["__name__"] = "judge_harness"
        exec(code, harness)
        del code, source
    # pivot_root, not chroot: a chrooted process may not make a user namespace.
    os.mkdir(root + "/old")
    js.pivot_root(root, root + "/old")
    os.chdir("/")
    js.umount2("/old", 2)  # MNT_DETACH
    os.rmdir("/old")
    mount("none", "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    def enter_limits(lim):
        for name, value in ((resource.RLIMIT_AS, lim["memory_mb"] << 20),
                            (resource.RLIMIT_CPU, lim["cpu_s"]),
                            (resource.RLIMIT_FSIZE, lim["fsize_mb"] << 20),
                            (resource.RLIMIT_NPROC, lim["nproc"]),
                            (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64),
                            (resource.RLIMIT_MEMLOCK, 0), (resource.RLIMIT_MSGQUEUE, 0),
                            (resource.RLIMIT_RTPRIO, 0),
                            # the policy's rlimit_stack_type SOFT: both limits at the soft one
                            (resource.RLIMIT_STACK, resource.getrlimit(resource.RLIMIT_STACK)[0])):
            resource.setrlimit(name, (value, value))
        os.chdir("/tmp")
        enter_seccomp(bpf)

    def compare_tests(sample):
        code = compile(sample["program"], "<program>", "exec")
        for x, y in zip(sample["ground_truth"]["inputs"], sample["ground_truth"]["outputs"]):
            out = run_test(code, x)
            if out is None or lines(out.decode()) != lines(y):
                return 1
        return 0

    def piped_pid1(in_r, out_w, argv):
        # The jail's PID 1: the judge's pipes as 0, 1, 2 (stderr dropped here), every other
        # descriptor closed, the policy's environment; then ``argv`` exec'd as nsjail would,
        # or the loaded harness's main().
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        if not SPLIT:
            os.dup2(null, 2)  # with SPLIT the zygote's stderr stays: the CPU line goes there
        os.closerange(3, 1 << 16)
        os.environ.clear()
        os.environ.update(ENVIRONMENT)
        if argv:
            os.execve(argv[0], argv, ENVIRONMENT)
        # The harness decided at its import (in the zygote) that it is not its jail's PID 1;
        # here it is, and it must act as one (kill(-1) after each test, no process groups).
        harness["PID1"] = os.getpid() == 1
        harness["main"]()
        if SPLIT:  # the harness's own CPU and page faults, and its test processes'
            me = resource.getrusage(resource.RUSAGE_SELF)
            tests = resource.getrusage(resource.RUSAGE_CHILDREN)
            os.write(2, f"SPLIT {me.ru_utime} {me.ru_stime} {me.ru_minflt} {tests.ru_utime} "
                        f"{tests.ru_stime} {tests.ru_minflt}\n".encode())
        return 0

    def pump(pid, in_w, out_r, data, wall_s):
        """Feed the harness its stdin and collect its stdout until it ends or the deadline."""
        import select
        import time
        deadline = time.monotonic() + wall_s
        os.set_blocking(in_w, False)
        out, pos, fds = [], 0, {out_r}
        poller = select.poll()
        poller.register(out_r, select.POLLIN)
        if data:
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = -1
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, 9)
                break
            for fd, _ in poller.poll(left * 1000):
                if fd == in_w:
                    try:
                        pos += os.write(in_w, data[pos:pos + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:
                        pos = len(data)
                    if pos >= len(data):
                        poller.unregister(in_w)
                        os.close(in_w)
                        in_w = -1
                else:
                    chunk = os.read(out_r, 65536)
                    if chunk:
                        out.append(chunk)
                    else:
                        poller.unregister(out_r)
                        fds.discard(out_r)
        if in_w >= 0:
            os.close(in_w)
        os.close(out_r)
        _, status = os.waitpid(pid, 0)
        return status, b"".join(out)

    def jail(msg, n, stdin_data):
        uid, lim = msg["uid"], msg["limits"]
        piped = bool(harness) or "exec" in msg
        name = f"z{os.getpid()}-{n}"
        for c, fd in cg_fds.items():
            os.mkdir(name, dir_fd=fd)
            for f, v in cg_limits[c].items():
                try:
                    wfd = os.open(f"{name}/{f}", os.O_WRONLY, dir_fd=fd)
                except FileNotFoundError:
                    continue
                os.write(wfd, v.encode())
                os.close(wfd)
        pid = os.fork()
        if pid == 0:
            rc = 2
            try:
                me = str(os.getpid()).encode()
                for c, fd in cg_fds.items():
                    wfd = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=fd)
                    os.write(wfd, me)
                    os.close(wfd)
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                # A uid change makes the process undumpable: its /proc files turn root's and it
                # could not write its own uid_map.
                js.set_dumpable(True)
                js.unshare(CLONE_NEWUSER)
                for f, v in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_ID} {uid} 1"),
                             ("gid_map", f"{SANDBOX_ID} {uid} 1")):
                    wfd = os.open(f"self/{f}", os.O_WRONLY, dir_fd=proc_fd)
                    os.write(wfd, v.encode())
                    os.close(wfd)
                js.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
                           | CLONE_NEWUTS | CLONE_NEWCGROUP)
                mount("none", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
                      f"size={lim['scratch_mb'] << 20},nr_inodes={lim['scratch_files']}")
                if harness:
                    open(HARNESS_IN_JAIL, "w").close()
                    mount(HARNESS_IN_ZYGOTE, HARNESS_IN_JAIL, None, MS_BIND)
                    mount(HARNESS_IN_ZYGOTE, HARNESS_IN_JAIL, None,
                          MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
                socket.sethostname("sandbox")
                in_r = in_w = out_r = out_w = -1
                if piped:
                    in_r, in_w = os.pipe()
                    out_r, out_w = os.pipe()
                inner = os.fork()
                if inner == 0:
                    code = 2
                    try:
                        os.setsid()  # the jail's own session, as nsjail's (issue 45)
                        enter_limits(lim)
                        if piped:
                            os.close(in_w)
                            os.close(out_r)
                            code = piped_pid1(in_r, out_w, msg.get("exec"))
                        else:
                            os.close(proc_fd)
                            for fd in cg_fds.values():
                                os.close(fd)
                            code = compare_tests(msg)
                    except BaseException as e:
                        print(f"zygote jail: {e!r}", file=sys.stderr, flush=True)
                    finally:
                        os._exit(code)
                if piped:
                    os.close(in_r)
                    os.close(out_w)
                    status, out = pump(inner, in_w, out_r, stdin_data, msg.get("wall_s", 10))
                    head = json.dumps({"status": status, "out": len(out)}).encode() + b"\n"
                    os.write(1, head + out)
                    rc = 0
                else:
                    _, status = os.waitpid(inner, 0)
                    rc = os.waitstatus_to_exitcode(status)
            except BaseException as e:
                print(f"zygote jail: {e!r}", file=sys.stderr, flush=True)
            finally:
                os._exit(rc)
        _, status = os.waitpid(pid, 0)
        for fd in cg_fds.values():
            os.rmdir(name, dir_fd=fd)
        return os.waitstatus_to_exitcode(status)

    inp = sys.stdin.buffer
    n = 0
    while line := inp.readline():
        msg = json.loads(line)
        data = inp.read(msg.get("stdin", 0))
        n += 1
        code = jail(msg, n, data)
        if not (harness or "exec" in msg):
            sys.stdout.write(f"{code}\n")
            sys.stdout.flush()
        elif code != 0:  # the jail's parent failed before answering
            sys.stdout.buffer.write(json.dumps({"status": -1, "out": 0}).encode() + b"\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
