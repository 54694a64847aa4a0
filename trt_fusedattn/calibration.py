"""FP8 calibration: the amax of each tensor our FP8 kernels quantize, from the original model run under
onnxruntime on calibration inputs, turned into the scales the op contracts take.

Sources (``--calib``): ``samples.npz`` (one array per graph input; an array with one more axis than the input
holds samples along axis 0, one run each) or ``random:N`` (N runs of ``random_inputs``, seeds from
``RANDOM_SEED``: not verification's default seeds, so a verification is not run on a calibration input).
Methods (``--calib-method``): ``max`` (the largest |x| seen) or ``percentile[:P]`` (the P-th percentile of |x|
over every element seen, default 99.99, from a histogram whose range doubles as larger values arrive: bounded
memory, resolution of 1/2048 of the range). Weights are constants: their per-output-channel amax is exact.

Scales are amax / 448 (E4M3's largest finite value), so amax lands on the top of E4M3's range. What is FP8 today
(plugins/conv/contract.py): FusedConv X per tensor (``input_scale``), W per output channel (W float8_e4m3fn, the
scale in the ``scale`` input). FusedAttention (plugins/attention/contract.py): Q, K, V per tensor, asked by the
attention rewrite (``calibrated_amax``) for the sites the FP8 kernel takes, Q and K after the rotation that
``--fp8-rotate-qk`` puts before their quantization (``Rotated``); P's amax is 1 by construction (p_scale 1/448).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NamedTuple

import numpy as np
import onnx

from trt_fusedattn.errors import InputError
from trt_fusedattn.fp8 import E4M3_MAX, rotate_heads, to_e4m3

METHODS = ("max", "percentile")
DEFAULT_PERCENTILE = 99.99
DEFAULT_SOURCE = "random:16"
_BINS = 2048
RANDOM_SEED = 1_000_000
FLOAT8_IR_VERSION = 9  # the first IR version with float8 tensors


@dataclass(frozen=True)
class Method:
    """How an activation's amax is taken: ``max`` or ``percentile`` (with its P)."""

    name: str = "max"
    percentile: float = DEFAULT_PERCENTILE

    def __str__(self) -> str:
        return self.name if self.name == "max" else f"percentile:{self.percentile:g}"


def parse_method(text: str) -> Method:
    """``max``, ``percentile`` or ``percentile:P`` (0 < P <= 100)."""
    name, _, value = text.partition(":")
    if name not in METHODS or (name == "max" and value):
        raise InputError(f"--calib-method {text[:40]!r}: choose max, percentile or percentile:P (e.g. percentile:99.9)")
    if not value:
        return Method(name)
    try:
        p = float(value)
    except ValueError:
        p = math.nan
    if not 0 < p <= 100:
        raise InputError(f"--calib-method {text[:40]!r}: the percentile must be a number in (0, 100], e.g. 99.99")
    return Method(name, p)


