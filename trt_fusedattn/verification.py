"""Does the fused model compute what the original did? Both run under onnxruntime (CPU) on the same random
inputs; the fused model's custom nodes run the contracts' numpy references (or implementations passed in).

Per output: ``max_abs = max |fused - original|`` and ``max_rel = max_abs / max |original|`` (relative to
the output's largest magnitude, not elementwise, so values near zero do not dominate). An output passes
when ``max_rel <= rtol`` or ``max_abs <= atol``. Default rtol by the output's dtype: float32/float64 1e-4,
float16 1e-2, bfloat16 2e-2 (their rounding alone is 5e-4 and 4e-3 per element, and the original computes
in that precision too); integer and bool outputs must match exactly, as must string and other
non-numeric outputs (compared element by element). ``rel_l2 = ||fused - original|| / ||original||`` is
reported beside them. A float32 output out of the default rtol is judged again at ``rtol + 2e``, ``e`` the
original's own float32 error (its distance from a float64 evaluation of itself, ``float64_original``): two
float32 computations each within ``rtol + e`` of exact arithmetic differ by up to that (``_allow_float32_error``),
unless ``e > MAX_FLOAT32_ERROR * rtol``: an original that unstable (a TopK flipping) would excuse any fault.

FP8: when the fused model has FP8 nodes (a FusedConv with ``input_scale``, a FusedAttention with float8e4m3fn
Q/K/V), the default rtol of every float output is ``FP8_RTOL``: E4M3 keeps 3 mantissa bits (a rounding moves a
value by up to 1/16), and the errors of a deep stack of FP8 layers compound (a random-weight ResNet of 17 FP8
convs: 0.12 of the output's largest magnitude); a wrong scale or a misplaced quantization gives O(1) errors or
saturates, far above it. The numpy references quantize exactly as the kernels do (``trt_fusedattn.fp8``), so
this error is FP8's own: the fusion of a Q/DQ conv model, whose original already computes in FP8, reproduces it
to float rounding (tests). FP8 attention quantizes P before normalizing (exp(s - max) in [0, 1], as a flash
kernel can), where a Q/DQ graph quantizes the normalized softmax: the same FP8 error at a different place, so a
Q/DQ attention model's fusion matches its original to FP8's size, not to float rounding.

When the original model does not run under onnxruntime at the default sizes (an export that baked its
example's sequence length into a Reshape, a conv stack longer than 17 samples), sizes are searched: the
constants of Reshape targets and static output dims (what the export may have baked in), then longer
sequences up to 4096; sizes the user gave (``dims``) are kept; an allocation failure ends the search.
The verification says which sizes it used and why. If none runs, it says what failed (the original, not
the fusion), at which sizes, and what to pass.
Where onnxruntime's CPU kernel refuses a valid standard node (ONNX ``Attention`` with a [B, 1, 1, L]
mask), those nodes run onnx's reference implementation instead, in both models, and the verification
says so.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping

import time

import numpy as np
import onnx

from trt_fusedattn.errors import InputError, VerificationError
from trt_fusedattn.ort_session import RunFailed, run_model
from trt_fusedattn.random_inputs import baked_sizes, dim_roles, graph_inputs, random_inputs
from trt_fusedattn.text_table import format_table

DEFAULT_RTOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
FP8_RTOL = 0.25                                  # default rtol of float outputs of a model with FP8 nodes
LONGER_SEQUENCES = (64, 256, 1024, 4096)         # tried after the baked-in sizes (4096: 1.6 GB of fp32
                                                 # attention scores at batch 2, 12 heads: no further)
MAX_TRIALS, SEARCH_S = 12, 60.0                  # the size search stops after this many runs or seconds
MAX_FLOAT32_ERROR = 10                           # x rtol: a float32 original further from float64 is unstable
MAX_FLOAT64_WEIGHTS = 2**29                      # bytes: in float64, twice that, held ~4 times over by the bridge
REFERENCE_OPS = ("Attention",)                   # standard ops run by onnx's reference when onnxruntime refuses


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
    rel_l2: float = 0.0


@dataclass
class Verification:
    outputs: list[OutputCheck]
    inputs: dict = field(default_factory=dict)   # input name -> shape used
    seed: int | None = None                      # None when the caller gave the inputs
    how: str = ""                                # what differs from the defaults (sizes, evaluation) and why
    original_error: str = ""                     # the original does not run at any size tried
    fused_error: str = ""                        # the fused model does not run where the original does

    @property
    def passed(self) -> bool:
        return not self.original_error and not self.fused_error and all(o.passed for o in self.outputs)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "seed": self.seed, "inputs": self.inputs, "how": self.how,
                "original_error": self.original_error, "fused_error": self.fused_error,
                "outputs": [asdict(o) for o in self.outputs]}

    def table(self) -> str:
        rows = [(o.name, o.dtype, "x".join(map(str, o.shape)), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}",
                 f"{o.rel_l2:.3g}", f"{o.rtol:g}", "ok" if o.passed else "FAIL") for o in self.outputs]
        inputs = ", ".join(f"{k}[{'x'.join(map(str, v))}]" for k, v in self.inputs.items())
        head = f"verification (onnxruntime, original vs fused, inputs {inputs}):"
        lines = [head, *(f"  {line}" for line in (self.how, self.original_error, self.fused_error) if line)]
        header = ("output", "dtype", "shape", "max abs", "max rel", "rel l2", "rtol", "")
        return "\n".join(lines + [format_table(header, rows)])

    def raise_if_failed(self) -> None:
        if self.original_error:
            raise InputError(self.original_error)  # the model, not the fusion: exit 2
        if self.fused_error:
            raise VerificationError(self.fused_error)
        failed = [o for o in self.outputs if not o.passed]
        if failed:
            worst = max(failed, key=lambda o: o.max_rel)
            raise VerificationError(f"fused model differs from the original: output '{worst.name}' max relative "
                                    f"error {worst.max_rel:.3g} > rtol {worst.rtol:g} (max abs {worst.max_abs:.3g}); "
                                    f"{len(failed)} of {len(self.outputs)} outputs out of tolerance")


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float | None = None,
            atol: float = 0.0, fp8: bool = False) -> OutputCheck:
    """The check of one output: ``got`` (fused) against ``want`` (original); ``fp8``: the fused model has FP8
    nodes (the default rtol of a float output is then ``FP8_RTOL``)."""
    want = np.asarray(want)
    dtype = str(want.dtype)
    if rtol is None:
        rtol = FP8_RTOL if fp8 and dtype in DEFAULT_RTOL else DEFAULT_RTOL.get(dtype, 0.0)
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
    norm = float(np.sqrt(np.square(np.where(np.isfinite(b), b, 0.0)).sum()))
    rel_l2 = float(np.sqrt(np.square(diff).sum())) / norm if norm > 0 else max_rel
    return OutputCheck(name, dtype, list(want.shape), max_abs, max_rel, rtol, atol, passed, rel_l2)


def has_fp8_nodes(model: onnx.ModelProto) -> bool:
    """Whether a fused model computes in FP8 somewhere (a FusedConv with an input_scale, a FusedAttention with
    float8e4m3fn Q/K/V, which its q_scale says)."""
    from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
    from trt_fusedattn.plugins.conv.contract import FUSED_CONV

    return any(FUSED_CONV.is_node(node) and FUSED_CONV.node_attributes(node)["input_scale"]
               or FUSED_ATTENTION.is_node(node) and FUSED_ATTENTION.node_attributes(node)["q_scale"]
               for node in model.graph.node)


def _model(model_or_path) -> onnx.ModelProto:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    from trt_fusedattn.io import load_model

    return load_model(model_or_path)[0]


def _large_constant(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The value of a Constant node of at least ``io.EXTERNAL_THRESHOLD`` bytes (a weight), else None."""
    from trt_fusedattn import io

    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1 or \
            node.attribute[0].name != "value":
        return None
    return node.attribute[0].t if io.nbytes(node.attribute[0].t) >= io.EXTERNAL_THRESHOLD else None


