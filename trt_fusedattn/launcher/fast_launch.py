"""The repeated launch of a prepared kernel as one call into a small C extension (``fast_launch.c``), built at first
use with nvcc's host compiler and cached beside the PTX: the context check, the kernel parameters and cuLaunchKernel
without ctypes' per-call conversions (issue 10 item 3; NOTES.md "Host overhead of the direct API"). Where it cannot
be built (no Python headers), ``module()`` is None and the launcher keeps its ctypes path."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import sysconfig
import tempfile
from pathlib import Path

from trt_fusedattn.launcher.compile import CompileError, cache_dir, nvcc_path, nvcc_version, run_nvcc

SOURCE = Path(__file__).with_name("fast_launch.c")
MAX_PARAMS = 64  # fast_launch.c's stack arrays


class LaunchRecord(ctypes.Structure):
    """fast_launch.c's LaunchRecord, field for field: what one prepared kernel's launch needs."""
    _fields_ = [("launch_kernel", ctypes.c_void_p), ("ctx_get_current", ctypes.c_void_p),
                ("ctx_push_current", ctypes.c_void_p), ("ctx_pop_current", ctypes.c_void_p),
                ("function", ctypes.c_void_p), ("context", ctypes.c_void_p), ("params", ctypes.c_void_p),
                ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("shared", ctypes.c_uint32),
                ("n_inputs", ctypes.c_int32), ("n_outputs", ctypes.c_int32), ("n_scalars", ctypes.c_int32)]


def launch_record(driver_lib, function: int, context: int, params, grid, block, shared: int, n_inputs: int,
                  n_outputs: int) -> LaunchRecord:
    """The record of one prepared kernel; ``params`` (a ctypes array of the parameter addresses, scalars included)
    and the returned record must stay alive as long as it is launched."""
    if len(params) > MAX_PARAMS:
        raise ValueError(f"the kernel has {len(params)} parameters; fast_launch.c takes at most {MAX_PARAMS}")
    entry = lambda name: ctypes.cast(getattr(driver_lib, name), ctypes.c_void_p).value  # noqa: E731
    return LaunchRecord(entry("cuLaunchKernel"), entry("cuCtxGetCurrent"), entry("cuCtxPushCurrent_v2"),
                        entry("cuCtxPopCurrent_v2"), function, context, ctypes.addressof(params),
                        (ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*block), shared, n_inputs, n_outputs,
                        len(params) - n_inputs - n_outputs)


@functools.lru_cache(maxsize=None)
def load() -> tuple:
    """(the built extension module, None), cached on disk per source, Python ABI and nvcc; or (None, why not) where it
    cannot be built."""
    try:
        return _load(_build()), None
    except (CompileError, OSError, ImportError) as exc:
        return None, str(exc)


def module():
    """The C launcher's module, or None where it cannot be built."""
    return load()[0]


def unavailable_reason() -> str | None:
    """Why the C launcher is not used (None when it is)."""
    return load()[1]


def _build() -> Path:
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        raise CompileError(f"no Python.h in {include}: install this Python's development headers "
                           "(e.g. python3-dev) for the C launcher")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    cmd = [nvcc_path(), "-shared", "-O2", "-cudart", "none", "-Xcompiler", "-fPIC", f"-I{include}"]
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update("\0".join([*cmd, suffix, nvcc_version()]).encode())
    output = cache_dir() / f"fast_launch-{digest.hexdigest()[:24]}{suffix}"
    if output.is_file():
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".cc-") as tmp:
        tmp_out = Path(tmp) / output.name
        run_nvcc([*cmd, str(SOURCE), "-o", str(tmp_out)], SOURCE)
        os.replace(tmp_out, output)  # atomic: a reader sees no file or the whole file
    return output


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("fast_launch", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
