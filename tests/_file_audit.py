"""Which files a piece of Python opens, renames, removes or creates: a ``sys.addaudithook`` hook (hooks
cannot be removed, so one is installed per process and switched on by ``audited``). It sees what Python
code opens (``open``, ``os.open``, ``onnx.load``), not what C++ libraries open themselves; the strace test
in ``test_hostile.py`` covers those where strace is installed.
"""
from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {"os.rename": 2, "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.truncate": 1, "os.chmod": 1,
            "os.symlink": 2, "os.link": 2, "shutil.copyfile": 2, "shutil.rmtree": 1}


@dataclass
class Audit:
    reads: set = field(default_factory=set)
    writes: set = field(default_factory=set)
    deny: set = field(default_factory=set)


_ACTIVE: list[Audit] = []


def _path(value) -> Path | None:
    if isinstance(value, int) or value is None:
        return None  # a descriptor: the open that made it was seen
    return Path(os.path.abspath(os.fsdecode(value)))


def _hook(event: str, args) -> None:
    if not _ACTIVE:
        return
    audit = _ACTIVE[-1]
    if event == "open":
        path = _path(args[0])
        if path is None:
            return
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writing = bool(isinstance(mode, str) and set(mode) & set("wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        (audit.writes if writing else audit.reads).add(path)
        if path in audit.deny:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
    elif event in _CHANGES:
        for value in args[:_CHANGES[event]]:
            path = _path(value)
            if path is not None:
                audit.writes.add(path)


sys.addaudithook(_hook)


@contextmanager
def audited(deny=()):
    """Record the files touched inside the block; opening a path in ``deny`` fails with EACCES."""
    audit = Audit(deny={Path(os.path.abspath(p)) for p in deny})
    _ACTIVE.append(audit)
    try:
        yield audit
    finally:
        _ACTIVE.remove(audit)


def python_roots() -> list[Path]:
    """Where the interpreter and the installed packages live (reading their modules is not reading the
    user's files)."""
    import trt_fusedattn

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(trt_fusedattn.__file__).parent.parent)}
    roots.update(p for p in sys.path if p and os.path.isdir(p))
    return [Path(os.path.abspath(r)) for r in roots]


# System files dependencies read when first imported (onnxruntime: the distribution's name; filelock,
# under torch, which onnxruntime-extensions imports: the boot id; torch: its own memory map).
SYSTEM_FILES = {Path("/etc/os-release"), Path("/proc/sys/kernel/random/boot_id"), Path("/proc/self/maps")}


def outside(paths, allowed) -> list[Path]:
    """The paths not under any of ``allowed`` and not one of ``SYSTEM_FILES``."""
    allowed = [Path(a) for a in allowed]
    return sorted(p for p in paths
                  if p not in SYSTEM_FILES and not any(p == a or p.is_relative_to(a) for a in allowed))
