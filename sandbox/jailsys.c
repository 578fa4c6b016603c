/* _jailsys: the system calls the forkserver's zygote (sandbox/zygote.py) makes to build a jail
 * and that Python's standard library lacks: unshare, setns, mount, umount2, pivot_root, the prctl
 * calls (parent-death signal, dumpable, no_new_privs, seccomp), and dropping every capability.
 *
 * Why a module of our own instead of ctypes: a forked jail is a copy of the zygote's memory,
 * and a program can reach any module the zygote ever loaded (walking frames, or
 * object.__subclasses__()). _ctypes cannot be unloaded, and its types give read and write of
 * the process's memory (from_address, memmove, cast) with no audit event. This module gives
 * nothing of the kind: every function takes ints, strings or bytes and makes one system call,
 * and seal(), which the jail's PID 1 calls after loading the seccomp filter, makes every one of
 * them refuse from then on, in that process and in everything it forks. A sealed module is
 * inert: what a program could still do with it, it could already do with os.*.
 *
 * Built by sandbox/forkserver.py (build_jailsys) with the system's C compiler against the
 * jail interpreter's own headers, once per verifier process.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int sealed = 0;

/* Every entry point starts here: a sealed module refuses (PermissionError). */
#define REFUSE_IF_SEALED()                                                          \
    do {                                                                            \
        if (sealed) {                                                               \
            PyErr_SetString(PyExc_PermissionError, "_jailsys is sealed in a jail"); \
            return NULL;                                                            \
        }                                                                           \
    } while (0)

/* errno as Python's own OSError subclass (PermissionError for EPERM, ...), with what failed as
 * its filename. */
static PyObject *os_error(const char *what) {
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, what);
}

static PyObject *done(long rc, const char *what) {
    if (rc != 0) return os_error(what);
    Py_RETURN_NONE;
}

static PyObject *js_unshare(PyObject *self, PyObject *args) {
    int flags;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "i:unshare", &flags)) return NULL;
    return done(unshare(flags), "unshare");
}

/* Why: the zygote makes each jail's PID namespace with unshare(CLONE_NEWPID) and a fork, then
 * goes back to its own with setns (os.setns is Python 3.12's; the jails' interpreter is 3.11). */
static PyObject *js_setns(PyObject *self, PyObject *args) {
    int fd, nstype;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "ii:setns", &fd, &nstype)) return NULL;
    return done(setns(fd, nstype), "setns");
}

static PyObject *js_mount(PyObject *self, PyObject *args) {
    const char *src, *dst, *fstype, *data;
    unsigned long flags;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "zszkz:mount", &src, &dst, &fstype, &flags, &data)) return NULL;
    return done(mount(src, dst, fstype, flags, data), dst);
}

static PyObject *js_umount2(PyObject *self, PyObject *args) {
    const char *target;
    int flags;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "si:umount2", &target, &flags)) return NULL;
    return done(umount2(target, flags), target);
}

static PyObject *js_pivot_root(PyObject *self, PyObject *args) {
    const char *new_root, *put_old;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "ss:pivot_root", &new_root, &put_old)) return NULL;
    return done(syscall(SYS_pivot_root, new_root, put_old), "pivot_root");
}

static PyObject *js_set_pdeathsig(PyObject *self, PyObject *args) {
    int sig;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "i:set_pdeathsig", &sig)) return NULL;
    return done(prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0, 0, 0), "PR_SET_PDEATHSIG");
}

static PyObject *js_set_dumpable(PyObject *self, PyObject *args) {
    int on;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "p:set_dumpable", &on)) return NULL;
    return done(prctl(PR_SET_DUMPABLE, (unsigned long)on, 0, 0, 0), "PR_SET_DUMPABLE");
}

/* Every capability: the bounding set (EINVAL past the kernel's last one ends the loop), the
 * ambient set, then effective, permitted and inheritable (capset with all-zero data). */
static PyObject *js_drop_capabilities(PyObject *self, PyObject *noargs) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    REFUSE_IF_SEALED();
    for (unsigned long cap = 0; cap < 64; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
            return os_error("PR_CAPBSET_DROP");
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        return os_error("PR_CAP_AMBIENT_CLEAR_ALL");
    memset(data, 0, sizeof(data));
    return done(syscall(SYS_capset, &header, data), "capset");
}

static PyObject *js_set_no_new_privs(PyObject *self, PyObject *noargs) {
    REFUSE_IF_SEALED();
    return done(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS");
}

/* A classic-BPF seccomp program, given as its bytes (8 per instruction). The kernel copies
 * it at this call, so nothing of it needs to outlive the call. */
static PyObject *js_seccomp_load(PyObject *self, PyObject *args) {
    Py_buffer bpf;
    struct sock_fprog prog;
    long rc;
    REFUSE_IF_SEALED();
    if (!PyArg_ParseTuple(args, "y*:seccomp_load", &bpf)) return NULL;
    if (bpf.len == 0 || bpf.len % sizeof(struct sock_filter) != 0 ||
        bpf.len / sizeof(struct sock_filter) > BPF_MAXINSNS) {
        PyBuffer_Release(&bpf);
        PyErr_Format(PyExc_ValueError, "seccomp_load: %zd bytes is not a BPF program", bpf.len);
        return NULL;
    }
    prog.len = (unsigned short)(bpf.len / sizeof(struct sock_filter));
    prog.filter = (struct sock_filter *)bpf.buf;
    rc = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
    PyBuffer_Release(&bpf);
    return done(rc, "PR_SET_SECCOMP");
}

static PyObject *js_seal(PyObject *self, PyObject *noargs) {
    sealed = 1;
    Py_RETURN_NONE;
}

static PyObject *js_is_sealed(PyObject *self, PyObject *noargs) {
    return PyBool_FromLong(sealed);
}

static PyMethodDef methods[] = {
    {"unshare", js_unshare, METH_VARARGS, "unshare(flags)"},
    {"setns", js_setns, METH_VARARGS, "setns(fd, nstype)"},
    {"mount", js_mount, METH_VARARGS, "mount(src|None, dst, fstype|None, flags, data|None)"},
    {"umount2", js_umount2, METH_VARARGS, "umount2(target, flags)"},
    {"pivot_root", js_pivot_root, METH_VARARGS, "pivot_root(new_root, put_old)"},
    {"set_pdeathsig", js_set_pdeathsig, METH_VARARGS, "prctl(PR_SET_PDEATHSIG, sig)"},
    {"set_dumpable", js_set_dumpable, METH_VARARGS, "prctl(PR_SET_DUMPABLE, on)"},
    {"drop_capabilities", js_drop_capabilities, METH_NOARGS,
     "drop every capability: bounding, ambient, effective, permitted, inheritable"},
    {"set_no_new_privs", js_set_no_new_privs, METH_NOARGS, "prctl(PR_SET_NO_NEW_PRIVS, 1)"},
    {"seccomp_load", js_seccomp_load, METH_VARARGS, "load a seccomp filter (BPF bytes)"},
    {"seal", js_seal, METH_NOARGS, "refuse every call from now on, in this process and its forks"},
    {"is_sealed", js_is_sealed, METH_NOARGS, "True once seal() was called"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jailsys",
    "The zygote's system calls (sandbox/jailsys.c); sealed in every jail.", -1, methods,
};

PyMODINIT_FUNC PyInit__jailsys(void) { return PyModule_Create(&module); }
