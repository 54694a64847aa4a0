"""Models that do not run at verification's default sizes (issue 14, item 1): an export that baked its
example's sizes into a Reshape, a conv stack longer than the default sequence, and one no size can run."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from _pipeline_models import model_of


def _reshape_model(input_dims, target, out_dims) -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    return model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_dims)],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)],
                    [numpy_helper.from_array(np.array(target, np.int64), "target")])


def baked_sequence() -> onnx.ModelProto:
    """Sequence-first x[seq, batch, 8] reshaped to [8, 4, 4], as a TorchScript export of
    nn.MultiheadAttention bakes the example's length (8) and batch x heads: runs only at seq 8, batch 2."""
    return _reshape_model(["seq", "batch", 8], [8, 4, 4], [8, 4, 4])


def long_receptive_field(kernel: int = 31) -> onnx.ModelProto:
    """x[batch, 1, samples] through a Conv1d of kernel 31 without padding: needs at least 31 samples."""
    weight = numpy_helper.from_array(np.random.default_rng(14).standard_normal((4, 1, kernel)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    return model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, "samples"])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "frames"])], [weight])


def runs_at_no_size() -> onnx.ModelProto:
    """x[batch, seq, 16] reshaped to [5, 7, 3]: 105 elements, never a multiple of 16."""
    return _reshape_model(["batch", "seq", 16], [5, 7, 3], [5, 7, 3])


def onnx_attention_with_key_mask() -> onnx.ModelProto:
    """ONNX Attention (opset 23) with a boolean [B, 1, 1, L] key-padding mask, as dynamo exports write it:
    onnxruntime's CPU kernel refuses that mask shape at any size."""
    def value(name, dtype, dims):
        return helper.make_tensor_value_info(name, dtype, dims)
    qkv = [value(n, TensorProto.FLOAT, ["batch", 2, "seq", 8]) for n in "qkv"]
    node = helper.make_node("Attention", ["q", "k", "v", "attention_mask"], ["y"], scale=0.25)
    return model_of([node], qkv + [value("attention_mask", TensorProto.BOOL, ["batch", 1, 1, "seq"])],
                    [value("y", TensorProto.FLOAT, ["batch", 2, "seq", 8])], opset=23)
