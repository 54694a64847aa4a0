"""The original model evaluated in float64: how far its own float32 outputs are from exact arithmetic.

Verification compares the fused model with the float32 original, whose rounding is itself an error: a
Whisper encoder with onnxscript's rand() weights (activations ~1e3) is 7.7e-5 of its output's largest
magnitude away from its own float64 evaluation, so two float32 computations of it differ by more than the
default rtol 1e-4 however exact each step is. The float64 copy has every float32 tensor, Cast target and
graph input/output as float64 (subgraphs too); onnxruntime runs it where its CPU kernels take doubles, onnx's
reference implementation otherwise (onnxruntime has no float64 Conv).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from trt_fusedattn.errors import FuseError


def _to_double(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == TensorProto.FLOAT and tensor.data_location != TensorProto.EXTERNAL:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))


def _graph_to_double(graph: onnx.GraphProto) -> None:
    for tensor in graph.initializer:
        _to_double(tensor)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                _to_double(attribute.t)
            elif attribute.type == onnx.AttributeProto.GRAPH:
                _graph_to_double(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    _graph_to_double(subgraph)
            elif attribute.name in ("to", "dtype") and attribute.i == TensorProto.FLOAT:  # Cast, RandomNormal...
                attribute.i = TensorProto.DOUBLE
    for value in [*graph.input, *graph.output]:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    del graph.value_info[:]  # inferred float32 types would contradict


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64 wherever it computed in float32 (weights loaded in memory)."""
    from trt_fusedattn import io

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _graph_to_double(io.load_weights(copy).graph)
    return copy


def run_float64(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], reference_ops=()) -> dict[str, np.ndarray]:
    """Outputs of ``model`` computed in float64 on ``feeds`` (float32 feeds widened); raises FuseError when
    neither onnxruntime nor onnx's reference implementation can evaluate it."""
    from trt_fusedattn.ort_session import run_model

    double = as_float64(model)
    feeds = {k: v.astype(np.float64) if np.asarray(v).dtype == np.float32 else v for k, v in feeds.items()}
    try:
        return run_model(double, feeds, reference_ops=reference_ops)
    except FuseError:  # a float32-only CPU kernel (Conv): onnx's reference evaluates every op
        pass
    from onnx.reference import ReferenceEvaluator

    try:
        outputs = ReferenceEvaluator(double).run(None, dict(feeds))
    except Exception as err:  # the reference's own exception types, unbounded
        raise FuseError(f"the original cannot be evaluated in float64 ({type(err).__name__}: {err})"[:300]) from err
    return dict(zip([o.name for o in double.graph.output], outputs))
