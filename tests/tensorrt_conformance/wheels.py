"""NVIDIA's ``tensorrt.plugin`` Python sources for each TensorRT line, from the ``tensorrt-cu12-bindings`` wheels
on PyPI (their compiled part needs TensorRT's libraries and cannot load here; the ``plugin/`` package is pure
Python and is what this suite runs).

The wheels are fetched once with pip into a cache folder (``$TRT_FUSEDATTN_TRT_WHEELS`` or
``~/.cache/trt_fusedattn/tensorrt-bindings``); a folder that already holds them (copied there by hand on a
machine without PyPI) is used as it is. Nothing is vendored in the repository.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# The lines the product claims: the first with AOT plugins, the newest 10.x, the newest 11.x.
VERSIONS = ("10.9.0.34", "10.16.1.11", "11.4.0.106")
DISTRIBUTION = "tensorrt-cu12-bindings"


class WheelsUnavailable(RuntimeError):
    """The bindings wheel of a version could not be fetched (no network to PyPI, or pip failed)."""


def cache_dir() -> Path:
    return Path(os.environ.get("TRT_FUSEDATTN_TRT_WHEELS") or
                Path.home() / ".cache" / "trt_fusedattn" / "tensorrt-bindings")


def _wheel(version: str, folder: Path) -> Path:
    pattern = f"{DISTRIBUTION.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if found:
        return found[0]
    # Every wheel of a version carries the same plugin/*.py: ask for the CPython 3.11 x86-64 one whatever this
    # interpreter and machine are (every line publishes it), so the suite runs on any Python.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
               "--disable-pip-version-check", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
               "--platform", "manylinux_2_28_x86_64", "-d", str(folder), f"{DISTRIBUTION}=={version}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    found = sorted(folder.glob(pattern))
    if result.returncode or not found:
        last = (result.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise WheelsUnavailable(f"pip download {DISTRIBUTION}=={version} failed ({last[:160]}); put the wheel in "
                                f"{folder} or set TRT_FUSEDATTN_TRT_WHEELS to a folder holding it")
    return found[0]


def plugin_sources(version: str) -> Path:
    """The folder of ``tensorrt_bindings/plugin/*.py`` of ``version``, extracted from its wheel."""
    folder = cache_dir()
    target = folder / f"plugin-{version}"
    if (target / "__init__.py").is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    wheel = _wheel(version, folder)
    staging = folder / f".plugin-{version}.{os.getpid()}"
    staging.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("tensorrt_bindings/plugin/") and member.endswith(".py"):
                (staging / Path(member).name).write_bytes(archive.read(member))
    if not (staging / "__init__.py").is_file():
        raise WheelsUnavailable(f"{wheel.name} has no tensorrt_bindings/plugin/ package")
    try:
        staging.rename(target)
    except OSError:  # another process extracted it first
        shutil.rmtree(staging, ignore_errors=True)
    return target
