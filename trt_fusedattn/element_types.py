"""Tensor name -> ONNX element type for a model holding our custom nodes, for the onnxruntime bridge, the TensorRT
layer and the FP8 passes alike: ONNX shape inference cannot see through our nodes, so their outputs are typed by
their op records and inference runs again from there."""
from __future__ import annotations

import onnx
from onnx import helper

from trt_fusedattn import io
from trt_fusedattn.contract import DOMAIN
from trt_fusedattn.errors import FuseError, first_line
from trt_fusedattn.fp8 import numpy_dtype
from trt_fusedattn.tensorrt import PLUGIN_NAMESPACE, PRESENT_INPUTS


def record_of(node: onnx.NodeProto):
    """The op record of one of our custom nodes, or None for any other node."""
    from trt_fusedattn.plugins import OPS
    if node.domain != DOMAIN:
        return None
    return next((op for op in OPS if op.contract.name == node.op_type), None)


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX element type of every tensor of the main graph that inference can type, our nodes' outputs included.
    ``model`` is not changed."""
    work = io.skeleton(model)[0]
    while True:
        try:
            graph = onnx.shape_inference.infer_shapes(work, strict_mode=False).graph
        except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as err:
            raise FuseError(f"ONNX shape inference fails on the model ({first_line(err)}): its declared shapes "
                            f"or types conflict; export it again") from None
        types = {v.name: v.type.tensor_type.elem_type
                 for v in [*graph.input, *graph.value_info, *graph.output] if v.type.tensor_type.elem_type}
        types.update({t.name: t.data_type for t in model.graph.initializer})
        typed = [helper.make_tensor_value_info(out, _output_type(node, op, types), None)
                 for node in work.graph.node if (op := record_of(node)) is not None and node.input[0] in types
                 for out in node.output if out and out not in types]
        if not typed:
            return types
        work.graph.value_info.extend(typed)


def _output_type(node: onnx.NodeProto, op, types: dict[str, int]) -> int:
    """The ONNX element type of a custom node's output: its op record's ``output_dtype`` (FP8 attention writes
    ``output_dtype``, an FP8 conv float16 or e4m3). A node the TensorRT layer prepared lists only the inputs its
    ``present_inputs`` bits name. A node whose dtypes its contract refuses is a one-line error."""
    present = next((a.i for a in node.attribute if a.name == PRESENT_INPUTS), None)
    given = iter(node.input)
    inputs = list(node.input) if present is None else [
        next(given) if present >> i & 1 else "" for i in range(len(op.contract.inputs))]
    dtypes = [helper.tensor_dtype_to_np_dtype(types[n]).name if n in types else None for n in inputs]
    dtypes += [None] * (len(op.contract.inputs) - len(dtypes))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
             if a.name not in (PRESENT_INPUTS, PLUGIN_NAMESPACE)}
    try:
        out = op.output_dtype(dtypes, op.contract.resolve(attrs))
    except ValueError as err:
        raise FuseError(f"node '{node.name[:80]}' ({op.contract.qualified_name}): {first_line(err)}") from None
    return helper.np_dtype_to_tensor_dtype(numpy_dtype(out))
