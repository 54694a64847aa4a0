"""Constants folded before the families match, so that each sees a constant where the graph computes one from
constants alone (``fold_cast_likes``, ``fold_constants``); and weights held by Constant nodes moved into
initializers, so that a pass never copies them (``constants_to_initializers``)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.reference import ReferenceEvaluator

from trt_fusedattn import io
from trt_fusedattn.rewrites._graph import (NONDETERMINISTIC, constant_nbytes, constant_value, is_op, is_present,
                                           is_standard, numpy_dtype, producer, replace_tensor, unique_name)

# Quantization nodes are the model's instructions to TensorRT (this MatMul's weights in FP8/INT8), not values to
# precompute; folding them would also round differently from onnxruntime (onnx's reference QuantizeLinear).
NEVER_FOLDED = NONDETERMINISTIC | {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def fold_cast_likes(graph: gs.Graph) -> int:
    """Replace each CastLike of a constant (of any size), whose target dtype is known, by the cast constant: how
    onnxscript writes literals and weights (``Div(x, 1.41)`` is ``Div(x, CastLike(1.41, x))``, which would also
    count as one more reader of ``x``). Returns how many."""
    folded, taken = 0, None
    for node in list(graph.nodes):
        if not is_op(node, "CastLike") or numpy_dtype(node.inputs[1]) is None or len(node.outputs) != 1:
            continue
        value = constant_value(node.inputs[0])
        if value is None:
            continue
        taken = taken if taken is not None else set(graph.tensors())
        out = node.outputs[0]
        replace_tensor(out, gs.Constant(unique_name(f"{out.name}_folded", taken),
                                        value.astype(numpy_dtype(node.inputs[1]))), graph)
        node.inputs.clear()
        node.outputs.clear()
        graph.nodes.remove(node)
        folded += 1
    return folded


def fold_constants(graph: gs.Graph, limit: int = 1 << 16) -> int:
    """Replace each tensor computed from small constants only (inputs under ``limit`` bytes; Shape of a tensor
    whose shape is static counts as one) by its value, evaluated once with onnx's reference runtime: the
    ``Abs(Cast([1, 32, 1]))`` shapes, ``CastLike`` literals and ``Shape`` arithmetic onnxscript and the exporters
    write, which shape inference does not follow. Returns how many tensors became constants."""
    known, nodes = set(), []  # ids of tensors constant so far; the nodes computing them
    for node in graph.nodes:  # models are topologically sorted
        if not is_standard(node) or node.op in NEVER_FOLDED or not node.outputs:
            continue
        if node.op == "Shape" and _static_shape(node.inputs[0]):
            pass
        elif not all(not is_present(t) or id(t) in known or _small_constant(t, limit) for t in node.inputs):
            continue
        nodes.append(node)
        known.update(id(t) for t in node.outputs)
    wanted = [t for node in nodes for t in node.outputs if not isinstance(t, gs.Constant) and _read_outside(t, known)
              and not is_op(node, "Constant")]
    if not wanted:
        return 0
    values = _evaluate(nodes, wanted, graph)
    if values is None:
        return 0
    taken = set(graph.tensors())
    for tensor, value in zip(wanted, values):
        replace_tensor(tensor, gs.Constant(unique_name(f"{tensor.name}_folded", taken), np.asarray(value)), graph)
    folded = {id(node) for node in nodes if not is_op(node, "Constant")}  # Constants may have other readers
    graph.nodes = [node for node in graph.nodes if id(node) not in folded]
    return len(wanted)


def _evaluate(nodes: list, outputs: list, graph: gs.Graph) -> list | None:
    """The values of ``outputs`` of the constant subgraph ``nodes`` (Shape nodes read the static shapes)."""
    copies, stubs = [], {}
    for node in nodes:
        if node.op == "Shape":  # its input, maybe not constant, as a zero tensor of its static shape
            source = node.inputs[0]
            if id(source) not in stubs:
                stubs[id(source)] = gs.Constant(f"{source.name}__shape_only",
                                                np.zeros(source.shape, numpy_dtype(source) or np.float32))
            copies.append(gs.Node("Shape", name=node.name, attrs=dict(node.attrs), inputs=[stubs[id(source)]],
                                  outputs=list(node.outputs)))
        else:
            copies.append(node)
    sub = gs.Graph(nodes=copies, outputs=outputs, opset=graph.opset)
    try:
        model = gs.export_onnx(sub, do_type_check=False)
        return ReferenceEvaluator(model).run(None, {})
    except Exception:  # noqa: BLE001 - an op the reference runtime lacks: nothing is folded
        return None
    finally:
        for copy, node in zip(copies, nodes):
            if copy is not node:
                copy.inputs.clear()
                copy.outputs.clear()


def _static_shape(tensor: gs.Tensor) -> bool:
    shape = tensor.shape
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape) and \
        int(np.prod(shape, dtype=np.int64)) < (1 << 16)


def _small_constant(tensor: gs.Tensor, limit: int) -> bool:
    if isinstance(tensor, gs.Constant):
        return constant_nbytes(tensor) < limit
    node = producer(tensor)
    return is_op(node, "Constant") and constant_value(tensor) is not None and constant_value(tensor).nbytes < limit


def _read_outside(tensor: gs.Tensor, known: set) -> bool:
    """Whether a node that is not folded, or the graph's output, reads ``tensor``."""
    return bool(tensor.outputs) and any(not all(id(o) in known for o in reader.outputs) for reader in tensor.outputs)


def constants_to_initializers(model: onnx.ModelProto, threshold: int) -> int:
    """Move the value of each main-graph Constant node of at least ``threshold`` bytes into an initializer of the
    node's output name and drop the node (an equivalent model): the pass then stubs, keeps and writes those weights
    as it does initializers, instead of copying them with the nodes (onnxscript writes every weight as a
    Constant). Returns how many moved."""
    graph, moved, kept = model.graph, 0, []
    for node in graph.node:
        value = node.attribute[0].t if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and \
            len(node.attribute) == 1 and node.attribute[0].name == "value" else None
        if value is None or io.nbytes(value) < threshold:
            kept.append(node)
            continue
        tensor = graph.initializer.add()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        moved += 1
    if moved:
        del graph.node[:]
        graph.node.extend(kept)
    return moved

