"""The forkserver's zygote: a warm process that forks each run into a fresh jail of its own, doing
what nsjail does for a jail (issue 29; sandbox/forkserver.py starts it and talks to it).

It runs the jails' own interpreter (``python3 -I -S``, nothing imported but what is below), as
root, started by the verifier with the policy's environment and two arguments: the descriptor
of its end of a ``SOCK_SEQPACKET`` socket pair, and its configuration (sandbox/forkserver.py's
``zygote_config``), marshalled and in hex; requests and reports are marshalled too (both ends
are trusted: the verifier, and the zygote or a run's PID 1 before the run's code starts). It
never runs untrusted code: each run happens in a child of it, and nothing of a run flows
through it (the run's pipes go from the verifier straight to the jail).

Once, at its start: a mount namespace of its own whose root is a fresh tmpfs holding the
policy's read-only mounts (``/usr``, ``/lib``, ``/lib64``, ``/bin``, the devices) and the
sandbox's own (the interpreter's prefix, the packages), made read-only and entered with
``pivot_root``; directory descriptors of ``/proc``, of the cgroup parents and of the verifier's
staged input files, kept from before it; nsjail's own seccomp filter (the BPF nsjail compiled from the policy file, read
out of one of its jails by the verifier); and the judge's harness, loaded (its imports done)
when one is given.

Per run (a request packet with four descriptors: the run's stdin, stdout and stderr, and a
report socket), in nsjail's order:

1. the zygote unshares a new PID namespace for its next child only and forks the run's PID 1
   into it (then goes back to its own with ``setns``), on a CPU no other running jail has,
   if one is left (``Zygote.place``: the PID 1's affinity, which its processes inherit); it
   makes the run's cgroups (memory, pids and cpu, the limits nsjail writes, named
   ``NSJAIL.<PID 1's outside pid>`` as nsjail names them, so that cgroups.py's sweep knows
   them), sends the verifier the PID 1's pid with a pidfd of it (the verifier kills the jail
   with it: killing a PID namespace's init kills the namespace), and lets the child go; the
   child enters its cgroups;
2. a session of its own (``setsid``, as nsjail's ``skip_setsid: false``); its outside uid (from the verifier's pool): root's capabilities go with it; the parent-death
   signal, then a check on the zygote's pidfd that the zygote has not ended; a new user
   namespace in which that uid is 65534, groups denied (nsjail's ``--user 65534:<uid>:1``);
3. new mount, network, IPC, UTS and cgroup namespaces; the scratch tmpfs on ``/tmp`` (the
   run's size and inode limits); the run's input files copied into it and made read-only
   (bound onto themselves); the hostname;
4. it takes the run's pipes as 0, 1 and 2 and closes every other descriptor, sets the policy's
   and the run's rlimits, ``/tmp`` as cwd, the policy's environment, drops every capability
   (effective, permitted, inheritable, ambient, bounding), makes itself dumpable again (as an
   exec'd process under nsjail is), sets ``no_new_privs``, loads the seccomp filter, and then execs the run's argv, or runs the loaded harness's ``main()``.

The zygote reaps each PID 1, reports on the report socket its wait status and the CPU and peak
memory of the jail's processes (``wait4``), removes its cgroups, and kills a jail that outlives
its backstop. A request it cannot read, or a run whose set-up fails, costs only that run: its
report says why.
"""

# Why the imports come in three steps: a run's PID 1 must hold the modules a freshly started
# harness would, and no more. What the interpreter starts with, then what the harness itself
# imports, are kept; what is imported after (the zygote's own) is dropped in each run.
# Why no ctypes: a run's PID 1 is a copy of this process, and a program can reach every module
# this process ever loaded (frames, object.__subclasses__()). _ctypes cannot be unloaded and
# reads and writes memory with no audit event. The system calls the standard library lacks come
# from _jailsys (sandbox/jailsys.c): scalars in, one system call each, sealed in every jail.
import sys

for _name in ("_signal", "builtins", "fcntl", "io", "marshal", "os", "resource", "select", "time"):
    __import__(_name)  # the harness's own imports (and theirs), see above
import _signal  # noqa: E402 - imported above already (the harness's `signal`)
import marshal  # noqa: E402 - imported above already
import os  # noqa: E402 - imported above already
import resource  # noqa: E402
import select  # noqa: E402
import time  # noqa: E402

