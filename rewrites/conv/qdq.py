"""FP8 Q/DQ around Conv (NVIDIA Model Optimizer's FP8 ONNX export): absorbed into an FP8 ``FusedConv``.

The pattern: X -> QuantizeLinear -> DequantizeLinear -> Conv (float8e4m3fn, one scale, saturating) and W as a
float8e4m3fn constant (or a float constant through QuantizeLinear) -> DequantizeLinear (one scale, or one per
output channel on axis 0) -> Conv. Two steps around the conv family's rewrite:

- ``dequantize_weights`` (before): a Conv whose W is such a DequantizeLinear gets the dequantized constant, so
  the conv rewrite matches and folds its epilogue as for any Conv; the e4m3 values and scales are kept;
- ``absorb`` (after): each fused node whose Conv had FP8 Q/DQ takes X from before the QuantizeLinear (float16 X
  with C/G % 16 == 0: the QuantizeLinear's e4m3 output, the kernel's fast path) with ``input_scale`` = its scale,
  W back in e4m3 and its scales (times the per-channel factor the epilogue folded into W, BatchNorm's; a negative
  one flips e4m3 signs, exactly) in the ``scale`` input: the FP8 contract computes exactly what the Q/DQ graph did.
  A Conv left unfused gets its DequantizeLinear back.

A Q/DQ pattern that cannot be absorbed stays as it is, and the conv site says why in ``details["fp8"]``.
Q/DQ around attention's MatMuls and Softmax stays too: FusedAttention has no FP8 contract yet.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_fusedattn.rewrites import CannotFuse, Site
from trt_fusedattn.rewrites._graph import is_op, is_present, producer

_FOLD_TOLERANCE = 1e-5  # W after the epilogue fold must be the e4m3 values times one factor per channel


@dataclass
class QuantizedWeights:
    """A Conv's FP8 weights as the model gave them: e4m3 values (float64), scale per output channel, and the
    DequantizeLinear output the Conv read."""

    values: np.ndarray
    scale: np.ndarray
    dequantized: gs.Tensor


def _constant(tensor: gs.Tensor | None) -> np.ndarray | None:
    """A constant's values without gs's cast of float8 (read from the ONNX tensor itself)."""
    if not isinstance(tensor, gs.Constant):
        return None
    values = getattr(tensor, "_values", None)
    if isinstance(values, LazyValues):
        return numpy_helper.to_array(values.tensor)
    return np.asarray(tensor.values)


def _is_e4m3(array: np.ndarray | None) -> bool:
    return array is not None and array.dtype.name == "float8_e4m3fn"


def fp8_scale(node: gs.Node, axis_size: int | None) -> np.ndarray:
    """The scale of an FP8 QuantizeLinear/DequantizeLinear (per tensor, or per axis-0 channel when
    ``axis_size`` is given); raises CannotFuse with the reason it is not one we absorb."""
    scale = _constant(node.inputs[1]) if len(node.inputs) > 1 else None
    zero = _constant(node.inputs[2]) if len(node.inputs) > 2 and is_present(node.inputs[2]) else None
    return fp8_quantizer_scale(node.op, node.name, scale, zero, node.attrs, axis_size)


def fp8_quantizer_scale(op: str, name: str, scale: np.ndarray | None, zero: np.ndarray | None, attrs: dict,
                        axis_size: int | None) -> np.ndarray:
    """``fp8_scale`` on the node's values (its scale and zero point as arrays, None when not constant; its
    attributes), so that the passes on onnx-graphsurgeon graphs and on plain ModelProtos check alike."""
    if op == "QuantizeLinear" and not (_is_e4m3(zero) or attrs.get("output_dtype", 0) == onnx.TensorProto.FLOAT8E4M3FN):
        raise CannotFuse(f"{name} quantizes to "
                         f"{zero.dtype if zero is not None else 'uint8'}, not float8e4m3fn (INT8 is left to TensorRT)")
    if zero is not None and np.any(np.asarray(zero, np.float32) != 0):
        raise CannotFuse(f"{name} has a nonzero zero point (FP8 has none)")
    if attrs.get("saturate", 1) != 1:
        raise CannotFuse(f"{name} does not saturate (saturate=0); the FP8 kernels saturate")
    if attrs.get("block_size", 0):
        raise CannotFuse(f"{name} is blocked quantization; FusedConv takes per-tensor X, per-channel W")
    if scale is None or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise CannotFuse(f"{name}'s scale is not a positive constant")
    if scale.size == 1:
        return np.full(axis_size or 1, float(scale.reshape(-1)[0]))
    if axis_size is None or scale.shape != (axis_size,) or attrs.get("axis", 1) != 0:
        raise CannotFuse(f"{name}'s scale {list(scale.shape)} is not per tensor"
                         + ("" if axis_size is None else " nor per output channel (axis 0)"))
    return scale.astype(np.float64)


def _weights(conv: gs.Node) -> QuantizedWeights | None:
    """The FP8 weights of a Conv whose W is a DequantizeLinear (None when it is not one)."""
    dq = producer(conv.inputs[1])
    if not is_op(dq, "DequantizeLinear"):
        return None
    source = dq.inputs[0]
    values = _constant(source)
    if values is None and is_op(producer(source), "QuantizeLinear"):  # uncompressed: Q(float W) -> DQ
        quantize = producer(source)
        weights = _constant(quantize.inputs[0])
        if weights is None:
            raise CannotFuse(f"{quantize.name} quantizes weights that are not constant")
        scale = fp8_scale(quantize, weights.shape[0])
        if not np.array_equal(scale, fp8_scale(dq, weights.shape[0])):
            raise CannotFuse(f"{quantize.name} and {dq.name} have different scales")
        from trt_fusedattn.calibration import quantize_weights

        values = quantize_weights(weights, scale)  # W / scale exactly (float16 W: onnxruntime's opset-19 kernel
        # agrees; at opset 23 it divides in float16 and rounds some e4m3 ties the other way)
    if not _is_e4m3(values):
        raise CannotFuse(f"weights are quantized by {dq.name} from {values.dtype if values is not None else 'a tensor'}"
                         f", not float8e4m3fn constants (INT8 Q/DQ is left to TensorRT)")
    return QuantizedWeights(values.astype(np.float64), fp8_scale(dq, values.shape[0]), conv.inputs[1])


def dequantize_weights(graph: gs.Graph) -> dict[int, QuantizedWeights | str]:
    """Give each Conv with FP8 DequantizeLinear weights its dequantized constant (see module doc); id(Conv) ->
    its FP8 weights, or the reason they are not absorbed."""
    found = {}
    for conv in [node for node in graph.nodes if is_op(node, "Conv")]:
        try:
            weights = _weights(conv)
        except CannotFuse as reason:
            found[id(conv)] = str(reason)
            continue
        if weights is None:
            continue
        shape = (-1,) + (1,) * (weights.values.ndim - 1)
        dequantized = (weights.values * weights.scale.reshape(shape)).astype(np.float32)
        conv.inputs[1] = gs.Constant(f"{weights.dequantized.name}_dequantized", dequantized)
        found[id(conv)] = weights
    return found


def _input_quantizer(x: gs.Tensor) -> tuple[gs.Tensor, float]:
    """(the tensor before the Q/DQ pair, its scale) when X is an FP8 Q -> DQ output; CannotFuse otherwise."""
    dq = producer(x)
    if not is_op(dq, "DequantizeLinear"):
        raise CannotFuse("X is not quantized (no QuantizeLinear -> DequantizeLinear before the Conv): weight-only "
                         "FP8 has no kernel, the weights run dequantized")
    quantize = producer(dq.inputs[0])
    if not is_op(quantize, "QuantizeLinear"):
        raise CannotFuse(f"{dq.name} reads {dq.inputs[0].name}, not a QuantizeLinear's output")
    scale, dq_scale = fp8_scale(quantize, None), fp8_scale(dq, None)
    if scale[0] != dq_scale[0]:
        raise CannotFuse(f"{quantize.name} and {dq.name} have different scales")
    return quantize.inputs[0], float(np.float32(scale[0]))


def _kernel_input(dequantized: gs.Tensor, x: gs.Tensor, channels_per_group: int) -> gs.Tensor:
    """What the FP8 node reads: the QuantizeLinear's e4m3 output when X is float16 and C/G is a multiple of 16 (the
    kernel's e4m3-X path: A moves as bytes with no quantize pass, NOTES.md's fast FP8 case; Y stays float16), else
    X before the pair, quantized in the kernel (an e4m3 X would turn a float32 or bfloat16 output into float16)."""
    if x.dtype is not None and np.dtype(x.dtype) == np.float16 and channels_per_group % 16 == 0:
        return producer(dequantized).inputs[0]
    return x


def absorb(graph: gs.Graph, sites: list[Site], quantized: dict[int, QuantizedWeights | str]) -> None:
    """Make FP8 each fused conv site whose Conv had FP8 Q/DQ (see module doc); record the outcome in its
    details. Convs left unfused get their DequantizeLinear weights back."""
    convs = {node.name: node for node in graph.nodes if is_op(node, "Conv")}
    nodes = {node.name: node for node in graph.nodes}
    for site in sites:
        if site.family != "conv":
            continue
        conv = convs.get(site.anchor)
        weights = quantized.get(id(conv)) if conv is not None else None
        if not site.fused:
            if isinstance(weights, QuantizedWeights):
                conv.inputs[1] = weights.dequantized
            elif isinstance(weights, str):
                site.details["fp8"] = f"no: {weights}"
            continue
        node = nodes[site.node]
        try:
            x, input_scale = _input_quantizer(node.inputs[0])
            if isinstance(weights, str):
                raise CannotFuse(weights)
            if weights is None:
                raise CannotFuse("X is quantized but W is not (no DequantizeLinear on the weights)")
            scale = _folded_scale(node, weights)
        except CannotFuse as reason:
            if isinstance(weights, QuantizedWeights) or producer(node.inputs[0]) is not None and \
                    is_op(producer(node.inputs[0]), "DequantizeLinear"):
                site.details["fp8"] = f"no: {reason}"
            continue
        node.inputs[0] = _kernel_input(node.inputs[0], x, weights.values.shape[1])
        sign = np.where(scale < 0, -1.0, 1.0).reshape(-1, *[1] * (weights.values.ndim - 1))  # e4m3 is symmetric
        scale = np.abs(scale)
        values = np.ascontiguousarray((weights.values * sign).transpose(0, *range(2, weights.values.ndim), 1))
        node.inputs[1] = gs.Constant(node.inputs[1].name, values.astype(ml_dtypes.float8_e4m3fn))
        while len(node.inputs) < 4:
            node.inputs.append(gs.Variable.empty())
        node.inputs[3] = gs.Constant(f"{node.name}.scale", scale.astype(np.float32))
        node.attrs["input_scale"] = input_scale
        site.details["fp8"] = (f"Q/DQ{' e4m3 X' if node.inputs[0] is not x else ''} input_scale={input_scale:.4g} "
                               f"w_scale={scale.min():.3g}..{scale.max():.3g}")


def _folded_scale(node: gs.Node, weights: QuantizedWeights) -> np.ndarray:
    """Per-channel scale of the fused node's W relative to the e4m3 values: the Q/DQ scale times the factor the
    epilogue folded in (1 without BatchNorm); CannotFuse when W is not such a per-channel multiple."""
    fused = np.asarray(node.inputs[1].values, np.float64)
    values = weights.values.transpose(0, *range(2, weights.values.ndim), 1)
    if fused.shape != values.shape:
        raise CannotFuse(f"fused weights {list(fused.shape)} do not match the quantized ones {list(values.shape)}")
    flat, base = fused.reshape(len(fused), -1), values.reshape(len(values), -1)
    norms = (base * base).sum(axis=1)
    scale = np.where(norms > 0, (flat * base).sum(axis=1) / np.where(norms > 0, norms, 1), weights.scale)
    if np.abs(flat - scale[:, None] * base).max() > _FOLD_TOLERANCE * max(np.abs(flat).max(), 1e-30):
        raise CannotFuse("the epilogue folded into W is not one factor per output channel of the e4m3 weights")
    return scale
