"""``OpRecord``: everything the rest of the product needs of one custom op, in one value per ``plugins/<op>/``.

The rewrites emit nodes through ``contract``; verification evaluates ``contract.reference``; the TensorRT layer
registers a plugin from the contract, infers the output with ``output_shape``/``output_dtype``, asks for the
tensor formats in ``channels_last`` and launches ``plan``; the public API exposes ``api``. A new op is a new
folder whose ``__init__.py`` defines ``OP = OpRecord(...)``, plus its line in ``plugins/__init__.py``'s ``OPS``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from trt_fusedattn.contract import OpContract


@dataclass(frozen=True)
class OpRecord:
    """One op: its contract, launch plan and output inference, what TensorRT must know of its tensors, its API."""

    contract: OpContract = field(repr=False)
    plan: Callable           # plan_<op>(input_shapes, input_dtypes, attrs, arch[, formats=]) -> LaunchPlan
    output_shape: Callable   # (input_shapes, attrs) -> output shape; ints or symbolic dims (+ - * // only)
    output_dtype: Callable   # (input_dtypes, attrs) -> output dtype name ("float16", ...)
    main_inputs: tuple       # inputs that take the kernel's element type (float16/bfloat16) with the output
    channels_last: tuple = ()  # inputs (and the output) the kernels read/write channels-last when rank 4
    api: tuple = ()          # (public name in ``trt_fusedattn``, module defining it): the direct GPU call

    @property
    def name(self) -> str:
        """The op's short name (``attention``, ``conv``): the ``<op>`` of its folder."""
        return self.plan.__module__.split(".")[-2]

    def api_function(self) -> Callable:
        """The direct GPU call (imported on first use: it needs the GPU libraries)."""
        public, module = self.api
        return getattr(importlib.import_module(module), public)
