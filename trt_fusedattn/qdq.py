"""FP8 QuantizeLinear/DequantizeLinear pairs written into a model, in the pattern NVIDIA Model Optimizer's FP8
ONNX export writes around a Conv: X through Q -> DQ (float8e4m3fn, one scale), W as a float8e4m3fn constant
through DQ with one scale per output channel (axis 0).

Two uses: the FP8-emulating twin of an original model, which verification compares a calibrated FP8 fused
model with (the same roundings at the same places, so what is left is the fusion's own error), and the Q/DQ
models the tests feed to the rewrite.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

QDQ_OPSET = 19  # the first opset whose QuantizeLinear/DequantizeLinear take float8e4m3fn

# Reductions whose ``axes`` became an input in opset 18; every other op of opsets 13-17 keeps its meaning at 19
# (the attributes added since default to the old behaviour).
_AXES_TO_INPUT = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
                  "ReduceProd", "ReduceSumSquare"}


@dataclass(frozen=True)
class ConvScales:
    """FP8 scales of one Conv: X per tensor, W per output channel (of the Conv's own W, before any folding)."""

    x: float
    w: np.ndarray


def with_qdq_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` importing at least opset ``QDQ_OPSET`` (converted by onnx's version converter)."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version >= QDQ_OPSET:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    return onnx.version_converter.convert_version(model, QDQ_OPSET)


def declare_opset(model: onnx.ModelProto, version: int = QDQ_OPSET) -> int | None:
    """Make ``model`` (changed in place) import the default-domain opset ``version`` when it imports an older one,
    moving reductions' ``axes`` attributes to inputs as opset 18 wants; returns the old version (None when nothing
    changed). A model with subgraphs is refused with a one-line ValueError (their reductions are not walked)."""
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version >= version:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in model.graph.node
           for a in n.attribute):
        raise ValueError(f"the model has opset {opset.version} and subgraphs, and FP8 needs opset {version}: "
                         f"export it with opset {version}+")
    for node in model.graph.node:
        axes = next((a for a in node.attribute if a.name == "axes"), None)
        if node.domain in ("", "ai.onnx") and node.op_type in _AXES_TO_INPUT and axes is not None:
            name = f"{node.name or node.output[0]}_axes"
            model.graph.initializer.append(numpy_helper.from_array(np.array(list(axes.ints), np.int64), name))
            node.attribute.remove(axes)
            node.input.extend([name])
    old, opset.version = opset.version, version
    return old


def insert_conv_qdq(model: onnx.ModelProto, scales: dict[str, ConvScales], *, quantize_weights: bool = False,
                    ) -> onnx.ModelProto:
    """A copy of ``model`` with FP8 Q/DQ on the X and W of each Conv named in ``scales``.

    W becomes a float8e4m3fn initializer read by a DequantizeLinear (Model Optimizer's compressed form), or
    with ``quantize_weights`` its float initializer read by QuantizeLinear -> DequantizeLinear (the uncompressed
    form). A tensor read by several of the Convs gets one Q/DQ pair, as the export writes it."""
    from trt_fusedattn.calibration import quantize_weights as to_e4m3

    model = with_qdq_opset(model)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    zero = numpy_helper.from_array(np.zeros((), ml_dtypes.float8_e4m3fn), "fp8_zero_point")
    graph.initializer.append(zero)
    nodes, quantized = [], {}
    for node in graph.node:
        conv = scales.get(node.name) if node.op_type == "Conv" else None
        if conv is None:
            nodes.append(node)
            continue
        x = node.input[0]
        if x not in quantized:
            quantized[x] = f"{x}_dq"
            graph.initializer.append(numpy_helper.from_array(np.array(conv.x, np.float32), f"{x}_scale"))
            nodes += [helper.make_node("QuantizeLinear", [x, f"{x}_scale", zero.name], [f"{x}_q"],
                                       name=f"{x}_QuantizeLinear"),
                      helper.make_node("DequantizeLinear", [f"{x}_q", f"{x}_scale", zero.name], [quantized[x]],
                                       name=f"{x}_DequantizeLinear")]
        w_name = node.input[1]
        w = numpy_helper.to_array(weights[w_name])
        w_scale = np.asarray(conv.w, np.float32)
        graph.initializer.append(numpy_helper.from_array(w_scale, f"{node.name}_w_scale"))
        zeros = numpy_helper.from_array(np.zeros(len(w_scale), ml_dtypes.float8_e4m3fn), f"{node.name}_w_zero_point")
        graph.initializer.append(zeros)
        if quantize_weights:
            nodes.append(helper.make_node("QuantizeLinear", [w_name, f"{node.name}_w_scale", zeros.name],
                                          [f"{node.name}_w_q"], name=f"{node.name}_w_QuantizeLinear", axis=0))
        else:
            graph.initializer.append(numpy_helper.from_array(to_e4m3(w, w_scale), f"{node.name}_w_q"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{node.name}_w_q", f"{node.name}_w_scale", zeros.name],
                                      [f"{node.name}_w_dq"], name=f"{node.name}_w_DequantizeLinear", axis=0))
        node.input[0], node.input[1] = quantized[x], f"{node.name}_w_dq"
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def unabsorbed_quantizers(model: onnx.ModelProto) -> dict[str, int]:
    """The FP8 QuantizeLinear -> DequantizeLinear pairs left in a fused model, counted by the op that reads the
    DequantizeLinear (MatMul, Softmax's consumers, ...): what the report names as left to TensorRT."""
    fp8 = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT8E4M3FN}
    quantized = {n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"
                 and (len(n.input) > 2 and n.input[2] in fp8 or
                      any(a.name == "output_dtype" and a.i == TensorProto.FLOAT8E4M3FN for a in n.attribute))}
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in quantized}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in dequantized:
                readers[node.op_type] = readers.get(node.op_type, 0) + 1
    return readers
