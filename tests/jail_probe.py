"""What a sandboxed program sees of its jail, as one JSON line: ids, PID, session and process
group (and what ``setsid``/``setpgid`` answer), hostname, cwd, environment, umask, root and /dev
listings, every rlimit, open descriptors, blocked signals, ``no_new_privs``, dumpability, CPU
affinity and ``os.cpu_count()``, each mount's flags and size, its input files' modes, which
paths it can write, and the errno of each syscall the policy's seccomp filter denies (and of a
few that the missing capabilities deny). Its input files, when given, are ``/tmp/in.txt`` and
``/tmp/in.bin``.

What it is for today: tests/test_forkserver.py runs it in an nsjail jail and in a forkserver
(zygote) jail and asserts that both see the same, so the forkserver's jails stay nsjail's. Run by
the jail's ``python3 -I -S``; x86-64 syscall numbers.
"""
import ctypes
import json
import os
import resource
import signal

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def sc(*args):
    """The syscall's errno text, or "ok"."""
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    if r == 0 and args[0] == 56:  # a clone that was let through: the child leaves at once
        os._exit(0)
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())


out = {
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()],
    "pid": [os.getpid(), os.getppid()], "host": os.uname().nodename, "cwd": os.getcwd(),
    "env": dict(os.environ), "umask": os.umask(0o22), "nice": os.nice(0),
    "root": sorted(os.listdir("/")), "dev": sorted(os.listdir("/dev")),
    "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_")},
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "nnp": libc.prctl(39, 0, 0, 0, 0), "dumpable": libc.prctl(3, 0, 0, 0, 0),
}
fds = []
for fd in range(256):
    try:
        os.fstat(fd); fds.append(fd)
    except OSError:
        pass
out["fds"] = fds


def errno_of(call, *args):
    try:
        call(*args)
        return "ok"
    except OSError as e:
        return e.strerror


# Session and process group: the jail's own (nsjail's setsid), never the verifier's. setsid
# and setpgid are tried after they are read: a session leader's answer is EPERM either way.
out["session"] = [os.getsid(0), os.getpgid(0), os.getpgrp()]
out["setsid"] = errno_of(os.setsid)
out["setpgid"] = errno_of(os.setpgid, 0, 0)
out["affinity"] = sorted(os.sched_getaffinity(0))
out["cpu_count"] = os.cpu_count()
out["sched_setaffinity"] = errno_of(os.sched_setaffinity, 0, out["affinity"])
# Each mount point's flags (ST_RDONLY 1, ST_NOSUID 2, ST_NODEV 4, ST_NOEXEC 8, ...) and, for
# the scratch tmpfs, its size and inode caps.
mounts = {}
for p in ("/", "/usr", "/lib", "/lib64", "/bin", "/tmp", "/dev/null", "/dev/zero",
          "/dev/urandom", "/dev/random", "/tmp/in.txt", "/tmp/in.bin"):
    try:
        v = os.statvfs(p)
    except OSError as e:
        mounts[p] = e.strerror
        continue
    mounts[p] = [v.f_flag, v.f_bsize, v.f_blocks, v.f_files] if p == "/tmp" else v.f_flag
out["mounts"] = mounts
files = {}
for p in ("/tmp/in.txt", "/tmp/in.bin"):
    try:
        st = os.stat(p)
        files[p] = [oct(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_nlink]
    except OSError as e:
        files[p] = e.strerror
out["files"] = files


def w(path):
    try:
        open(path, "w").close(); return "ok"
    except OSError as e:
        return e.strerror


out["write"] = {p: w(p) for p in ("/tmp/x", "/usr/x", "/x", "/dev/null", "/tmp/in.txt")}
out["syscalls"] = {
    "ptrace": sc(101, 16, 1, 0, 0), "process_vm_readv": sc(310, 1, 0, 0, 0, 0, 0),
    "unshare": sc(272, 0), "mount": sc(165, 0, 0, 0, 0, 0), "chroot": sc(161, 0),
    "clone_newuser": sc(56, 0x10000000 | 17, 0, 0, 0, 0), "clone3": sc(435, 0, 0),
    "socket_netlink": sc(41, 16, 3, 0), "socket_packet": sc(41, 17, 3, 0), "socket_inet": sc(41, 2, 1, 0),
    "io_uring_setup": sc(425, 1, 0), "inotify_init1": sc(294, 0), "keyctl": sc(250, 0, 0, 0, 0, 0),
    "bpf": sc(321, 0, 0, 0), "userfaultfd": sc(323, 0), "perf_event_open": sc(298, 0, 0, -1, -1, 0),
    "kcmp": sc(312, 1, 1, 0, 0, 0), "pidfd_getfd": sc(438, 0, 0, 0), "sethostname": sc(170, 0, 0),
    "setuid0": sc(105, 0), "chown": sc(92, 0, 0, 0), "syslog": sc(103, 3, 0, 0), "acct": sc(163, 0),
    "reboot": sc(169, 0, 0, 0, 0), "init_module": sc(175, 0, 0, 0), "swapon": sc(167, 0, 0),
    "open_by_handle_at": sc(304, 0, 0, 0), "setns": sc(308, 0, 0), "pivot_root": sc(155, 0, 0),
}
print(json.dumps(out, sort_keys=True))