def _constants_as_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """An equivalent copy of ``model`` whose weight Constant nodes (onnxscript writes every weight as one) are
    initializers, each copied once; ``model`` itself when it has none. onnxruntime's bridge stubs
    initializers but copies nodes whole: a Phi-2 of 1.3 GB in Constants peaked at 12 GB, as initializers 7."""
    if model.ir_version < 4 or not any(_large_constant(node) for node in model.graph.node):
        return model  # below IR 4 an initializer must also be a graph input
    from trt_fusedattn.io import _copy_fields

    copy = onnx.ModelProto()
    _copy_fields(model, copy, skip="graph")
    _copy_fields(model.graph, copy.graph, skip="node")
    for node in model.graph.node:
        value = _large_constant(node)
        if value is None:
            copy.graph.node.add().CopyFrom(node)
        else:
            weight = copy.graph.initializer.add()
            weight.CopyFrom(value)
            weight.name = node.output[0]
    return copy


def _shapes(feeds: Mapping[str, np.ndarray]) -> dict:
    return {k: list(np.shape(v)) for k, v in feeds.items()}


def _describe(shapes: dict) -> str:
    return ", ".join(f"{k}[{'x'.join(map(str, v))}]" for k, v in shapes.items()) or "no inputs"


def _size_trials(model: onnx.ModelProto, dims: Mapping[str, int] | None):
    """(dims, sizes) to try for ``random_inputs``, the defaults first: then every baked-in size (see
    ``baked_sizes``) for the sequence-like dims, with batch 2 and 1, then longer sequences. Named dims
    the user gave stay as given."""
    user = dict(dims or {})
    yield user, None
    roles = dim_roles(model)
    free = [name for name in roles if name not in user]
    unnamed = any(not d.dim_param and not (d.HasField("dim_value") and d.dim_value >= 0)
                  for v in graph_inputs(model) for d in v.type.tensor_type.shape.dim)
    if not free and not unnamed:
        return
    seen = set()
    for sequence, batch in [*((v, b) for v in baked_sizes(model)[:6] for b in (None, 1)),
                            *((v, None) for v in LONGER_SEQUENCES)]:
        trial = dict(user)
        trial.update({n: sequence for n in free if roles[n] != "batch"})
        trial.update({n: batch for n in free if roles[n] == "batch" and batch})
        sizes = {"sequence": sequence, **({"batch": batch} if batch else {})}
        key = (tuple(sorted(trial.items())), tuple(sorted(sizes.items())))
        if key not in seen:
            seen.add(key)
            yield trial, sizes


