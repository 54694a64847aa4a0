"""A launch plan: what TensorRT's AOT plugin ABI needs to launch one kernel, and what the direct launcher launches.

An op's ``plan_<op>`` function builds one from dimensions and attributes. Dimensions may be plain ints
(direct launcher) or TensorRT symbolic expressions (the plugin), so a plan function uses only ``+ - * //``
on dimensions (ceil division as ``(a + b - 1) // b``), never ``if``/``min``/``max`` on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LaunchPlan:
    source: Path              # the .cu file whose kernel runs
    kernel: str               # its extern "C" entry point
    defines: dict             # compile-time specialization (-D NAME=VALUE): head dim, dtype, causal, tile, ...
    grid: tuple               # (x, y, z): ints or symbolic expressions of input dimensions
    block: tuple              # (x, y, z): ints
    shared_mem: Any           # bytes of dynamic shared memory: int or expression
    scalars: tuple = field(default=())  # int32 kernel arguments after the input pointers: ints or expressions
