"""Q, K, V and the output traced from the MatMuls to the tensors FusedAttention reads and writes: FP8 Q/DQ pairs
(their scales kept for an FP8 node), scalar scales (folded into ``scale``), K/V head repeats (GQA, undone), head
split/merge Transposes, the sdpa export's Reshape
of the output to its own shape."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites import CannotFuse
from trt_fusedattn.rewrites._graph import (constant_value, consumers, is_graph_output, is_op, number, numpy_dtype,
                                           permutation, producer, static_value)
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.fp8 import peel_qdq
from trt_fusedattn.rewrites.attention.match import (HEAD_SPLIT, KEY_TRANSPOSE, SPLIT_KEY_TRANSPOSE, Match, Operand,
                                                    Output)

FLOAT_DTYPES = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}


def scalar_factor(node: gs.Node, tensor_side: int, shapes: TensorShapes) -> float | None:
    """For Mul/Div of a tensor by a one-element constant (or a number computed from static dims): the factor
    the tensor is multiplied by, else None."""
    value = number(static_value(node.inputs[1 - tensor_side], dim_of=shapes.dim))
    if value is None:
        return None
    if is_op(node, "Mul"):
        return value
    if is_op(node, "Div") and tensor_side == 0 and value != 0:
        return 1.0 / value
    return None


def peel_scale(tensor: gs.Tensor, shapes: TensorShapes) -> tuple[gs.Tensor, float]:
    """Follow Mul/Div by scalar constants upward: the unscaled tensor and the product of the factors."""
    factor = 1.0
    while True:
        node = producer(tensor)
        if not (is_op(node, "Mul") or is_op(node, "Div")):
            return tensor, factor
        for side in (0, 1):
            f = scalar_factor(node, side, shapes)
            if f is not None and static_value(node.inputs[side], dim_of=shapes.dim) is None:
                factor *= f
                tensor = node.inputs[side]
                break
        else:
            return tensor, factor


def _unrepeat_heads(tensor: gs.Tensor, axis: int, shapes: TensorShapes) -> tuple[gs.Tensor, int]:
    """Undo a K/V head repeat on ``axis`` (the heads axis of a rank-4 tensor): Reshape(Expand|Tile(Unsqueeze(x,
    axis+1))) merging the new axis into the heads, or Tile on the heads axis of a single head (MQA).
    Returns (tensor with the original heads, repeat count or None when only the graph's shapes at run time
    know it); a repeat in h % H order raises CannotFuse."""
    node = producer(tensor)
    if is_op(node, "Tile"):
        reps = constant_value(node.inputs[1])
        if reps is None or reps.size != 4 or any(int(r) != 1 for i, r in enumerate(reps) if i != axis):
            return tensor, 1
        heads = shapes.dim(node.inputs[0], axis)
        if heads != 1:
            raise CannotFuse(f"Tile '{node.name}' repeats {heads or 'an unknown number of'} K/V heads in h % H_kv "
                             f"order; FusedAttention groups query head h with key/value head h // (H_q / H_kv)")
        return node.inputs[0], int(reps[axis])
    if not is_op(node, "Reshape") or shapes.rank(tensor) not in (None, 4):
        return tensor, 1
    grown = producer(node.inputs[0])
    if not (is_op(grown, "Expand") or is_op(grown, "Tile")):
        return tensor, 1
    unsq = producer(grown.inputs[0])
    if not is_op(unsq, "Unsqueeze"):
        return tensor, 1
    axes = constant_value(unsq.inputs[1]) if len(unsq.inputs) > 1 else np.asarray(unsq.attrs.get("axes", []))
    if axes is None or axes.size != 1 or int(axes.reshape(())) % 5 != axis + 1:
        return tensor, 1
    source = unsq.inputs[0]
    repeats = shapes.dim(grown.outputs[0], axis + 1)
    if repeats is None and is_op(grown, "Tile"):
        reps = constant_value(grown.inputs[1])
        repeats = int(reps[axis + 1]) if reps is not None and reps.size == 5 else None
    if repeats is None:
        expand_shape = constant_value(grown.inputs[1])
        repeats = int(expand_shape[axis + 1]) if expand_shape is not None and expand_shape.size == 5 else None
    heads, merged = shapes.dim(source, axis), shapes.dim(tensor, axis)
    if repeats is None and heads and merged:
        repeats = merged // heads
    if repeats is not None and heads and merged and heads * repeats != merged:
        raise CannotFuse(f"Reshape '{node.name}' does not merge the repeated K/V heads into the heads axis")
    for a in (0, 2, 3) if axis == 1 else (0, 1, 3):
        before, after = shapes.dim(source, a), shapes.dim(tensor, a)
        if before is not None and after is not None and before != after:
            raise CannotFuse(f"Reshape '{node.name}' changes more than the heads axis of the repeated K/V")
    return source, repeats


def peel_operand(tensor: gs.Tensor, shapes: TensorShapes) -> tuple[gs.Tensor, float, float | None]:
    """An FP8 Q/DQ pair and scalar scales peeled off a MatMul operand: (tensor, scale factor, FP8 scale). A factor
    c > 0 below a pair of scale s folds into the attention scale like any other, the pair's scale becoming s / c:
    e4m3(c x / s) = e4m3(x / (s / c)) up to float rounding (torchscript's sdpa scales Kᵀ after its head repeat)."""
    tensor, fp8_scale = peel_qdq(tensor)
    below, factor = peel_scale(tensor, shapes)
    if fp8_scale is None:
        return below, factor, None
    return (below, factor, fp8_scale / factor) if factor > 0 else (tensor, 1.0, fp8_scale)


def below_pair(fp8_scale: float | None, factor: float) -> float | None:
    """The FP8 scale of a pair above a scalar ``factor`` peeled later, seen from below it: s / c (see
    ``peel_operand``); a factor <= 0 there is CannotFuse (no positive scale quantizes the same values)."""
    if fp8_scale is None or factor == 1.0:
        return fp8_scale
    if factor <= 0:
        raise CannotFuse(f"a factor {factor:g} scales an attention operand below its FP8 Q/DQ pair")
    return fp8_scale / factor


def with_fp8_scale(operand: Operand, fp8_scale: float | None, factor: float = 1.0) -> Operand:
    """``operand`` carrying the FP8 scale of a Q/DQ pair peeled above it, ``factor`` (the scalar scales peeled
    between the pair and the operand) folded in; two pairs on one operand: CannotFuse."""
    if fp8_scale is not None:
        if operand.fp8_scale is not None:
            raise CannotFuse("an attention operand passes two FP8 Q/DQ pairs; FusedAttention quantizes it once")
        operand.fp8_scale = below_pair(fp8_scale, factor)
    return operand


def trace_bhsd(tensor: gs.Tensor, allow_repeat: bool, shapes: TensorShapes) -> tuple[Operand, float]:
    """A [B,H,S,D] operand traced upward: an FP8 Q/DQ pair, scalar scales, K/V head repeats, the head split
    Transpose."""
    tensor, factor, fp8_scale = peel_operand(tensor, shapes)
    repeats = 1
    if allow_repeat:
        if fp8_scale is not None:  # a pair above the Cast an fp16 export puts on V for a float32 P V quantizes V itself
            tensor = peel_float_cast(tensor)
        tensor, repeats = _unrepeat_heads(tensor, 1, shapes)
        tensor, more = peel_scale(tensor, shapes)
        factor, fp8_scale = factor * more, below_pair(fp8_scale, more)
    operand = Operand(bhsd=tensor, repeats=repeats, fp8_scale=fp8_scale)
    split = producer(tensor)
    if permutation(split) == HEAD_SPLIT and shapes.rank(split.inputs[0]) in (None, 4):
        operand.bshd = split.inputs[0]
        if allow_repeat and repeats == 1:  # heads repeated before the split: [B,S,H,D] on axis 2
            source, repeats = _unrepeat_heads(operand.bshd, 2, shapes)
            if repeats != 1:
                operand = Operand(bshd=source, repeats=repeats, fp8_scale=fp8_scale)
    return operand, factor


def trace_keys(kt: gs.Tensor, shapes: TensorShapes) -> tuple[Operand, float]:
    """The keys from the right operand of Q·Kᵀ ([B,H,D,S])."""
    kt, factor, fp8_scale = peel_operand(kt, shapes)
    node = producer(kt)
    perm = permutation(node)
    if perm == KEY_TRANSPOSE:
        keys, more = trace_bhsd(node.inputs[0], True, shapes)
        return with_fp8_scale(keys, fp8_scale, more), factor * more
    if perm == SPLIT_KEY_TRANSPOSE:
        source, more, inner = peel_operand(node.inputs[0], shapes)
        source, repeats = _unrepeat_heads(source, 2, shapes)
        return with_fp8_scale(Operand(bshd=source, repeats=repeats, fp8_scale=inner), fp8_scale, more), factor * more
    return Operand(kt=kt, fp8_scale=fp8_scale), factor


def trace_output(out: gs.Tensor, graph: gs.Graph, match: Match, shapes: TensorShapes) -> Output:
    """The output in BHSD and, when its readers are head-merge Transposes (after Reshapes to its own shape, as the
    sdpa export writes) and Shape nodes, its BSHD form."""
    result = Output(bhsd=out, producer=producer(out))
    tensor, bypassed, shape_readers = out, [], []
    while not is_graph_output(tensor, graph):
        readers = consumers(tensor)
        shape_readers += [n for n in readers if is_op(n, "Shape")]
        others = [n for n in readers if not is_op(n, "Shape")]
        if len(others) == 1 and _keeps_output_shape(others[0], tensor, match, shapes):
            bypassed.append(others[0])
            tensor = others[0].outputs[0]
            continue
        if others and all(permutation(n) == HEAD_SPLIT for n in others):
            result.merges, result.bshd = others, others[0].outputs[0]
            result.bypassed, result.shape_readers = bypassed, shape_readers
        break
    return result


def _keeps_output_shape(node: gs.Node, tensor: gs.Tensor, match: Match, shapes: TensorShapes) -> bool:
    """Whether ``node`` is a Reshape of the [B,H,Lq,Dv] output to [B,H,Lq,Dv]: each target dim a constant equal
    to the static dim, a dim read by Shape from a tensor known to share it (Q, V, the output), or the one -1."""
    if not is_op(node, "Reshape") or shapes.rank(node.outputs[0]) not in (None, 4):
        return False
    q, v = match.q.bhsd, match.v.bhsd
    sources = [((tensor, 0), (q, 0), (v, 0)), ((tensor, 1), (q, 1)), ((tensor, 2), (q, 2)), ((tensor, 3), (v, 3))]
    pieces = _shape_pieces(node.inputs[1])
    if pieces is None or len(pieces) != 4 or sum(p == -1 for p in pieces) > 1:
        return False
    for position, piece in enumerate(pieces):
        if isinstance(piece, tuple):
            if not any(piece[0] is t and piece[1] == axis for t, axis in sources[position] if t is not None):
                return False
        elif piece != -1 and piece != shapes.dim(tensor, position) and not (piece == 0
                                                                             and not node.attrs.get("allowzero", 0)):
            return False
    return True


def _shape_pieces(tensor: gs.Tensor) -> list | None:
    """A 1-D shape tensor as its elements: ints for constants, (tensor, axis) for dims read with Shape; else None."""
    value = constant_value(tensor)
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    node = producer(tensor)
    if is_op(node, "Concat"):
        parts = [_shape_pieces(t) for t in node.inputs]
        return None if any(p is None for p in parts) else [piece for part in parts for piece in part]
    if is_op(node, "Unsqueeze") or is_op(node, "Reshape"):
        inner = _shape_pieces(node.inputs[0])
        return inner if inner is not None and len(inner) == 1 else None
    if is_op(node, "Gather") and is_op(producer(node.inputs[0]), "Shape"):
        shape_node, index = producer(node.inputs[0]), constant_value(node.inputs[1])
        if index is None or index.size != 1 or shape_node.attrs.get("start", 0) != 0:
            return None
        return [(shape_node.inputs[0], int(index.reshape(-1)[0]) % 4)]
    return None


def peel_float_cast(tensor: gs.Tensor) -> gs.Tensor:
    """The input of a Cast between float types (fp16 exports cast V up for the MatMul), else ``tensor``."""
    node = producer(tensor)
    if is_op(node, "Cast") and is_float(numpy_dtype(node.inputs[0])) and is_float(numpy_dtype(tensor)):
        return node.inputs[0]
    return tensor


def is_float(dtype) -> bool:
    """Whether a numpy dtype is a float type (float16/32/64, bfloat16)."""
    return dtype is not None and (dtype in FLOAT_DTYPES or dtype.name == "bfloat16")
