"""Constant folding before the rewrites: weights written as Constant nodes, as onnxscript writes them (its
rewriter's real-model graphs are tested in test_onnxscript_models.py)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_fusedattn import io
from trt_fusedattn.rewrites._folding import constants_to_initializers
from trt_fusedattn.verification import verify


def _constant_weight_model() -> onnx.ModelProto:
    """y = (x @ W) * 0.5 with W (64x64) and 0.5 as Constant nodes, as onnxscript writes them."""
    rng = np.random.default_rng(0)
    weight = helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(
        rng.standard_normal((64, 64)).astype(np.float32)))
    half = helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float32)))
    nodes = [weight, half, helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Mul", ["xw", "half"], ["y"])]
    graph = helper.make_graph(nodes, "constants", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_constant_nodes_become_initializers_of_an_equivalent_model():
    original = _constant_weight_model()
    moved = onnx.ModelProto()
    moved.CopyFrom(original)
    assert constants_to_initializers(moved, io.EXTERNAL_THRESHOLD) == 1
    assert [n.op_type for n in moved.graph.node] == ["Constant", "MatMul", "Mul"]  # the scalar stays a node
    assert [t.name for t in moved.graph.initializer] == ["w"] and list(moved.graph.initializer[0].dims) == [64, 64]
    onnx.checker.check_model(moved)
    result = verify(original, moved)
    assert result.passed, result.table()