HARNESS_MODULES = set(sys.modules)
"""The modules a fresh interpreter running the harness has before the harness's own code runs."""

# The zygote's own: a C module and a built-in, dropped in each run unless the harness has them.
# No json, socket or importlib (31 modules, 1.5 MB of objects): every page of the zygote is a
# page each fork copies the table entry of and each exit unmaps, about 4% of a sample's CPU;
# requests and reports are marshalled, descriptors passed with _socket's sendmsg/recvmsg.
import _imp  # noqa: E402
import _socket  # noqa: E402
import gc  # noqa: E402

ZYGOTE_MODULES = []
"""The zygote's own modules, which each run's PID 1 drops from sys.modules (see become_harness)."""
js = None
"""The _jailsys module (:func:`load_jailsys`): the zygote's system calls."""
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
SANDBOX_ID = 65534
HARNESS_IN_JAIL = "/tmp/judge_harness.py"  # its name in tracebacks; each run sets its own path
RLIMITS = {  # the per-run ones come with each request; these are the policy file's (bytes, counts)
    "core": resource.RLIMIT_CORE, "nofile": resource.RLIMIT_NOFILE,
    "memlock": resource.RLIMIT_MEMLOCK, "msgqueue": resource.RLIMIT_MSGQUEUE,
    "rtprio": resource.RLIMIT_RTPRIO, "stack": resource.RLIMIT_STACK,
}
RUN_RLIMITS = {  # a request's "rlimits" (kernel values: bytes, seconds, a count)
    "as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE, "nproc": resource.RLIMIT_NPROC,
}
REQUEST = {
    "uid": (),  # the run's outside uid (the verifier's pool's)
    "entry": (),  # the harness's file name among the run's files
    "argv": (),  # what to exec, or None: the loaded harness's main() runs
    "files": (),  # the run's input files: [(staged name, name in /tmp)]
    "backstop_s": (),  # seconds after which the zygote kills the jail (nsjail's --time_limit)
    "rlimits": tuple(RUN_RLIMITS),
    "scratch": (),  # the /tmp tmpfs's mount data, "size=N,nr_inodes=M" (nsjail's -m)
    "cgroup": ("mem", "pids", "cpu_quota_us"),  # the values of the cgroup files' templates
}
"""The keys of a run's request, declared here, where it is read (sandbox/jail_spec.py renders
it; tests/test_jail_spec.py checks that the two agree): key -> the keys of its value when that
is a dict, else (). The zygote refuses a request with a key missing or unknown before it forks
(``check_request``)."""


def check_keys(value, keys, where):
    if type(value) is not dict:
        raise ValueError(f"{where.rstrip('.') or 'the request'} is not a dict but a "
                         f"{type(value).__name__}")
    for key in keys:
        if key not in value:
            raise ValueError(f"missing key {where + key!r}")
    for key in value:
        if key not in keys:
            raise ValueError(f"unknown key {where + str(key)!r}")


def check_request(req):
    """Raise ValueError naming the first key of ``req`` that is missing or unknown (REQUEST)."""
    check_keys(req, REQUEST, "")
    for key, keys in REQUEST.items():
        if keys:
            check_keys(req[key], keys, key + ".")


WARM_UP_SOURCE = "n = int(input())\nprint(n + 1)\n"


def warm_interpreter():
    """Build, once in the zygote, the interpreter state that every run would otherwise build
    lazily in its own PID 1: the first ``compile()`` of a process creates the AST node types
    (about a hundred classes, ``PyAST_Check``), 0.6 ms in a fresh interpreter and 1.3 ms in a
    run's PID 1, where every page it writes is a copy-on-write fault (issue 29). The harness
    compiles each run's program, so a run's PID 1 now finds them built. Only the compiler runs
    here, on a constant source; the code object is dropped."""
    compile(WARM_UP_SOURCE, "<zygote warm-up>", "exec")


def load_jailsys(path):
    """Load the built _jailsys extension (sandbox/forkserver.py build_jailsys) from ``path``
    as :data:`js`."""
    global js

    class Spec:  # what _imp reads of a module spec (importlib's ExtensionFileLoader does this)
        name, origin = "_jailsys", path

    module = _imp.create_dynamic(Spec)
    _imp.exec_dynamic(module)
    js = module
    return module


