"""FP8 versions of the sample models for the FP8 tests: calibrated Q/DQ models in Model Optimizer's pattern
(Q/DQ around each Conv that has an FP8 kernel; around MatMuls for the attention samples), built with onnx."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from trt_fusedattn.calibration import calibration_batches, channel_scales, record_amax, scale_of
from trt_fusedattn.element_types import element_types
from trt_fusedattn.qdq import ConvScales, insert_conv_qdq, with_qdq_opset

SAMPLES = Path(__file__).resolve().parents[1] / "models" / "samples"
CONV_SAMPLES = ("resnet_dynamo", "resnet_bn_torchscript", "mobilenetv2_dynamo", "mobilenetv2_torchscript",
                "vit_dynamo", "vit_torchscript")
ATTENTION_SAMPLES = ("bert_sdpa_dynamo", "bert_sdpa_torchscript", "llama_gqa_dynamo", "llama_gqa_torchscript")
# Head dim 64 versions (models/samples/fp8/, models.generate.FP8_ATTENTION_SAMPLES): what the FP8 kernel takes.
FP8_ATTENTION_SAMPLES = ("bert_sdpa_hd64_torchscript", "bert_sdpa_hd64_dynamo", "llama_gqa_hd64_torchscript",
                         "llama_gqa_hd64_fp16_torchscript", "vit_hd64_torchscript")


def sample(name: str) -> onnx.ModelProto:
    return onnx.load(SAMPLES / ("fp8" if "_hd64_" in name else "") / f"{name}.onnx")


def fp8_convs(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Convs that have an FP8 kernel (not depthwise)."""
    weights = {t.name: t for t in model.graph.initializer}
    group = {n.name: next((a.i for a in n.attribute if a.name == "group"), 1) for n in model.graph.node}
    return [n for n in model.graph.node if n.op_type == "Conv" and n.input[1] in weights
            and not (weights[n.input[1]].dims[1] == 1 and group[n.name] > 1)]


def conv_qdq_version(model: onnx.ModelProto, samples: int = 8, **options) -> onnx.ModelProto:
    """``model`` with FP8 Q/DQ around each FP8-capable Conv, scales calibrated by max on random inputs."""
    convs = fp8_convs(model)
    amax = record_amax(model, [n.input[0] for n in convs], calibration_batches(model, samples))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return insert_conv_qdq(model, {n.name: ConvScales(scale_of(amax[n.input[0]]), channel_scales(weights[n.input[1]]))
                                   for n in convs}, **options)


def matmul_qdq_version(model: onnx.ModelProto, samples: int = 4) -> onnx.ModelProto:
    """``model`` with FP8 Q/DQ on both inputs of every MatMul (Model Optimizer's FP8 GEMM/BMM pattern), one
    calibrated scale per tensor in the tensor's dtype (QuantizeLinear's x and scale share it); attention
    probabilities (a Softmax output) take amax 1 (scale 1/448), as their range is [0, 1] whatever the calibration
    saw."""
    tensors = sorted({i for n in model.graph.node if n.op_type == "MatMul" for i in n.input})
    amax = record_amax(model, tensors, calibration_batches(model, samples))
    producers = {o: n for n in model.graph.node for o in n.output}

    def probabilities(name: str) -> bool:  # a Softmax output, maybe through the sdpa NaN guard or a Cast
        for _ in range(4):
            node = producers.get(name)
            if node is None or node.op_type == "Softmax":
                return node is not None
            name = node.input[-1] if node.op_type == "Where" else node.input[0]
        return False
    amax.update({name: 1.0 for name in amax if probabilities(name)})
    elem_types = element_types(model)
    model = with_qdq_opset(model)
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.zeros((), ml_dtypes.float8_e4m3fn), "fp8_zero"))
    nodes, done = [], set()
    for node in graph.node:
        if node.op_type == "MatMul":
            for name in node.input:
                if name not in done:
                    done.add(name)
                    graph.initializer.append(numpy_helper.from_array(
                        np.array(scale_of(amax[name] or 1.0), helper.tensor_dtype_to_np_dtype(  # x's dtype
                            elem_types.get(name, onnx.TensorProto.FLOAT))), f"{name}_scale"))
                    nodes += [helper.make_node("QuantizeLinear", [name, f"{name}_scale", "fp8_zero"], [f"{name}_q"]),
                              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", "fp8_zero"],
                                               [f"{name}_dq"])]
            node.input[:] = [f"{name}_dq" for name in node.input]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return model
