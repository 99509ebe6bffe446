"""The child side of the python grader sandbox. Not imported: sandbox.py runs its text as `python -I -c <text>`.

It starts with an empty environment in an empty temporary directory, reads its job (source, sample, item,
limits) from stdin, then, before any grader code runs: sets its own resource limits (address space, CPU time,
file size, no core files), tries to leave the host's network (an empty network namespace, where the kernel
allows it), and installs an audit hook that Python code cannot remove, refusing sockets, new processes,
signals to other processes, native-code loaders (ctypes, cffi), reads under /proc (the parent's environment
is readable at /proc/<pid>/environ), and any file outside its own folder but the interpreter's libraries (the
pool's database, keys and other tenants' files are not readable, and nothing outside its folder is writable). The grader's prints go to stderr; the verdict is one JSON line on a
private copy of stdout.
"""

import json
import math
import numbers
import os
import re
import resource
import signal
import sys

_REFUSED_EVENTS = {
    "socket.__new__": "network access", "socket.connect": "network access", "socket.bind": "network access",
    "socket.getaddrinfo": "network access", "socket.gethostbyname": "network access",
    "socket.gethostbyaddr": "network access", "socket.sethostname": "network access",
    "subprocess.Popen": "starting processes", "os.system": "starting processes", "os.exec": "starting processes",
    "os.posix_spawn": "starting processes", "os.spawn": "starting processes", "os.fork": "starting processes",
    "os.forkpty": "starting processes", "pty.spawn": "starting processes",
    "os.kill": "signalling processes", "os.killpg": "signalling processes", "signal.pthread_kill": "signalling processes",
    "os.symlink": "making links", "os.link": "making links",
    "ctypes.dlopen": "loading native code", "ctypes.dlsym": "loading native code",
    "ctypes.call_function": "loading native code",
}  # fmt: skip
# A fresh import of _posixsubprocess would bring back the fork_exec replaced below; sockets need no such care:
# socket.__new__ is audited in C, whichever module object made the socket.
_REFUSED_IMPORTS = {"ctypes", "_ctypes", "cffi", "_cffi_backend", "_posixsubprocess"}
_PROC = re.compile(r"(?:^|/)proc(?:/(?:\d+|self|thread-self)(?:/|$)|/?$)")


def _refuse_proc(path):
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:  # a file descriptor
        return False
    return bool(_PROC.search(os.path.normpath(path)) or _PROC.search(os.path.realpath(path)))


# Where a grader may read: its own folder and the interpreter's libraries (to import); write: its own folder only.
# Everything else (the pool's database, keys, other tenants' files, the user's home) is out of reach: set in main().
_READABLE: tuple = ()
_WRITABLE: tuple = ()
_LISTING = {"os.listdir", "os.scandir", "glob.glob", "os.chdir", "os.chmod", "os.chown", "os.remove", "os.rename",
            "os.rmdir", "os.mkdir", "shutil.rmtree", "shutil.copyfile", "shutil.move", "os.truncate", "os.utime"}
_CHANGES = _LISTING - {"os.listdir", "os.scandir", "glob.glob", "os.chdir"}


def _within(path, roots):
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError:  # a file descriptor it already holds
        return True
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in roots)


def _writes(mode):
    return isinstance(mode, str) and any(c in mode for c in "wax+")


def _hook(event, args):
    what = _REFUSED_EVENTS.get(event)
    if what:
        raise PermissionError(f"{what} is disabled in python graders ({event})")
    if event == "import" and args and args[0] in _REFUSED_IMPORTS:
        raise ImportError(f"importing {args[0]} is disabled in python graders")
    if event == "open" and args and _refuse_proc(args[0]):
        raise PermissionError(f"reading /proc is disabled in python graders ({args[0]!r})")
    if _READABLE and event in ("open", *_LISTING) and args and args[0] is not None:
        changes = event in _CHANGES or (event == "open" and len(args) > 1 and _writes(args[1]))
        if not _within(args[0], _WRITABLE if changes else _READABLE):
            raise PermissionError(f"files outside the grader's own folder are out of reach ({event})")


def _leave_network():
    """Best effort: an empty network namespace (only a loopback that is down). Needs root or user namespaces."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        newnet, newuser = 0x40000000, 0x10000000
        return libc.unshare(newnet) == 0 or libc.unshare(newuser | newnet) == 0
    except Exception:  # noqa: BLE001 - no ctypes or no libc: the audit hook still refuses sockets
        return False
    finally:
        for name in [m for m in sys.modules if m in ("ctypes", "_ctypes") or m.startswith("ctypes.")]:
            del sys.modules[name]


def _limit(limits):
    memory, cpu, size = limits["memory_bytes"], limits["cpu_s"], limits["file_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the size limit fails instead of killing us


def _verdict(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return {"ok": False, "error": f"grade returned {type(value).__name__}, not a number"}
    score = float(value)
    if not math.isfinite(score):
        return {"ok": False, "error": f"grade returned {score}, not a finite number"}
    return {"ok": True, "score": score}


def _describe(exc, limits):
    if isinstance(exc, MemoryError):
        return f"MemoryError: out of memory (limit {limits['memory_bytes'] // 2**20} MB)"
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = type(exc).__name__
    return text[:1000]


def main():
    job = json.loads(sys.stdin.buffer.read())
    limits = job["limits"]
    if limits["network_namespace"]:
        _leave_network()
    # Imported now, so the audit hook can refuse any fresh import of them (which would bring back fork_exec).
    import _posixsubprocess

    def no_processes(*args, **kwargs):
        raise PermissionError("starting processes is disabled in python graders (fork_exec)")

    _posixsubprocess.fork_exec = no_processes
    verdict_fd = os.dup(1)
    os.dup2(2, 1)  # the grader's prints go to stderr
    _limit(limits)
    global _READABLE, _WRITABLE
    here = os.path.realpath(os.getcwd())
    libraries = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                                 os.path.dirname(os.__file__)) if p}
    _WRITABLE = (here,)
    _READABLE = (here, *sorted(p for p in libraries if p not in ("/", "")))
    sys.addaudithook(_hook)
    sample, item, source = job["sample"], job["item"], job["source"]
    del job
    try:
        namespace = {"__name__": "__grader__"}
        exec(compile(source, "<grader>", "exec"), namespace)
        grade = namespace.get("grade")
        if not callable(grade):
            verdict = {"ok": False, "error": "the source defines no grade(sample, item) function"}
        else:
            verdict = _verdict(grade(sample, item))
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the grader's failures too
        verdict = {"ok": False, "error": _describe(exc, limits)}
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # the grader's prints, for the reason's stderr line
    except BaseException:  # noqa: BLE001, S110 - a grader that replaced or closed them
        pass
    try:
        os.write(verdict_fd, (json.dumps(verdict) + "\n").encode())
    finally:
        os._exit(0)  # do not wait for threads the grader left running


if __name__ == "__main__":
    main()
