"""Constant folding before the rewrites, and the real-model graphs onnxscript's own rewriter is tested on
(onnxscript.rewriter.models: weights as Constant nodes, literals as CastLike, KV caches, rotary embeddings)."""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trt_fusedattn import io
from trt_fusedattn.pipeline import fuse
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


ONNXSCRIPT_MODELS = ("_bart_encoder", "_whisper_encoder")  # the small ones (the decoders hold 0.2-1.3 GB)


@pytest.mark.parametrize("name", ONNXSCRIPT_MODELS)
def test_onnxscript_rewriter_model_every_site_fused_and_verified(name):
    """Every attention site and conv fused, in under 5 s of rewrite. The Whisper encoder's weights are
    rand() in [0, 1): activations in the thousands make its float32 original differ from the float64 references
    of the custom ops by ~1e-4, hence rtol 1e-3."""
    models = pytest.importorskip("onnxscript.rewriter.models", reason="onnxscript's rewriter test models")
    import importlib

    original = importlib.import_module(f"{models.__name__}.{name}").make_model_with_random_weights()
    start = time.perf_counter()
    fused, report = fuse(original)
    seconds = time.perf_counter() - start
    assert report.sites and all(s.fused for s in report.sites), [(s.anchor, s.reason) for s in report.sites]
    assert {s.family for s in report.sites} == ({"attention", "conv"} if "whisper" in name else {"attention"})
    assert seconds < 5.0
    result = verify(original, fused, rtol=1e-3)
    assert result.passed, result.table()
