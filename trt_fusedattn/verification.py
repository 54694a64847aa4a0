"""Does the fused model compute what the original did? Both run under onnxruntime (CPU) on the same random
inputs; the fused model's custom nodes run the contracts' numpy references (or implementations passed in).

Per output: ``max_abs = max |fused - original|`` and ``max_rel = max_abs / max |original|`` (relative to
the output's largest magnitude, not elementwise, so values near zero do not dominate). An output passes
when ``max_rel <= rtol`` or ``max_abs <= atol``. Default rtol by the output's dtype: float32/float64 1e-4,
float16 1e-2, bfloat16 2e-2 (their rounding alone is 5e-4 and 4e-3 per element, and the original computes
in that precision too); integer and bool outputs must match exactly, as must string and other
non-numeric outputs (compared element by element).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np
import onnx

from trt_fusedattn.errors import VerificationError
from trt_fusedattn.ort_session import run_model
from trt_fusedattn.random_inputs import random_inputs

DEFAULT_RTOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


@dataclass
class OutputCheck:
    """One output compared: the fused model's against the original's."""

    name: str
    dtype: str
    shape: list
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    passed: bool


@dataclass
class Verification:
    outputs: list[OutputCheck]
    inputs: dict = field(default_factory=dict)   # input name -> shape used
    seed: int | None = None                      # None when the caller gave the inputs

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "seed": self.seed, "inputs": self.inputs,
                "outputs": [asdict(o) for o in self.outputs]}

    def table(self) -> str:
        from trt_fusedattn.report import _format_table

        rows = [(o.name, o.dtype, "x".join(map(str, o.shape)), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}",
                 f"{o.rtol:g}", "ok" if o.passed else "FAIL") for o in self.outputs]
        inputs = ", ".join(f"{k}[{'x'.join(map(str, v))}]" for k, v in self.inputs.items())
        head = f"verification (onnxruntime, original vs fused, inputs {inputs}):"
        return head + "\n" + _format_table(("output", "dtype", "shape", "max abs", "max rel", "rtol", ""), rows)

    def raise_if_failed(self) -> None:
        failed = [o for o in self.outputs if not o.passed]
        if failed:
            worst = max(failed, key=lambda o: o.max_rel)
            raise VerificationError(f"fused model differs from the original: output '{worst.name}' max relative "
                                    f"error {worst.max_rel:.3g} > rtol {worst.rtol:g} (max abs {worst.max_abs:.3g}); "
                                    f"{len(failed)} of {len(self.outputs)} outputs out of tolerance")


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float | None = None,
            atol: float = 0.0) -> OutputCheck:
    """The check of one output: ``got`` (fused) against ``want`` (original)."""
    want = np.asarray(want)
    dtype = str(want.dtype)
    rtol = DEFAULT_RTOL.get(dtype, 0.0) if rtol is None else rtol
    if got is None or np.shape(got) != want.shape:
        return OutputCheck(name, dtype, list(want.shape), float("inf"), float("inf"), rtol, atol, False)
    if want.dtype.kind not in "biuf" or np.asarray(got).dtype.kind not in "biuf":  # strings, objects
        same = bool(np.array_equal(np.asarray(got), want))
        error = 0.0 if same else float("inf")
        return OutputCheck(name, dtype, list(want.shape), error, error, rtol, atol, same)
    a, b = np.asarray(got, np.float64), want.astype(np.float64)
    same_nan = np.isnan(a) & np.isnan(b)
    diff = np.where(same_nan, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(np.where(np.isfinite(b), b, 0.0)).max()) if b.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    passed = max_rel <= rtol or max_abs <= atol
    return OutputCheck(name, dtype, list(want.shape), max_abs, max_rel, rtol, atol, passed)


def _model(model_or_path) -> onnx.ModelProto:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    from trt_fusedattn.io import load_model

    return load_model(model_or_path)[0]


def verify(original, fused, *, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
           dims: Mapping[str, int] | None = None, rtol: float | None = None, atol: float = 0.0,
           implementations: Mapping | None = None) -> Verification:
    """Run ``original`` and ``fused`` (ModelProtos or paths) on the same inputs and compare every output.

    ``inputs``: name -> array (default: ``random_inputs`` of the original, from ``seed``, with ``dims``
    overriding named dynamic dimensions). ``implementations``: contract or op name -> callable for the
    custom nodes (default their numpy references). ``rtol=None``: by dtype (module doc)."""
    original, fused = _model(original), _model(fused)
    feeds = dict(inputs) if inputs is not None else random_inputs(original, seed=seed, dims=dims)
    want = run_model(original, feeds)
    got = run_model(fused, feeds, implementations)
    checks = [compare(name, got.get(name), value, rtol, atol) for name, value in want.items()]
    return Verification(checks, {k: list(np.shape(v)) for k, v in feeds.items()},
                        None if inputs is not None else seed)
