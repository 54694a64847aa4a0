"""Compile a CUDA source to PTX (what TensorRT's AOT plugins and the direct launcher load) or cubin (for inspection).

Results are cached on disk under ``$TRT_FUSEDATTN_CACHE`` (default ``~/.cache/trt_fusedattn``), keyed by the
sha256 of the source, every local header it includes (plugins/common's too), the nvcc flags, the defines and the
nvcc version.

    ptx = compile_ptx("plugins/attention/attention.cu", "sm_90a", {"HEAD_DIM": 128})   # str, cached
    cubin_path, report = compile_cubin(source, "sm_90a", defines)                       # -Xptxas -v report
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from trt_fusedattn.launcher.arch import ARCHES

BASE_FLAGS = ("-std=c++17", "-O3", "-lineinfo")
FALLBACK_NVCC = Path("/usr/local/cuda/bin/nvcc")
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


class CompileError(RuntimeError):
    """nvcc is missing or rejected a source; the message says which and shows nvcc's first errors."""


def cache_dir() -> Path:
    """Where compiled PTX/cubin lives: ``$TRT_FUSEDATTN_CACHE`` or ``~/.cache/trt_fusedattn``."""
    return Path(os.environ.get("TRT_FUSEDATTN_CACHE") or Path.home() / ".cache" / "trt_fusedattn")


@functools.lru_cache(maxsize=None)
def nvcc_path() -> str:
    """The nvcc to use: ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``."""
    candidates = [Path(os.environ[v]) / "bin" / "nvcc" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    found = shutil.which("nvcc")
    candidates += [Path(found)] if found else []
    candidates.append(FALLBACK_NVCC)
    for path in candidates:
        if path.is_file():
            return str(path)
    raise CompileError("nvcc not found: install the CUDA toolkit (12.4 or newer) or set CUDA_HOME to it")


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """nvcc's ``--version`` text (part of every cache key)."""
    return subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True).stdout


def arch_flag(arch: str, target: str) -> str:
    """``-arch`` for PTX (virtual ``compute_XX[a]``) or cubin (real ``sm_XX[a]``) output."""
    if not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
        raise CompileError(f"unknown GPU arch {arch!r}: expected one like {', '.join(ARCHES)}")
    return f"-arch={arch.replace('sm_', 'compute_')}" if target == "ptx" else f"-arch={arch}"


def local_headers(source: Path, include_dirs=()) -> list[Path]:
    """Every header reached through ``#include "..."`` from ``source`` (found beside the includer or in
    ``include_dirs``), recursively, in a stable order. Angle-bracket (system) includes are not followed."""
    seen: dict[Path, None] = {}
    pending = [source]
    while pending:
        current = pending.pop()
        for name in _LOCAL_INCLUDE.findall(current.read_text()):
            for folder in (current.parent, *map(Path, include_dirs)):
                header = (folder / name).resolve()
                if header.is_file():
                    if header not in seen:
                        seen[header] = None
                        pending.append(header)
                    break
    return sorted(seen)


def nvcc_command(source: Path, arch: str, defines: Mapping, target: str, output: Path,
                 include_dirs=(), extra_flags=()) -> list[str]:
    """The full nvcc command line (``target`` is ``ptx`` or ``cubin``)."""
    cmd = [nvcc_path(), f"-{target}", arch_flag(arch, target), *BASE_FLAGS, *extra_flags]
    cmd += [f"-D{name}={_define_value(value)}" for name, value in sorted(defines.items())]
    cmd += [f"-I{d}" for d in (str(source.parent), *map(str, include_dirs))]
    return cmd + [str(source), "-o", str(output)]


def _define_value(value) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


def _cache_key(source: Path, cmd: list[str], include_dirs) -> str:
    digest = hashlib.sha256()
    for part in (source.read_bytes(), *(h.read_bytes() for h in local_headers(source, include_dirs))):
        digest.update(hashlib.sha256(part).digest())
    # the command without paths that do not change the output (source location, output file)
    digest.update("\0".join(cmd[:-3]).encode())
    digest.update(nvcc_version().encode())
    return digest.hexdigest()


def run_nvcc(cmd: list[str], source: Path) -> str:
    """Run an nvcc command line; nvcc's stderr, or CompileError with its first errors."""
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        lines = [ln for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()] or lines
        raise CompileError(f"nvcc failed on {source.name}: " + " | ".join(errors[:3]))
    return result.stderr


@functools.lru_cache(maxsize=None)
def kernel_include_dirs() -> tuple[str, ...]:
    """The folder whose ``common/*.cuh`` (plugins/common: the shared PTX wrappers and element type) every kernel
    includes; imported lazily, when the first kernel compiles."""
    from trt_fusedattn.plugins.common import INCLUDE_ROOT
    return (str(INCLUDE_ROOT),)


def _compile(source, arch: str, defines: Mapping | None, target: str, include_dirs, extra_flags) -> tuple[Path, str]:
    """Compile (or find in the cache) and return (output file, nvcc's stderr text)."""
    source = Path(source).resolve()
    if not source.is_file():
        raise CompileError(f"CUDA source {source} does not exist")
    include_dirs = (*kernel_include_dirs(), *map(str, include_dirs))
    defines = dict(defines or {})
    out_dir = cache_dir()
    cmd = nvcc_command(source, arch, defines, target, out_dir / "placeholder", include_dirs, extra_flags)
    key = _cache_key(source, cmd, include_dirs)
    output = out_dir / f"{source.stem}-{arch}-{key[:24]}.{target}"
    report = output.with_suffix(f".{target}.log")
    if output.is_file():
        return output, report.read_text() if report.is_file() else ""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".nvcc-") as tmp:
        tmp_out = Path(tmp) / output.name
        stderr = run_nvcc(cmd[:-1] + [str(tmp_out)], source)
        tmp_log = Path(tmp) / report.name
        tmp_log.write_text(stderr)
        os.replace(tmp_log, report)
        os.replace(tmp_out, output)  # atomic: a reader sees no file or the whole file
    return output, stderr


def compile_ptx(source, arch: str, defines: Mapping | None = None, *, include_dirs=(), extra_flags=()) -> str:
    """PTX text of ``source`` for ``arch`` (``sm_80``, ``sm_89``, ``sm_90a``, ...) with ``-D`` ``defines``, cached."""
    path, _ = _compile(source, arch, defines, "ptx", include_dirs, extra_flags)
    return path.read_text()


def compile_cubin(source, arch: str, defines: Mapping | None = None, *, include_dirs=(), extra_flags=()
                  ) -> tuple[Path, str]:
    """A cubin of ``source`` for inspection (``cuobjdump -sass``) and ptxas's ``-v`` report (registers, spills,
    shared memory per kernel), cached."""
    return _compile(source, arch, defines, "cubin", include_dirs, ("-Xptxas", "-v", *extra_flags))