def compile_apart(path):
    """The code of the Python source at ``path``, compiled in a child of this process and
    passed back marshalled. Why: compiling the harness here would leave about 7.5 MB of freed
    but still mapped heap (the parser's and compiler's) in the zygote, which every fork then
    copies the page tables of and every run's exit unmaps: a third of the zygote's memory."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            with open(path, "rb") as f:
                data = marshal.dumps(compile(f.read(), HARNESS_IN_JAIL, "exec"))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
            code = 0
        except BaseException as e:  # said on the zygote's stderr, which the verifier logs
            os.write(2, f"zygote: compiling {path}: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 20):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"compiling {path} failed (status {status:#x})")
    return marshal.loads(b"".join(chunks))


def copy_file(dir_fd, src, dst):
    """``src`` (under ``dir_fd``) copied to a new file ``dst`` by the kernel (``sendfile``: no
    buffer of ours, whose pages each run would fault in), mode 0644 as nsjail's staged input
    files are (the caller binds it read-only: the mount, not the mode, keeps it unwritten)."""
    fd = os.open(src, os.O_RDONLY, dir_fd=dir_fd)
    try:
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.fchmod(out, 0o644)  # whatever the umask
            size, off = os.fstat(fd).st_size, 0
            while off < size:
                sent = os.sendfile(out, fd, off, size - off)
                if not sent:
                    raise OSError(f"{src} shrank while copied")
                off += sent
        finally:
            os.close(out)
    finally:
        os.close(fd)


def mount(src, dst, fstype, flags, data=None):
    js.mount(src, dst, fstype, flags, data)


def bind_ro(src, dst):
    mount(src, dst, None, MS_BIND | MS_REC)
    mount(src, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_seccomp(bpf):
    """The end of a jail's set-up: every capability dropped (bounding, ambient, effective,
    permitted, inheritable), ``no_new_privs``, the seccomp filter ``bpf`` loaded, and _jailsys
    sealed (each of its calls refuses from now on, here and in every fork)."""
    js.drop_capabilities()
    # Dumpable again, as an exec'd process under nsjail is (exec resets the flag; the harness
    # here is never exec'd): its processes then look like nsjail's from outside (their /proc
    # entries are the run's uid's, not root's). Nothing in the jail can use it: ptrace and
    # process_vm_* are refused by the filter, there is no /proc, and no core is written.
    js.set_dumpable(True)
    js.set_no_new_privs()
    js.seccomp_load(bpf)
    js.seal()


def write_at(dir_fd, name, value):
    fd = os.open(name, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Jail:
    """What the zygote holds of one running jail (its PID 1 is the zygote's child) until it
    has reaped it: a pidfd of it, the run's report socket and the time of its backstop."""

    __slots__ = ("pid", "name", "pidfd", "report", "backstop", "cpu")

    def __init__(self, pid, name, pidfd, report, backstop, cpu):
        self.pid, self.name, self.pidfd = pid, name, pidfd
        self.report, self.backstop, self.cpu = report, backstop, cpu

    def kill(self):
        try:
            _signal.pidfd_send_signal(self.pidfd, 9)
        except OSError:
            pass  # already gone

    def end(self, poller, status, ru):
        """Reaped: its end reported (the jail's processes that its PID 1 reaped count in
        ``ru``; the kernel killed the rest with it, unreaped by anyone but their own init)."""
        poller.unregister(self.pidfd)
        _send(self.report, {"status": status, "cpu": ru.ru_utime + ru.ru_stime,
                            "maxrss_kb": ru.ru_maxrss})
        self.close()

    def close(self):
        for fd in (self.pidfd, self.report):
            os.close(fd)


class Zygote:
    def __init__(self, cfg):
        self.cfg = cfg
        # The zygote's own PID namespace: it goes back to it after forking each run's PID 1.
        self.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.env = dict(cfg["env"])
        self.fixed_rlimits = {RLIMITS[k]: v for k, v in cfg["rlimits"].items()}
        self.bpf = bytes.fromhex(cfg["seccomp"])
        self.proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # The verifier's staged input files (never mounted into the root: a jail of nsjail's
        # has no such directory either).
        self.files_fd = os.open(cfg["files"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # {controller: (dir fd of the parent, {file: value template})}, from nsjail's arguments.
        self.cgroups = {c: (os.open(d["parent"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC),
                            d["files"]) for c, d in cfg["cgroups"].items()}
        # The policy's environment, set once here (every run's PID 1 inherits it): set in
        # each run, it cost 0.28 ms of CPU (os.environ's Python code, faulted in per run).
        os.environ.clear()
        os.environ.update(self.env)
        self.harness = {}
        self.harness_module = None
        self.keep_modules = HARNESS_MODULES
        self.jails = {}  # the PID 1 of each running jail -> its Jail, until reaped
        self.cpus = sorted(os.sched_getaffinity(0))  # where the jails may run (see place())
        self.placed = 0
        self.stale = []  # cgroup names whose removal failed (processes still exiting)
        self._build_root(cfg)

    # -- once ------------------------------------------------------------------------------

    def _build_root(self, cfg):
        root = cfg["root"]
        js.unshare(CLONE_NEWNS)  # the zygote's own mount namespace
        mount("none", "/", None, MS_REC | MS_PRIVATE)
        mount("none", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=256,mode=755")
        for src, dst in cfg["ro"]:
            if os.path.islink(src):  # /lib -> usr/lib on merged-/usr systems: the same link
                os.makedirs(os.path.dirname(root + dst), exist_ok=True)
                os.symlink(os.readlink(src), root + dst)
                continue
            os.makedirs(root + dst, exist_ok=True)
            bind_ro(src, root + dst)
        os.mkdir(root + "/dev")
        for dev, rw in cfg["devices"]:
            open(root + dev, "w").close()
            mount(dev, root + dev, None, MS_BIND)
            if not rw:
                mount(dev, root + dev, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
        os.mkdir(root + "/tmp")
        if cfg.get("harness"):
            # The judge's harness, from its source (the verifier's, never bytes a jail made),
            # compiled and loaded once; each run's PID 1 calls its main().
            code = compile_apart(cfg["harness"])
            sys.argv = [HARNESS_IN_JAIL]
            module = type(sys)("judge_harness")  # __main__ in each run, as in a fresh process
            before = set(sys.modules)
            exec(code, module.__dict__)
            del code
            self.harness = module.__dict__
            self.harness_module = module
            # What the harness's main() does first in every process (its signal dispositions,
            # exit() and quit()), done once here for all runs.
            self.harness["prepare_process"]()
            self.keep_modules = HARNESS_MODULES | (set(sys.modules) - before)
        # pivot_root, not chroot: a chrooted process may not make a user namespace.
        os.mkdir(root + "/.old")
        js.pivot_root(root, root + "/.old")
        os.chdir("/")
        js.umount2("/.old", MNT_DETACH)
        os.rmdir("/.old")
        mount("none", "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    # -- the loop --------------------------------------------------------------------------

    def serve(self, sock):
        self.sock_fd = sock.fileno()
        # What the zygote holds now (the harness loaded, its own modules) goes to the permanent
        # generation: a run's collections (become_harness's, then the harness's and its
        # tests' automatic ones) never walk it, so never write to its pages, each of which a
        # fork would then copy (a full collection of the loaded harness in a fork: 1.3-2 ms).
        # Frozen objects are not in gc.get_objects() either.
        # What each run's PID 1 drops from sys.modules (become_harness), listed once here.
        self.drop_modules = [n for n in sys.modules if n not in self.keep_modules]
        ZYGOTE_MODULES.extend(sys.modules[n] for n in self.drop_modules)
        warm_interpreter()
        gc.collect()
        gc.freeze()
        # Readable once the zygote has ended: how a run's PID 1 checks that it still lives.
        self.zygote_pidfd = os.pidfd_open(os.getpid())
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        while True:
            # The jails' pidfds are in the poller too: a jail's end wakes the loop, which
            # reaps it and reports its end at once.
            for fd, _ev in self.poller.poll(self.wait_ms()):
                if fd != self.sock_fd:
                    continue  # a jail's pidfd: reaped below
                try:
                    msg, fds = recv_fds(sock, 1 << 16, 8)
                except InterruptedError:
                    continue
                if not msg:  # the verifier closed its end, or died: no jail outlives it
                    self.stop_all()
                    return
                try:
                    self.start(msg, fds)
                finally:
                    for fd in fds:
                        os.close(fd)
            self.reap()

    def place(self):
        """The CPU the next jail runs on: one that no running jail has, or None (any CPU) when
        every CPU has one. A jail's processes hand over to each other all the time (its PID 1
        forks a test, waits for its end, signs its record, forks the next), and on one CPU each
        hand-over is a switch on that CPU instead of waking another one (an inter-processor
        interrupt and a virtual CPU's exit from idle, on a VM) and moving the process's memory
        between caches: +7-10% samples per second with two jails on two cores (issue 29). Each
        jail may use one CPU's worth of time anyway (its cgroup's CPU quota), and takes none
        from the others: the policy's seccomp filter refuses ``sched_setaffinity``, so a
        program cannot move onto a neighbour's CPU, whose jail could not leave (issue 45). With
        more jails than CPUs (``--code-concurrency`` above the cores) the extra ones are not
        placed: pinned two to a CPU, two CPU-heavy tests would share one while another idles,
        and the scheduler balances unplaced ones."""
        self.reap()  # a jail that has ended runs nowhere
        taken = {jail.cpu for jail in self.jails.values()}
        free = [c for c in self.cpus if c not in taken]
        if not free:
            return None
        # Free CPUs take turns, so that on a machine with more CPUs than jails they all do
        # (and their interrupts spread) rather than the first few.
        self.placed += 1
        return free[self.placed % len(free)]

    def wait_ms(self):
        """How long the loop may sleep: until the nearest jail's backstop, 200 ms while a
        cgroup waits to be removed, for ever when nothing runs."""
        if not self.jails:
            return 200 if self.stale else None
        now = time.monotonic()
        ms = max(0, min(j.backstop for j in self.jails.values()) - now) * 1000 + 1
        return min(ms, 200) if self.stale else ms

    def stop_all(self):
        for jail in self.jails.values():
            jail.kill()  # killing a PID namespace's init kills the namespace
        deadline = time.monotonic() + float(self.cfg["reap_s"])
        while (self.jails or self.stale) and time.monotonic() < deadline:
            time.sleep(0.01)
            self.reap()  # their cgroups go with them

    def reap(self):
        """Reap the jails that ended (each run's PID 1 is the zygote's child): report each
        one's wait status and the CPU and peak memory of its processes (its own and its reaped
        children's: ``wait4``), and remove its cgroups; kill the jails past their backstop."""
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            jail = self.jails.pop(pid, None)
            if jail is not None:
                jail.end(self.poller, status, ru)
                self.stale.append(jail.name)
        now = time.monotonic()
        for jail in self.jails.values():
            if now >= jail.backstop:
                # The backstop of the run's deadline (nsjail's --time_limit): the verifier
                # kills the jail at its deadline; this holds if the verifier cannot.
                jail.kill()
                jail.backstop = now + 1.0  # again in a second if it is still there then
        left = []
        for name in self.stale:
            for fd, _files in self.cgroups.values():
                try:
                    os.rmdir(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError:  # its last processes are still exiting: next time
                    left.append(name)
                    break
        self.stale = left

    def start(self, msg, fds):
        report = fds[3] if len(fds) == 4 else -1
        try:
            req = marshal.loads(msg)
            if len(fds) != 4:
                raise ValueError(f"a request carries 4 descriptors, got {len(fds)}")
            check_request(req)  # before the fork: a run with a key missing costs only itself
            backstop = time.monotonic() + float(req["backstop_s"])
        except (ValueError, TypeError, KeyError, EOFError) as e:
            if report >= 0:
                _send(report, {"error": f"bad request: {e}"})
            return
        # The run's PID namespace is made here: unshare(CLONE_NEWPID) applies to the zygote's
        # next child only, which is then the namespace's PID 1 (nsjail clones it so), and
        # setns takes the zygote's later children back to its own namespace. Why not a child
        # that unshares and forks the PID 1: that is a second process per run, whose fork,
        # copy-on-write faults and exit cost a sixth of a sample's CPU.
        # The child waits on ``go`` for its cgroups (their name needs its pid); an end of
        # ``go`` without them tells it that the zygote refused the run.
        go_r, go_w = os.pipe()
        cpu = self.place()
        js.unshare(CLONE_NEWPID)
        try:
            pid = os.fork()
        except OSError as e:
            js.setns(self.pidns_fd, CLONE_NEWPID)
            os.close(go_r)
            os.close(go_w)
            _send(report, {"error": f"fork: {e}"})
            return
        if pid == 0:
            code = 70
            try:
                os.close(go_w)
                os.close(self.sock_fd)  # the verifier's channel stays the zygote's alone
                if cpu is not None:
                    try:
                        os.sched_setaffinity(0, (cpu,))  # the jail's processes inherit it
                    except OSError:  # the CPU went offline: the jail runs anywhere
                        pass
                for jail in self.jails.values():  # nor any other run's
                    jail.close()
                self.jails.clear()
                code = self.child(req, fds, go_r)
            except BaseException as e:  # said on the report socket; the run fails, not us
                _send(report, {"error": f"jail set-up: {type(e).__name__}: {e}"})
            finally:
                os._exit(code)
        js.setns(self.pidns_fd, CLONE_NEWPID)
        os.close(go_r)
        name = f"NSJAIL.{pid}"
        jail = Jail(pid, name, os.pidfd_open(pid), os.dup(report), backstop, cpu)
        self.jails[pid] = jail
        self.poller.register(jail.pidfd, select.POLLIN)
        try:
            for fd, files in self.cgroups.values():
                try:
                    os.mkdir(name, dir_fd=fd)
                except FileExistsError:  # an earlier jail's of the same pid, not yet removed
                    os.rmdir(name, dir_fd=fd)  # empty, or this run fails (OSError below)
                    os.mkdir(name, dir_fd=fd)
                    if name in self.stale:  # now this run's: not to be removed under it
                        self.stale.remove(name)
                for f, template in files.items():
                    write_at(fd, f"{name}/{f}", template.format(**req["cgroup"]))
            # The verifier kills the jail with this pidfd (at its deadline, or on close).
            s = _sock(report)
            try:
                send_fds(s, marshal.dumps({"pid": pid}), [jail.pidfd])
            finally:
                s.close()
            os.write(go_w, b"g" + name.encode())
        except OSError as e:
            _send(report, {"error": f"cgroups: {e}"})
            jail.kill()
        finally:
            os.close(go_w)

    # -- one run, in the child: its PID 1 ------------------------------------------------

    def zygote_lives(self):
        """Whether the zygote (this process's parent) has not ended: its pidfd, inherited,
        is not readable yet. (From a new PID namespace getppid() says 0; reading the parent
        pid out of /proc cost 0.1 ms and 35 copy-on-write faults.)"""
        return not select.select([self.zygote_pidfd], [], [], 0)[0]

    def child(self, req, fds, go_r):
        stdin_fd, stdout_fd, stderr_fd, _report = fds
        go = os.read(go_r, 256)
        if not go.startswith(b"g"):
            return 70  # the zygote refused the run and said why on the report socket
        name = go[1:].decode()
        for fd, _files in self.cgroups.values():
            write_at(fd, f"{name}/cgroup.procs", "0")  # "0": the writing process itself
        # A session (and process group) of its own, as nsjail's setsid makes one for every
        # jail: in the zygote's session, one sample's kill(0, SIGCONT) resumed another's
        # stopped processes (SIGCONT needs only a shared session, not a shared uid), and
        # getpriority(PRIO_PGRP, 0) and the scheduler's autogroup spanned every jail (issue 45).
        os.setsid()
        uid = int(req["uid"])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # Dies with the zygote (set after the uid change, which clears it), and so does the
        # whole PID namespace: a killed zygote (or verifier, whose zygote then kills its
        # jails) leaves no jail behind. Then a check that the zygote is not gone already.
        js.set_pdeathsig(9)
        if not self.zygote_lives():
            return 72
        os.close(go_r)
        # A uid change makes a process undumpable, its /proc files root's: it could not write
        # its own uid_map. Undumpable again right after.
        js.set_dumpable(True)
        js.unshare(CLONE_NEWUSER)
        for f, v in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_ID} {uid} 1"),
                     ("gid_map", f"{SANDBOX_ID} {uid} 1")):
            write_at(self.proc_fd, f"self/{f}", v)
        js.set_dumpable(False)
        js.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
        mount("none", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, req["scratch"])
        for src, dst in req["files"]:  # the run's input files, read-only at /tmp/<name>
            # Copied in (a bind needs the staging directory's path, which the root does not
            # have), then bound onto themselves read-only: this mount namespace is the jail's,
            # but only this process, before it drops its capabilities, may remount them.
            copy_file(self.files_fd, src, f"/tmp/{dst}")
            bind_ro(f"/tmp/{dst}", f"/tmp/{dst}")
        _socket.sethostname(self.cfg["hostname"])
        self.pid1(req, stdin_fd, stdout_fd, stderr_fd)
        return 71

    def pid1(self, req, stdin_fd, stdout_fd, stderr_fd):
        for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
            os.dup2(fd, target)
        os.closerange(3, 1 << 20)  # the zygote's socket, /proc and cgroup dirs: none stays
        for name, value in req["rlimits"].items():  # the run's: RUN_RLIMITS' names only
            resource.setrlimit(RUN_RLIMITS[name], (value, value))
        for rl, value in self.fixed_rlimits.items():
            resource.setrlimit(rl, (value, value))
        os.chdir(self.cfg["cwd"])
        enter_seccomp(self.bpf)
        argv = req.get("argv")
        if argv:
            os.execve(argv[0], argv, self.env)
        self.become_harness(req["entry"])()
        os._exit(0)

    def become_harness(self, entry):
        """Make this process what a fresh interpreter running the harness as
        ``python3 -I -S <entry>`` would be, as far as a program can tell: the harness as
        ``__main__``, its modules and no others, its argv; nothing of the zygote's reachable
        but through the garbage collector: the zygote's own modules' objects, of which only the
        sealed _jailsys makes system calls, and no more than ``os`` does. Returns its
        ``main``."""
        module, harness, keep = self.harness_module, self.harness, self.keep_modules
        # Dropped from sys.modules, not freed: serve() holds them (ZYGOTE_MODULES). Freeing a
        # module (enum's, importlib's) writes to every page its objects are on, each a
        # copy-on-write fault here: 0.3 ms of CPU per run. What they hold stays reachable
        # through the garbage collector and frames, as it was (their classes are frozen and
        # never freed), and gives a program nothing that `import` would not.
        if len(sys.modules) == len(keep) + len(self.drop_modules):  # none imported since
            drop = self.drop_modules
        else:
            drop = set(sys.modules) - keep
        for name in drop:
            del sys.modules[name]
        module.__name__ = "__main__"
        sys.modules["__main__"] = module
        sys.argv = [entry]
        sys.orig_argv[:] = [sys.executable, "-I", "-S", entry]
        # The harness decided at its import (in the zygote) that it is not its jail's PID 1;
        # now it is, and must act as one (kill(-1) after each test).
        harness["PID1"] = os.getpid() == 1
        # Its --program processes exec the run's own copy of it, bound at /tmp/<entry>.
        harness["HARNESS_PATH"] = f"/tmp/{entry}"
        self.__dict__.clear()
        globals().pop("js", None)
        gc.collect()  # this run's young objects only (serve froze the zygote's)
        return harness["main"]


def _sock(fd):
    return _socket.socket(fileno=os.dup(fd))


def send_fds(sock, msg, fds):
    """``msg`` with the descriptors ``fds`` (``SCM_RIGHTS``), as socket.send_fds sends them."""
    rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
    sock.sendmsg([msg], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])


def recv_fds(sock, bufsize, maxfds):
    """(message, descriptors) as socket.recv_fds receives them: the descriptors of every
    ``SCM_RIGHTS`` item, a truncated last one dropped."""
    msg, ancdata, _flags, _addr = sock.recvmsg(bufsize, _socket.CMSG_LEN(maxfds * 4))
    fds = []
    for level, kind, data in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(int.from_bytes(data[i:i + 4], sys.byteorder, signed=True)
                       for i in range(0, len(data) - len(data) % 4, 4))
    return msg, fds


def _send(fd, obj):
    try:
        s = _sock(fd)
        try:
            s.send(marshal.dumps(obj))
        finally:
            s.close()
    except OSError:
        pass


def main():
    cfg = marshal.loads(bytes.fromhex(sys.argv[2]))
    load_jailsys(cfg["jailsys"])
    sock = _socket.socket(fileno=int(sys.argv[1]))
    Zygote(cfg).serve(sock)


if __name__ == "__main__":
    main()