class Amax:
    """Running amax of one tensor: the max, and for percentiles a histogram of |x| over [0, range)."""

    def __init__(self, method: Method):
        self.method, self.max, self.count = method, 0.0, 0
        self.hist, self.range = np.zeros(_BINS, np.int64), 0.0

    def add(self, x: np.ndarray) -> None:
        x = np.abs(np.asarray(x, np.float64)).ravel()
        x = x[np.isfinite(x)]
        if not x.size:
            return
        self.max, self.count = max(self.max, float(x.max())), self.count + x.size
        if self.method.name != "percentile":
            return
        if self.range == 0.0:
            self.range = self.max if self.max > 0 else 1.0
        while self.max >= self.range:  # double the range: merge bins pairwise, the upper half empties
            self.hist = np.concatenate([self.hist.reshape(-1, 2).sum(axis=1), np.zeros(_BINS // 2, np.int64)])
            self.range *= 2
        self.hist += np.bincount(np.minimum((x / self.range * _BINS).astype(np.int64), _BINS - 1), minlength=_BINS)

    def value(self) -> float:
        if self.method.name != "percentile" or self.count == 0:
            return self.max
        rank = self.method.percentile / 100.0 * self.count
        bin_ = int(np.searchsorted(np.cumsum(self.hist), rank))
        return min(self.max, (bin_ + 1) * self.range / _BINS)  # the bin's upper edge, never above the max


class Rotated(NamedTuple):
    """A tensor whose amax is taken after its head-dim axis (``axis``, of size ``dim`` or heads x ``dim``) is
    rotated by ``fp8.qk_rotation(dim)``: what an FP8 attention site with a rotated Q or K quantizes."""

    name: str
    axis: int
    dim: int

    def of(self, x: np.ndarray) -> np.ndarray:
        return rotate_heads(np.moveaxis(np.asarray(x), self.axis, -1), self.dim)


def scale_of(amax: float) -> float:
    """The per-tensor E4M3 scale of a tensor whose amax is ``amax`` (> 0)."""
    return float(np.float32(amax / E4M3_MAX))


def channel_scales(w: np.ndarray) -> np.ndarray:
    """Per-output-channel (axis 0) E4M3 scales of weights, float32; a channel of zeros gets scale 1."""
    amax = np.abs(np.asarray(w, np.float64)).reshape(w.shape[0], -1).max(axis=1)
    return np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)


def quantize_weights(w: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``e4m3(w / scale[k])`` per output channel (axis 0), saturating, rounding to nearest even."""
    return to_e4m3(w, np.asarray(scales, np.float64).reshape(-1, *[1] * (w.ndim - 1)))


def parse_source(text: str) -> str | int:
    """``random:N`` -> N; otherwise the path of an .npz file (checked to exist)."""
    if text.startswith("random:"):
        count = text.split(":", 1)[1]
        if not count.isdigit() or not 1 <= int(count) <= 100_000:
            raise InputError(f"--calib {text[:40]!r}: random:N takes N from 1 to 100000 (e.g. random:16)")
        return int(count)
    if not Path(text).is_file():
        raise InputError(f"--calib {text[:200]}: no such file; give an .npz of input arrays or random:N")
    return text


def calibration_batches(model: onnx.ModelProto, source: str | int, dims: Mapping | None = None) -> list[dict]:
    """The feeds of each calibration run (see module doc), checked against the model's inputs."""
    from trt_fusedattn.random_inputs import graph_inputs, random_inputs

    if isinstance(source, int):
        return [random_inputs(model, seed=RANDOM_SEED + i, dims=dims) for i in range(source)]
    inputs = {v.name: v for v in graph_inputs(model)}
    try:
        with np.load(source, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as err:
        raise InputError(f"--calib {source}: not a readable .npz ({str(err)[:120]}); save samples with "
                         f"numpy.savez(path, **{{input_name: array}})") from None
    missing, unknown = sorted(set(inputs) - set(arrays)), sorted(set(arrays) - set(inputs))
    if missing or unknown:
        raise InputError(f"--calib {source}: arrays {sorted(arrays)} do not match the model's inputs {sorted(inputs)}"
                         f" ({'missing ' + missing[0] if missing else 'unknown ' + unknown[0]}); name each array "
                         f"after its input")
    stacked = {name: len(inputs[name].type.tensor_type.shape.dim) + 1 == arrays[name].ndim for name in arrays}
    if len(set(stacked.values())) > 1:
        raise InputError(f"--calib {source}: some arrays hold a stack of samples (one axis more than the input) "
                         f"and some do not; stack all or none")
    if not any(stacked.values()):
        return [arrays]
    counts = {len(a) for a in arrays.values()}
    if len(counts) > 1:
        raise InputError(f"--calib {source}: the stacked arrays hold different sample counts {sorted(counts)}")
    return [{name: a[i] for name, a in arrays.items()} for i in range(counts.pop())]


class _ProgressBar:
    """``calibrating [#####     ] 5/10`` on stderr, redrawn in place; nothing when quiet."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.quiet = total, quiet or total < 1

    def show(self, done: int) -> None:
        if self.quiet:
            return
        filled = 30 * done // self.total
        end = "\n" if done == self.total else ""
        print(f"\rfuse-onnx: calibrating [{'#' * filled}{' ' * (30 - filled)}] {done}/{self.total}", end=end,
              file=sys.stderr, flush=True)


def record_amax(model: onnx.ModelProto, tensors: list, batches: list[dict], method: Method = Method(),
                quiet: bool = True) -> dict:
    """The amax of each tensor of ``model`` over the calibration runs (onnxruntime, CPU), keyed as asked: a name, or
    a ``Rotated`` name whose values are rotated first."""
    from trt_fusedattn.ort_session import run_model

    if not tensors:
        return {}
    probed = onnx.ModelProto()
    probed.CopyFrom(model)
    outputs = {o.name for o in probed.graph.output}
    names = dict.fromkeys(t.name if isinstance(t, Rotated) else t for t in tensors)
    probed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names if name not in outputs)
    observers = {t: Amax(method) for t in tensors}
    bar = _ProgressBar(len(batches), quiet)
    bar.show(0)
    for done, feeds in enumerate(batches, 1):
        results = run_model(probed, feeds)
        for t, observer in observers.items():
            observer.add(t.of(results[t.name]) if isinstance(t, Rotated) else results[t])
        bar.show(done)
    return {t: observer.value() for t, observer in observers.items()}


def amax_over(model: onnx.ModelProto, tensors: list, batches: list[dict], method: Method = Method(),
              quiet: bool = True) -> dict:
    """``record_amax``, with the one InputError of a model that does not run on its calibration inputs."""
    from trt_fusedattn.ort_session import RunFailed

    try:
        return record_amax(model, tensors, batches, method, quiet)
    except RunFailed as err:
        raise InputError(f"FP8 calibration: the original model does not run on the calibration inputs ({err}); "
                         f"give its sizes with --dim NAME=SIZE, or samples it runs on with --calib samples.npz"
                         ) from None


def calibrated_amax(model: onnx.ModelProto, source: str | int, method: Method, dims: Mapping | None, quiet: bool,
                    tensors: list) -> dict:
    """The amax of ``tensors`` of ``model`` over the calibration inputs of ``source``: what the attention rewrite
    asks for the Q, K and V of its sites (``functools.partial`` of the first five arguments)."""
    batches = calibration_batches(model, parse_source(source) if isinstance(source, str) else source, dims)
    return amax_over(model, tensors, batches, method, quiet)


def fp8_conv_problem(node: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto]) -> str:
    """Why a FusedConv node cannot run FP8 (empty when it can)."""
    from trt_fusedattn.plugins.conv.contract import FUSED_CONV

    attrs = FUSED_CONV.node_attributes(node)
    if attrs["input_scale"]:
        return "already FP8"
    if node.input[1] not in weights:
        return "weights are not a constant initializer"
    if len(node.input) > 3 and node.input[3]:
        return "has a per-channel scale input already"
    if weights[node.input[1]].dims[-1] == 1 and attrs["group"] > 1:
        return "depthwise (group == C): FusedConv has no FP8 depthwise kernel, kept in its dtype"
    return ""


def make_fp8_conv(model: onnx.ModelProto, node: onnx.NodeProto, input_scale: float) -> np.ndarray:
    """Turn one FusedConv node of ``model`` FP8 (contract: W e4m3 per output channel with its scales in the
    ``scale`` input, X quantized with ``input_scale``); returns the weight scales."""
    from onnx import numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float64)
    scales = channel_scales(w)
    inputs = list(node.input) + [""] * (4 - len(node.input))
    model.graph.initializer.remove(weights[node.input[1]])
    model.graph.initializer.extend([numpy_helper.from_array(quantize_weights(w, scales), node.input[1]),
                                    numpy_helper.from_array(scales, f"{node.name}.scale")])
    inputs[3] = f"{node.name}.scale"
    model.ir_version = max(model.ir_version, FLOAT8_IR_VERSION)
    del node.input[:]
    node.input.extend(inputs)
    for attribute in [a for a in node.attribute if a.name == "input_scale"]:
        node.attribute.remove(attribute)
    node.attribute.append(onnx.helper.make_attribute("input_scale", input_scale))
    return scales


def calibrate(original: onnx.ModelProto, fused: onnx.ModelProto, sites: list, source: str | int = DEFAULT_SOURCE,
              method: Method = Method(), dims: Mapping | None = None, quiet: bool = True) -> list[str]:
    """Make every FusedConv of ``fused`` that can run FP8 do so, with scales calibrated on ``original``; the
    sites' details say each one's scales (or why it stays in its dtype). Returns notes for the report."""
    from trt_fusedattn.plugins.conv.contract import FUSED_CONV

    weights = {t.name: t for t in fused.graph.initializer}
    by_node = {site.node: site for site in sites if site.fused}
    known = {name for node in original.graph.node for name in node.output} | {i.name for i in original.graph.input}
    candidates = []
    for node in fused.graph.node:
        if not FUSED_CONV.is_node(node):
            continue
        problem = fp8_conv_problem(node, weights) or ("" if node.input[0] in known else
                                                      f"its input {node.input[0]} is not a tensor of the original")
        if problem == "already FP8":
            continue  # from the model's own Q/DQ
        if problem:
            by_node[node.name].details["fp8"] = f"no: {problem}"
        else:
            candidates.append(node)
    notes = []
    attention = [site for site in sites if site.fused and site.family == "attention"]
    fp8_attention = sum(not str(site.details.get("fp8", "no")).startswith("no") for site in attention)
    if attention:
        notes.append(f"--precision fp8: {fp8_attention} of {len(attention)} attention sites FP8 (Q, K, V per tensor, "
                     f"P at 1/448; scales in each site's fp8 detail); the others keep their dtype, their fp8 detail "
                     f"says why")
    batches = calibration_batches(original, parse_source(source) if isinstance(source, str) else source, dims)
    if not candidates and not fp8_attention:  # the samples were still checked against the model's inputs
        return notes
    amax = amax_over(original, [node.input[0] for node in candidates], batches, method, quiet) if candidates else {}
    for node in candidates:
        site = by_node[node.name]
        if not amax[node.input[0]] > 0:
            site.details["fp8"] = f"no: {node.input[0]} is 0 on every calibration input (no scale to take)"
            continue
        w_scale = make_fp8_conv(fused, node, scale_of(amax[node.input[0]]))
        site.details["fp8"] = (f"x_amax={amax[node.input[0]]:.4g} input_scale={scale_of(amax[node.input[0]]):.4g} "
                               f"w_scale={w_scale.min():.3g}..{w_scale.max():.3g}")
    described = f"{len(batches)} random inputs" if isinstance(source, int) or str(source).startswith("random:") \
        else f"{len(batches)} samples of {source}"
    notes.append(f"FP8 calibration: {described}, method {method}; scales in each site's fp8 detail")
    if isinstance(source, int) or str(source).startswith("random:"):
        notes.append("random calibration inputs give scales for random data: calibrate with real samples "
                     "(--calib samples.npz) for deployment")
    return notes
