"""A launch plan: what TensorRT's AOT plugin ABI needs to launch one kernel, and what the direct launcher launches.

Each op has ONE plan function, in ``plugins/<op>/plan.py``, with exactly this signature (the TensorRT layer
``trt_fusedattn/tensorrt/plugins.py`` and the direct launcher both call it so)::

    plan_<op>(input_shapes: list[tuple | None], input_dtypes: list[str | None], attrs: dict, arch: str) -> LaunchPlan

- ``input_shapes``: one entry per contract input, in contract order; ``None`` for a missing optional input.
  A dimension is a plain ``int`` when it is known when the plan is made (always in the direct launcher; in
  TensorRT when the dimension is static in the model, e.g. the head dim), otherwise a TensorRT symbolic
  expression (``tensorrt.plugin.SymInt32``). Use ``isinstance(d, int)`` to require a static dimension
  (e.g. for a ``-D`` define) and raise ``ValueError`` with a one-line reason when it is not.
- ``input_dtypes``: ``"float16" | "bfloat16" | "float32" | "int32" | "bool" | "float8_e4m3fn"`` (None when missing).
- ``attrs``: the node's attributes resolved by the contract (``OpContract.resolve``: defaults filled in).
- ``arch``: the target, ``"sm_80" | "sm_86" | "sm_89" | "sm_90a"`` (``launcher.launch.device_arch()`` gives it).
- Arithmetic on dimensions: only ``+ - * //`` (ceil division as ``(a + b - 1) // b``), never ``if``/``min``/
  ``max``/comparisons on a dimension that may be symbolic. ``defines`` and ``block`` must be plain ints/strings
  (they become compile-time constants of the PTX and must not depend on a symbolic shape); ``grid``,
  ``shared_mem`` and ``scalars`` may be symbolic. Every scalar is passed as an int32 kernel argument.
- Raise ``ValueError`` (one line: what is unsupported, what is) for a configuration no kernel serves.

Each ``plugins/<op>/plan.py`` also exports, for the TensorRT layer (shape inference) and the direct API::

    output_shape_<op>(input_shapes: list[tuple | None], attrs: dict) -> tuple   # ints or symbolic, same rules

(the output dtype is input 0's). A plan function that can serve TensorRT's vectorized formats takes the keyword
``formats: tuple[str, ...] | None`` (one per contract input, None when missing, then the output; names of
``tensorrt.TensorFormat``: ``"LINEAR"``, ``"HWC8"``, ...); the direct launcher passes none (arrays as given).
In TensorRT, a symbolic dimension supports ``+ - * //`` with ints on either side (the TensorRT layer wraps
TensorRT's expressions so that ``1 * d`` and ``d * 1`` both work); ``bool()`` / ``%`` / comparisons raise.

Kernel argument order (the AOT ABI): the pointers of the PRESENT inputs in contract order (missing optional
inputs pass no pointer, so say in ``defines`` which are present), then ``scalars`` as int32, then the output
pointers. ``source`` is a ``.cu`` file; ``kernel`` its ``extern "C" __global__`` name.
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