def _run_original(model: onnx.ModelProto, feeds, reference: tuple) -> tuple[dict, tuple, str]:
    """The original's outputs, its ``reference`` ops, and a note: when onnxruntime refuses a node of a
    standard op in ``REFERENCE_OPS``, such nodes run onnx's reference instead (raises RunFailed otherwise)."""
    try:
        return run_model(model, feeds, reference_ops=reference), reference, ""
    except RunFailed as err:
        refused = tuple(op for op in REFERENCE_OPS if f"running {op} node" in str(err))
        if not refused or set(refused) <= set(reference):
            raise
        note = (f"ONNX {', '.join(refused)} nodes ran onnx's reference implementation in both models "
                f"(onnxruntime's CPU kernel refuses them: {err})")
        return run_model(model, feeds, reference_ops=reference + refused), reference + refused, note


def _runnable_inputs(model: onnx.ModelProto, seed: int, dims: Mapping[str, int] | None):
    """(feeds, the original's outputs, reference ops, how, error): inputs the original model runs on, at
    the default sizes or the first that runs of ``_size_trials``; ``error`` when none does."""
    failures, reference, notes, start = [], (), [], time.monotonic()
    for trial, sizes in _size_trials(model, dims):
        try:
            feeds = random_inputs(model, seed=seed, dims=trial, sizes=sizes)
        except InputError:
            if not failures:
                raise  # the sizes asked for are too large: say so
            continue
        try:
            want, reference, note = _run_original(model, feeds, reference)
        except RunFailed as err:
            failures.append((_shapes(feeds), str(err)))
            out_of_memory = "alloc" in str(err).lower()  # larger sizes would only need more
            if out_of_memory or len(failures) >= MAX_TRIALS or time.monotonic() - start > SEARCH_S:
                break
            continue
        if failures:
            notes.append(f"the original does not run at {_describe(failures[0][0])} ({failures[0][1]}); "
                         f"verified at the first sizes it runs at")
        return feeds, want, reference, "; ".join(filter(None, [note, *notes])), ""
    (shapes, message), others = failures[0], len(failures) - 1
    named = ", ".join(f"{n}" for n in dim_roles(model)) or "none"
    error = (f"the original model (not the fusion) does not run under onnxruntime at {_describe(shapes)} "
             f"({message})" + (f", nor at {others} other sizes tried" if others else "") +
             f"; give the sizes it was exported for with --dim NAME=SIZE (named dimensions: {named})")
    return None, None, reference, "", error


