"""Small hand-built models for the pipeline, verification and CLI tests: an attention written with standard
ops, the same as one FusedAttention node, a model with nothing to fuse."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION

OPSET = 18
SAMPLES = "models/samples"


def model_of(nodes, inputs, outputs, initializers=(), opset=OPSET, custom=False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + ([FUSED_ATTENTION.opset()] if custom else [])
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def attention_io(dtype=TensorProto.FLOAT, heads=2, dim=8):
    """Q, K, V inputs [batch, heads, seq, dim] (BHSD) with symbolic batch/seq, and the output."""
    def value(name, seq):
        return helper.make_tensor_value_info(name, dtype, ["batch", heads, seq, dim])
    return [value("q", "seq"), value("k", "kv_seq"), value("v", "kv_seq")], [value("o", "seq")]


def standard_attention(scale: float = 0.25) -> onnx.ModelProto:
    """softmax(scale * Q K^T) V written with Transpose/MatMul/Mul/Softmax, fp32 BHSD."""
    inputs, outputs = attention_io()
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    scale_init = numpy_helper.from_array(np.array(scale, np.float32), "scale")
    return model_of(nodes, inputs, outputs, [scale_init])


def fused_attention(dtype=TensorProto.FLOAT, mask_dtype=None, key_lengths=False, scale=0.25,
                    causal=0) -> onnx.ModelProto:
    """One FusedAttention node (BHSD) on graph inputs q, k, v [, mask] [, key_lengths]."""
    inputs, outputs = attention_io(dtype)
    names = ["q", "k", "v", "", ""]
    if mask_dtype is not None:
        inputs.append(helper.make_tensor_value_info("mask", mask_dtype, ["batch", 1, "seq", "kv_seq"]))
        names[3] = "mask"
    if key_lengths:
        inputs.append(helper.make_tensor_value_info("key_lengths", TensorProto.INT32, ["batch"]))
        names[4] = "key_lengths"
    while names[-1] == "":
        names.pop()
    node = FUSED_ATTENTION.make_node(names, ["o"], name="attn", layout="BHSD", scale=scale, causal=causal)
    return model_of([node], inputs, outputs, custom=True)


def nothing_to_fuse() -> onnx.ModelProto:
    """x @ W + b, Relu: no attention, no convolution."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y0"]),
             helper.make_node("Relu", ["y0"], ["y"])]
    return model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], weights)
