"""FP8 attention's Q/K rotation (``--fp8-rotate-qk``) folded into the projection that computes Q or K, so it costs
nothing at run time: where the rotated tensor comes from ``MatMul(x, W)`` (+ a constant bias) through a Reshape that
splits the last axis into heads x head dim and any Transposes, each read by nothing else, ``W`` and the bias are
multiplied by the rotation per head and the emitted ``MatMul(., R)`` goes. Runs after the graph's cleanup, when the
replaced attention nodes no longer read these tensors. Other rotations (e.g. after RoPE) stay as emitted."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.fp8 import qk_rotation, rotate_heads
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.rewrites._graph import is_op, producer, unique_name


def fold_rotations(graph: gs.Graph) -> int:
    """Fold every foldable emitted Q/K rotation into its projection; how many were folded."""
    folded, taken = 0, set(graph.tensors())
    for node in [n for n in graph.nodes if _is_emitted_rotation(n)]:
        dim = node.inputs[1].shape[0]
        chain = _projection_chain(node.inputs[0], dim)
        if chain is None:
            continue
        matmul, add = chain
        for layer, index in [(matmul, 1)] + ([(add, _constant_index(add))] if add is not None else []):
            values = layer.inputs[index].values
            name = unique_name(f"{layer.inputs[index].name}_rotated", taken)
            layer.inputs[index] = gs.Constant(name, rotate_heads(values, dim).astype(values.dtype))
        reader = node.outputs[0].outputs[0]
        reader.inputs[0] = node.inputs[0]
        node.outputs.clear()
        folded += 1
    if folded:
        graph.cleanup()
    return folded


def _is_emitted_rotation(node: gs.Node) -> bool:
    """MatMul(x, R) with R = fp8.qk_rotation's matrix, read only by a QuantizeLinear read only by FusedAttention's Q or
    K input: what emission.rotate writes."""
    if not is_op(node, "MatMul") or not isinstance(node.inputs[1], gs.Constant) or len(node.outputs[0].outputs) != 1:
        return False
    quantize = node.outputs[0].outputs[0]
    if not is_op(quantize, "QuantizeLinear") or len(quantize.outputs[0].outputs) != 1:
        return False
    fused = quantize.outputs[0].outputs[0]
    if (fused.op != FUSED_ATTENTION.name or fused.domain != FUSED_ATTENTION.domain
            or not any(t is quantize.outputs[0] for t in fused.inputs[:2])):
        return False
    shape = node.inputs[1].shape  # (values read last: a model's own weights may be external data, left unread)
    if len(shape) != 2 or shape[0] != shape[1] or shape[0] & (shape[0] - 1):
        return False
    return np.array_equal(node.inputs[1].values.astype(np.float64), qk_rotation(shape[0])[0])


def _projection_chain(tensor: gs.Tensor, dim: int):
    """(MatMul by a constant 2-D weight, its constant-bias Add or None) that ``tensor`` comes from through Transposes
    and one Reshape splitting only the last axis into [..., heads, ``dim``], every tensor on the way read once; else
    None."""
    reshaped = False
    while True:
        if len(tensor.outputs) != 1:
            return None
        node = producer(tensor)
        if is_op(node, "Transpose"):
            tensor = node.inputs[0]
            continue
        if is_op(node, "Reshape") and not reshaped:
            out, source = node.outputs[0].shape, node.inputs[0].shape
            if not out or not source or len(out) != len(source) + 1 or list(out[:-2]) != list(source[:-1]) or \
                    out[-1] != dim or not isinstance(source[-1], int) or source[-1] % dim:
                return None  # (only the last axis split into heads x dim: the same leading dims, known or named)
            reshaped, tensor = True, node.inputs[0]
            continue
        break
    if not reshaped:
        return None
    add = None
    if is_op(node, "Add") and _constant_index(node) is not None:
        if len(node.inputs[_constant_index(node)].shape) != 1 or len(node.outputs[0].outputs) != 1:
            return None
        add, tensor = node, node.inputs[1 - _constant_index(node)]
        if len(tensor.outputs) != 1:
            return None
        node = producer(tensor)
    if not is_op(node, "MatMul") or not isinstance(node.inputs[1], gs.Constant) or len(node.inputs[1].shape) != 2:
        return None  # (shapes only: the weights' values, maybe external data, are read when folding)
    columns = node.inputs[1].shape[-1]
    if columns % dim or (add is not None and add.inputs[_constant_index(add)].shape[0] != columns):
        return None
    return node, add


def _constant_index(node: gs.Node) -> int | None:
    """Which input of a two-input node is a Constant (None: neither or both)."""
    constants = [i for i, t in enumerate(node.inputs[:2]) if isinstance(t, gs.Constant)]
    return constants[0] if len(constants) == 1 else None