def verify(original, fused, *, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
           dims: Mapping[str, int] | None = None, rtol: float | None = None, atol: float = 0.0,
           implementations: Mapping | None = None) -> Verification:
    """Run ``original`` and ``fused`` (ModelProtos or paths) on the same inputs and compare every output.

    ``inputs``: name -> array (default: ``random_inputs`` of the original, from ``seed``, with ``dims``
    overriding named dynamic dimensions; other sizes searched when the original does not run at those,
    see the module doc). ``implementations``: contract or op name -> callable for the custom nodes
    (default their numpy references). ``rtol=None``: by dtype (module doc). A model that does not run
    comes back as a failed Verification saying why (``original_error`` or ``fused_error``)."""
    original, fused = _constants_as_initializers(_model(original)), _model(fused)
    used_seed = None if inputs is not None else seed
    if inputs is not None:
        feeds = dict(inputs)
        try:
            want, reference, how = _run_original(original, feeds, ())
        except RunFailed as err:
            return Verification([], _shapes(feeds), None, original_error=(
                f"the original model (not the fusion) does not run under onnxruntime on the inputs given "
                f"({_describe(_shapes(feeds))}: {err}); give inputs it runs on"))
    else:
        feeds, want, reference, how, error = _runnable_inputs(original, seed, dims)
        if error:
            return Verification([], {}, used_seed, original_error=error)
    try:
        got = run_model(fused, feeds, implementations, reference_ops=reference)
    except RunFailed as err:
        return Verification([], _shapes(feeds), used_seed, how, fused_error=(
            f"the fused model does not run under onnxruntime where the original does ({err}); "
            f"this is a fault of the fusion: rerun with --only to leave that family out and report it"))
    fp8 = has_fp8_nodes(fused)
    checks = [compare(name, got.get(name), value, rtol, atol, fp8) for name, value in want.items()]
    if rtol is None and not fp8:
        checks, note = _allow_float32_error(original, feeds, reference, got, want, checks, atol)
        how = "; ".join(filter(None, [how, note]))
    return Verification(checks, _shapes(feeds), used_seed, how)


def _allow_float32_error(original, feeds, reference, got, want, checks, atol) -> tuple[list, str]:
    """Float32 outputs out of the default rtol, judged again with the original's own float32 error e (max
    |float32 - float64 evaluation of the original| over the output's largest magnitude): rtol + 2e, the
    most two float32 computations each within rtol + e of exact arithmetic can differ. A wrong fusion
    differs by O(1), far above it."""
    failed = [c for c in checks if not c.passed and c.dtype == "float32" and
              c.max_rel <= (1 + 2 * MAX_FLOAT32_ERROR) * c.rtol]  # beyond that no allowance could pass it
    if not failed:
        return checks, ""
    from trt_fusedattn import io
    from trt_fusedattn.errors import FuseError
    from trt_fusedattn.float64_original import run_float64

    if io.tensor_bytes(original) > MAX_FLOAT64_WEIGHTS:
        return checks, (f"float32 outputs out of tolerance; the original's {io.tensor_bytes(original) / 2**30:.2g} GiB "
                        f"of weights are too many to evaluate it in float64 here (to tell its own rounding)")
    try:
        exact = run_float64(original, feeds, reference)
    except FuseError as err:
        return checks, f"float32 outputs out of tolerance, and {err}"
    except MemoryError:  # float64 doubles the weights: what is left is the plain check's verdict
        return checks, "float32 outputs out of tolerance, and the original does not fit in memory in float64"
    widened, notes = {}, []
    for check in failed:
        error = compare(check.name, want[check.name], np.asarray(exact[check.name], np.float64), 0.0).max_rel
        if not error <= MAX_FLOAT32_ERROR * check.rtol:
            notes.append(f"output '{check.name}': the float32 original is {error:.2g} of its largest magnitude from "
                         f"its float64 evaluation (unstable at these inputs: a discrete choice or cancellation), so "
                         f"rounding cannot be told from a fault; give --rtol or other inputs")
            continue
        widened[check.name] = compare(check.name, got[check.name], want[check.name], check.rtol + 2 * error, atol)
        notes.append(f"output '{check.name}': the float32 original is {error:.2g} of its largest magnitude from its "
                     f"float64 evaluation, so rtol {check.rtol:g} + 2 x {error:.2g}")
    return [widened.get(c.name, c) for c in checks], "; ".join(notes)
