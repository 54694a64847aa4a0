"""Attention family: each Softmax(scale·Q·Kᵀ + mask)·V subgraph and each ONNX ``Attention`` node becomes one
``trt_fusedattn::FusedAttention`` node.

Sites are matched by dataflow, not by names: a Softmax over the last axis whose input comes, through scalar
scales, additive or boolean masks and Casts, from a rank-4 MatMul, and whose output reaches (through Casts,
Dropout and the sdpa NaN guard) the left operand of a second MatMul.
- Scales on the scores or on Q and K (constants, or 1/sqrt(D) computed from static dims) fold into ``scale``.
  Static dims come from the recorded shapes, else onnxruntime's symbolic shape inference, else Reshape targets.
- Kᵀ forms are undone (Transpose(0,2,3,1) of [B,S,H,D] keys, Transpose(0,1,3,2) of [B,H,S,D] keys); K/V head
  repeats (Expand/Tile of an inserted axis then Reshape, Tile of one head) are undone: K/V enter with H_kv heads.
- Masks: constant causal triangles, Trilu of ones (or of -inf: torch's square subsequent mask) and Range
  comparisons (alone or And-ed with other masks) become ``causal`` + ``causal_alignment``; all-pass constants vanish; Where(keep, S, fill) passes the boolean;
  additive masks pass as they are (cast to Q's dtype), but Where(keep, 0, -inf) forms pass their boolean.
  A mask filled with a finite value (finfo.min) stays additive even when it holds a causal part: rows with no
  visible key then average V as the original does, where a boolean or causal mask gives 0.
- The layout (BSHD or BHSD) is the one needing the fewest new Transposes: head split/merge Transposes (and the
  sdpa export's Reshape of the output to its own shape) are absorbed.
- ONNX Attention (opset 23+): 3-D or 4-D inputs, scale, is_causal (top-left), bool or float attn_mask,
  nonpad_kv_seqlen (as ``key_lengths``); past KV, present outputs in use, softcap and sliding windows are
  reported unsupported.
A site whose checks fail (shapes, dtypes, a head dim the kernels are not built for) is left as it was and
reported with one reason.
"""
from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, HEAD_DIMS
from trt_fusedattn.rewrites import Site
from trt_fusedattn.rewrites._graph import (consumers, constant_value, is_graph_output, is_present, names_in_use,
                                           number, producer, scalar_value, static_value, symbolic_dims, unique_name,
                                           weightless_copy)

FAMILY = "attention"
HEAD_SPLIT = (0, 2, 1, 3)           # BSHD <-> BHSD, its own inverse
KEY_TRANSPOSE = (0, 1, 3, 2)        # BHSD keys -> Kᵀ
SPLIT_KEY_TRANSPOSE = (0, 2, 3, 1)  # BSHD keys -> Kᵀ in one step
MASKED_FILL_LIMIT = -1.0e4          # a fill at or below this removes a key from the softmax (exp underflows)
_FLOAT_DTYPES = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}
_SCORE_STEPS = {"Cast", "Mul", "Div", "Add", "Where"}


class _Skip(Exception):
    """A site check failed; the message is the one reason reported."""


def _is_op(node: gs.Node | None, op: str) -> bool:
    return node is not None and node.op == op and node.domain in (None, "", "ai.onnx")


def _perm(node: gs.Node | None) -> tuple | None:
    """The permutation of a Transpose node, else None."""
    return tuple(node.attrs.get("perm", ())) if _is_op(node, "Transpose") else None


class _InferredDims:
    """Dims onnxruntime's symbolic shape inference finds where the recorded shapes (onnx's inference) have none,
    e.g. the head dim after a Slice of a packed QKV projection. Inferred on first use, from the graph as it was
    when the rewrite began."""

    def __init__(self, graph: gs.Graph):
        self.model, self.dims = weightless_copy(graph), None

    def of(self, tensor: gs.Tensor) -> list | None:
        if self.dims is None:
            self.dims = symbolic_dims(self.model)
        return self.dims.get(tensor.name)

    def reported(self, tensor: gs.Tensor) -> list | None:
        """The dims a Site shows: recorded, with unknown ones named by inference when it has run already."""
        recorded, inferred = _shape(tensor), (self.dims or {}).get(tensor.name)
        if recorded is None or inferred is None or len(inferred) != len(recorded):
            return _listed(recorded if recorded is not None else inferred)
        return _listed([r if isinstance(r, int) or i is None else i for r, i in zip(recorded, inferred)])


_INFERRED: ContextVar[_InferredDims | None] = ContextVar("attention_inferred_dims", default=None)


def _shape(tensor: gs.Tensor) -> list | None:
    return None if tensor.shape is None else list(tensor.shape)


def _rank(tensor: gs.Tensor) -> int | None:
    if tensor.shape is not None:
        return len(tensor.shape)
    inferred = _INFERRED.get().of(tensor) if _INFERRED.get() else None
    return None if inferred is None else len(inferred)


def _dtype(tensor: gs.Tensor):
    return None if tensor.dtype is None else np.dtype(tensor.dtype) if not isinstance(tensor.dtype, int) \
        else np.dtype(helper.tensor_dtype_to_np_dtype(tensor.dtype))


def _dim(tensor: gs.Tensor, axis: int, infer: bool = True):
    """A static dim of a tensor (int), recorded or (``infer``) found by symbolic inference; None when unknown or
    symbolic."""
    for shape in (_shape(tensor), _INFERRED.get().of(tensor) if infer and _INFERRED.get() else None):
        if shape is not None and -len(shape) <= axis < len(shape):
            value = shape[axis]
            if isinstance(value, int) and value >= 0:
                return value
        if not infer:
            return None
    return _reshape_target_dim(tensor, axis)


def _reshape_target_dim(tensor: gs.Tensor, axis: int) -> int | None:
    """The dim a Reshape sets from a static element of its target, e.g. embed_dim // heads that torch's
    MultiheadAttention export computes from a static input dim (where shape inference gives up)."""
    node = producer(tensor)
    while node is not None and node.op in ("Mul", "Div", "Add", "Sub", "Cast") and node.domain in (None, "", "ai.onnx"):
        # elementwise with one-element operands keeps the shape of the other operand
        larger = [t for t in node.inputs if _shape(t) is None or any(d != 1 for d in _shape(t))]
        if len(larger) != 1:
            return None
        node = producer(larger[0])
    if not _is_op(node, "Reshape"):
        return None
    concat = producer(node.inputs[1])
    parts = concat.inputs if _is_op(concat, "Concat") else [node.inputs[1]]
    lengths = [_dim(part, 0, infer=False) for part in parts]
    if None in lengths:
        return None
    position = axis % sum(lengths)
    for part, length in zip(parts, lengths):
        if position < length:
            value = static_value(part)
            dim = int(value.reshape(-1)[position]) if value is not None else None
            return dim if dim is not None and dim > 0 else None
        position -= length
    return None


# ----------------------------------------------------------------------------------------------------------
# What a match found: operands in the forms the graph holds them, the mask, the scale


@dataclass
class _Operand:
    """Q, K or V as the graph holds it: [B,H,S,D] (``bhsd``), [B,S,H,D] (``bshd``), keys as [B,H,D,S]
    (``kt``), or [B,S,H*D] with ``heads`` heads (``flat``, the 3-D ONNX Attention form)."""

    bhsd: gs.Tensor | None = None
    bshd: gs.Tensor | None = None
    kt: gs.Tensor | None = None
    flat: gs.Tensor | None = None
    heads: int | None = None
    repeats: int | None = 1  # K/V heads repeated this many times by the graph (GQA, None: unknown), undone

    def any(self) -> gs.Tensor:
        return next(t for t in (self.bshd, self.bhsd, self.kt, self.flat) if t is not None)

    def cost(self, layout: str) -> int:
        """Transposes needed to hand this operand over in ``layout``."""
        return 0 if getattr(self, layout.lower()) is not None else 1


@dataclass
class _Output:
    """The attention output: the tensor consumers read ([B,H,S,D] or, for 3-D Attention, [B,S,H*D]) and the
    [B,S,H,D] tensor of a head-merge Transpose reading it, when all of its readers are such Transposes."""

    bhsd: gs.Tensor | None = None
    bshd: gs.Tensor | None = None
    flat: gs.Tensor | None = None
    producer: gs.Node | None = None
    merges: list = field(default_factory=list)  # head-merge Transposes absorbed in BSHD
    bypassed: list = field(default_factory=list)  # Reshapes of the output to its own shape, between it and merges
    shape_readers: list = field(default_factory=list)  # Shape nodes reading the output (or a bypassed Reshape)

    def cost(self, layout: str) -> int:
        if self.flat is not None:
            return 0
        return 0 if layout == "BHSD" or self.bshd is not None else 1


@dataclass
class _Match:
    anchor: gs.Node
    q: _Operand
    k: _Operand
    v: _Operand
    out: _Output
    scale: float = 0.0                 # 0: the contract's 1/sqrt(D)
    float_masks: list = field(default_factory=list)
    keep_masks: list = field(default_factory=list)  # (tensor, negate): boolean, True = attend (after negate)
    causal: int = 0
    causal_alignment: str = "top_left"
    key_lengths: gs.Tensor | None = None   # valid keys per batch (int64 [B] from ONNX Attention's nonpad_kv_seqlen)
    details: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------------
# Operand tracing: scalar scales, head split Transposes, GQA repeats


def _scalar_factor(node: gs.Node, tensor_side: int) -> float | None:
    """For Mul/Div of a tensor by a one-element constant (or a number computed from static dims): the factor
    the tensor is multiplied by, else None."""
    value = number(static_value(node.inputs[1 - tensor_side], dim_of=_dim))
    if value is None:
        return None
    if _is_op(node, "Mul"):
        return value
    if _is_op(node, "Div") and tensor_side == 0 and value != 0:
        return 1.0 / value
    return None


def _peel_scale(tensor: gs.Tensor) -> tuple[gs.Tensor, float]:
    """Follow Mul/Div by scalar constants upward: the unscaled tensor and the product of the factors."""
    factor = 1.0
    while True:
        node = producer(tensor)
        if not (_is_op(node, "Mul") or _is_op(node, "Div")):
            return tensor, factor
        for side in (0, 1):
            f = _scalar_factor(node, side)
            if f is not None and static_value(node.inputs[side], dim_of=_dim) is None:
                factor *= f
                tensor = node.inputs[side]
                break
        else:
            return tensor, factor


def _unrepeat_heads(tensor: gs.Tensor, axis: int) -> tuple[gs.Tensor, int]:
    """Undo a K/V head repeat on ``axis`` (the heads axis of a rank-4 tensor): Reshape(Expand|Tile(Unsqueeze(x,
    axis+1))) merging the new axis into the heads, or Tile on the heads axis of a single head (MQA).
    Returns (tensor with the original heads, repeat count or None when only the graph's shapes at run time
    know it); a repeat in h % H order raises _Skip."""
    node = producer(tensor)
    if _is_op(node, "Tile"):
        reps = constant_value(node.inputs[1])
        if reps is None or reps.size != 4 or any(int(r) != 1 for i, r in enumerate(reps) if i != axis):
            return tensor, 1
        heads = _dim(node.inputs[0], axis)
        if heads != 1:
            raise _Skip(f"Tile '{node.name}' repeats {heads or 'an unknown number of'} K/V heads in h % H_kv order; "
                        f"FusedAttention groups query head h with key/value head h // (H_q / H_kv)")
        return node.inputs[0], int(reps[axis])
    if not _is_op(node, "Reshape") or _rank(tensor) not in (None, 4):
        return tensor, 1
    grown = producer(node.inputs[0])
    if not (_is_op(grown, "Expand") or _is_op(grown, "Tile")):
        return tensor, 1
    unsq = producer(grown.inputs[0])
    if not _is_op(unsq, "Unsqueeze"):
        return tensor, 1
    axes = constant_value(unsq.inputs[1]) if len(unsq.inputs) > 1 else np.asarray(unsq.attrs.get("axes", []))
    if axes is None or axes.size != 1 or int(axes.reshape(())) % 5 != axis + 1:
        return tensor, 1
    source = unsq.inputs[0]
    repeats = _dim(grown.outputs[0], axis + 1)
    if repeats is None and _is_op(grown, "Tile"):
        reps = constant_value(grown.inputs[1])
        repeats = int(reps[axis + 1]) if reps is not None and reps.size == 5 else None
    if repeats is None:
        expand_shape = constant_value(grown.inputs[1])
        repeats = int(expand_shape[axis + 1]) if expand_shape is not None and expand_shape.size == 5 else None
    heads, merged = _dim(source, axis), _dim(tensor, axis)
    if repeats is None and heads and merged:
        repeats = merged // heads
    if repeats is not None and heads and merged and heads * repeats != merged:
        raise _Skip(f"Reshape '{node.name}' does not merge the repeated K/V heads into the heads axis")
    for a in (0, 2, 3) if axis == 1 else (0, 1, 3):
        if _dim(source, a) is not None and _dim(tensor, a) is not None and _dim(source, a) != _dim(tensor, a):
            raise _Skip(f"Reshape '{node.name}' changes more than the heads axis of the repeated K/V")
    return source, repeats


def _trace_bhsd(tensor: gs.Tensor, allow_repeat: bool) -> tuple[_Operand, float]:
    """A [B,H,S,D] operand traced upward: scalar scales, K/V head repeats, the head split Transpose."""
    tensor, factor = _peel_scale(tensor)
    repeats = 1
    if allow_repeat:
        tensor, repeats = _unrepeat_heads(tensor, axis=1)
        tensor, more = _peel_scale(tensor)
        factor *= more
    operand = _Operand(bhsd=tensor, repeats=repeats)
    split = producer(tensor)
    if _perm(split) == HEAD_SPLIT and _rank(split.inputs[0]) in (None, 4):
        operand.bshd = split.inputs[0]
        if allow_repeat and repeats == 1:  # heads repeated before the split: [B,S,H,D] on axis 2
            source, repeats = _unrepeat_heads(operand.bshd, axis=2)
            if repeats != 1:
                operand = _Operand(bshd=source, repeats=repeats)
    return operand, factor


def _trace_keys(kt: gs.Tensor) -> tuple[_Operand, float]:
    """The keys from the right operand of Q·Kᵀ ([B,H,D,S])."""
    kt, factor = _peel_scale(kt)
    node = producer(kt)
    perm = _perm(node)
    if perm == KEY_TRANSPOSE:
        keys, more = _trace_bhsd(node.inputs[0], allow_repeat=True)
        return keys, factor * more
    if perm == SPLIT_KEY_TRANSPOSE:
        source, more = _peel_scale(node.inputs[0])
        source, repeats = _unrepeat_heads(source, axis=2)
        return _Operand(bshd=source, repeats=repeats), factor * more
    return _Operand(kt=kt), factor


def _trace_output(out: gs.Tensor, graph: gs.Graph, match: _Match) -> _Output:
    """The output in BHSD and, when its readers are head-merge Transposes (after Reshapes to its own shape, as the
    sdpa export writes) and Shape nodes, its BSHD form."""
    result = _Output(bhsd=out, producer=producer(out))
    tensor, bypassed, shape_readers = out, [], []
    while not is_graph_output(tensor, graph):
        readers = consumers(tensor)
        shape_readers += [n for n in readers if _is_op(n, "Shape")]
        others = [n for n in readers if not _is_op(n, "Shape")]
        if len(others) == 1 and _keeps_output_shape(others[0], tensor, match):
            bypassed.append(others[0])
            tensor = others[0].outputs[0]
            continue
        if others and all(_perm(n) == HEAD_SPLIT for n in others):
            result.merges, result.bshd = others, others[0].outputs[0]
            result.bypassed, result.shape_readers = bypassed, shape_readers
        break
    return result


def _keeps_output_shape(node: gs.Node, tensor: gs.Tensor, match: _Match) -> bool:
    """Whether ``node`` is a Reshape of the [B,H,Lq,Dv] output to [B,H,Lq,Dv]: each target dim a constant equal
    to the static dim, a dim read by Shape from a tensor known to share it (Q, V, the output), or the one -1."""
    if not _is_op(node, "Reshape") or _rank(node.outputs[0]) not in (None, 4):
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
        elif piece != -1 and piece != _dim(tensor, position) and not (piece == 0 and not node.attrs.get("allowzero", 0)):
            return False
    return True


def _shape_pieces(tensor: gs.Tensor) -> list | None:
    """A 1-D shape tensor as its elements: ints for constants, (tensor, axis) for dims read with Shape; else None."""
    value = constant_value(tensor)
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    node = producer(tensor)
    if _is_op(node, "Concat"):
        parts = [_shape_pieces(t) for t in node.inputs]
        return None if any(p is None for p in parts) else [piece for part in parts for piece in part]
    if _is_op(node, "Unsqueeze") or _is_op(node, "Reshape"):
        inner = _shape_pieces(node.inputs[0])
        return inner if inner is not None and len(inner) == 1 else None
    if _is_op(node, "Gather") and _is_op(producer(node.inputs[0]), "Shape"):
        shape_node, index = producer(node.inputs[0]), constant_value(node.inputs[1])
        if index is None or index.size != 1 or shape_node.attrs.get("start", 0) != 0:
            return None
        return [(shape_node.inputs[0], int(index.reshape(-1)[0]) % 4)]
    return None


# ----------------------------------------------------------------------------------------------------------
# Softmax sites


def _reaches_scores(tensor: gs.Tensor, depth: int = 8) -> bool:
    """Whether ``tensor`` is computed, through score steps (Cast, scale, mask), from a MatMul."""
    node = producer(tensor)
    if node is None or depth == 0:
        return False
    if _is_op(node, "MatMul"):
        return True
    if node.op in _SCORE_STEPS and node.domain in (None, "", "ai.onnx"):
        inputs = node.inputs[1:] if node.op == "Where" else node.inputs
        return any(_reaches_scores(t, depth - 1) for t in inputs if not isinstance(t, gs.Constant))
    return False


def _blocking_step(tensor: gs.Tensor, depth: int = 8) -> gs.Node | None:
    """The first node above ``tensor``, past score steps, that is no score step yet is computed from a MatMul
    (e.g. the Tanh of logit softcapping): what keeps a Softmax from being matched. None if there is none."""
    node = producer(tensor)
    if node is None or depth == 0 or _is_op(node, "MatMul"):
        return None
    if node.op in _SCORE_STEPS and node.domain in (None, "", "ai.onnx"):
        found = (_blocking_step(t, depth - 1) for t in node.inputs if not isinstance(t, gs.Constant))
        return next((n for n in found if n is not None), None)
    return node if _from_matmul(tensor, 4) else None


def _from_matmul(tensor: gs.Tensor, depth: int) -> bool:
    node = producer(tensor)
    return node is not None and depth > 0 and (_is_op(node, "MatMul") or any(
        _from_matmul(t, depth - 1) for t in node.inputs if not isinstance(t, gs.Constant)))


def _not_attention_step(node: gs.Node) -> _Skip:
    hint = {"Tanh": " (logit softcapping)", "Reshape": " (scores reshaped: heads folded into the batch?)"}.get(node.op, "")
    return _Skip(f"{node.op} '{node.name}' between the Q·Kᵀ MatMul and the Softmax is not an attention step{hint}")


def _is_masked_fill(value: float | None) -> bool:
    return value is not None and (value == -math.inf or value <= MASKED_FILL_LIMIT)


def _walk_scores(softmax: gs.Node, graph: gs.Graph, match: _Match) -> gs.Node:
    """From the Softmax input up to the Q·Kᵀ MatMul, recording scales, masks and Casts; returns the MatMul."""
    tensor, scale = softmax.inputs[0], 1.0
    while True:
        node = producer(tensor)
        if node is None:
            raise _Skip("the Softmax input is not computed from a MatMul (not attention)")
        readers = consumers(tensor)
        if len(readers) != 1 or is_graph_output(tensor, graph):
            others = sorted({n.op for n in readers if n is not softmax} | ({"graph output"} if
                            is_graph_output(tensor, graph) else set()))
            raise _Skip(f"the attention scores '{tensor.name}' are also read by {', '.join(others)}")
        if _is_op(node, "MatMul"):
            match.scale = scale
            return node
        if _is_op(node, "Cast"):
            if np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["to"])) not in _FLOAT_DTYPES \
                    and node.attrs["to"] != TensorProto.BFLOAT16:
                raise _Skip(f"Cast '{node.name}' on the scores is not to a float type")
            match.details["casts"] = match.details.get("casts", 0) + 1
            tensor = node.inputs[0]
        elif _is_op(node, "Mul") or _is_op(node, "Div"):
            sides = [s for s in (0, 1) if _scalar_factor(node, s) is not None]
            if not sides:
                raise _Skip(f"{node.op} '{node.name}' scales the scores by a non-constant or non-scalar")
            scale *= _scalar_factor(node, sides[0])
            if scale <= 0:
                raise _Skip(f"{node.op} '{node.name}' scales the scores by a non-positive factor")
            tensor = node.inputs[sides[0]]
        elif _is_op(node, "Add"):
            sides = [s for s in (0, 1) if _reaches_scores(node.inputs[s])]
            blocker = next((b for b in map(_blocking_step, node.inputs) if b is not None), None)
            if not sides and blocker is not None:
                raise _not_attention_step(blocker)
            if len(sides) != 1:
                raise _Skip(f"cannot tell the scores from the mask in Add '{node.name}'")
            if scale != 1.0:
                raise _Skip(f"the mask of Add '{node.name}' is added before the scores are scaled")
            match.float_masks.append(node.inputs[1 - sides[0]])
            tensor = node.inputs[sides[0]]
        elif _is_op(node, "Where"):
            cond, a, b = node.inputs
            if _reaches_scores(a) and _is_masked_fill(scalar_value(b)):
                match.keep_masks.append((cond, False))
                tensor = a
            elif _reaches_scores(b) and _is_masked_fill(scalar_value(a)):
                match.keep_masks.append((cond, True))
                tensor = b
            else:
                raise _Skip(f"Where '{node.name}' does not fill masked scores with -inf or a large negative")
        else:
            raise _not_attention_step(node)


def _walk_probabilities(softmax: gs.Node, graph: gs.Graph) -> gs.Node:
    """From the Softmax output down to the MatMul with V, through Casts, Dropout and the NaN guard."""
    tensor = softmax.outputs[0]
    while True:
        if is_graph_output(tensor, graph):
            raise _Skip(f"the attention probabilities '{tensor.name}' are a graph output")
        readers = consumers(tensor)
        if len(readers) == 1 and (_is_op(readers[0], "Cast") or _is_op(readers[0], "Dropout")):
            node = readers[0]
            if _is_op(node, "Dropout") and (len(node.outputs) > 1 and node.outputs[1].outputs
                                            or len(node.inputs) > 2 and is_present(node.inputs[2])
                                            and scalar_value(node.inputs[2]) != 0):
                raise _Skip(f"Dropout '{node.name}' on the probabilities runs in training mode")
            tensor = node.outputs[0]
            continue
        guard = _nan_guard(tensor, readers)
        if guard is not None:
            tensor = guard.outputs[0]
            continue
        if len(readers) == 1 and _is_op(readers[0], "MatMul") and readers[0].inputs[0] is tensor \
                and readers[0].inputs[1] is not tensor:
            return readers[0]
        names = ", ".join(sorted({f"{n.op}" for n in readers})) or "nothing"
        raise _Skip(f"the attention probabilities '{tensor.name}' are read by {names}, not only by the MatMul with V")


def _nan_guard(tensor: gs.Tensor, readers: list) -> gs.Node | None:
    """The Where(IsNaN(p), 0, p) the sdpa export puts after Softmax (fully masked rows -> 0), else None."""
    if len(readers) != 2:
        return None
    isnan = next((n for n in readers if _is_op(n, "IsNaN")), None)
    where = next((n for n in readers if _is_op(n, "Where")), None)
    if isnan is None or where is None or consumers(isnan.outputs[0]) != [where]:
        return None
    if where.inputs[0] is isnan.outputs[0] and where.inputs[2] is tensor and scalar_value(where.inputs[1]) == 0:
        return where
    return None


def _peel_float_cast(tensor: gs.Tensor) -> gs.Tensor:
    """The input of a Cast between float types (fp16 exports cast V up for the MatMul), else ``tensor``."""
    node = producer(tensor)
    if _is_op(node, "Cast") and _is_float(_dtype(node.inputs[0])) and _is_float(_dtype(tensor)):
        return node.inputs[0]
    return tensor


def _is_float(dtype) -> bool:
    return dtype is not None and (dtype in _FLOAT_DTYPES or dtype.name == "bfloat16")


def _match_softmax(softmax: gs.Node, graph: gs.Graph) -> _Match:
    match = _Match(anchor=softmax, q=_Operand(), k=_Operand(), v=_Operand(), out=_Output())
    scores_mm = _walk_scores(softmax, graph, match)
    qb, kt = scores_mm.inputs
    rank = _rank(qb) or _rank(kt) or _rank(scores_mm.outputs[0])
    if rank != 4:
        raise _Skip(f"the Softmax input comes from MatMul '{scores_mm.name}' of rank {rank or 'unknown'}, not a "
                    f"rank-4 Q·Kᵀ (not attention, or heads folded into the batch)")
    axis = softmax.attrs.get("axis", -1 if graph.opset >= 13 else 1)  # before opset 13: 2-D coercion at axis
    if axis not in (-1, rank - 1):
        raise _Skip(f"Softmax '{softmax.name}' normalizes axis {axis}, not the last (keys) axis")
    pv_mm = _walk_probabilities(softmax, graph)
    match.q, q_factor = _trace_bhsd(qb, allow_repeat=False)
    match.k, k_factor = _trace_keys(kt)
    values = _peel_float_cast(pv_mm.inputs[1])
    match.v, v_factor = _trace_bhsd(values, allow_repeat=True)
    if v_factor != 1.0:
        match.v = _Operand(bhsd=values)  # scaled values: keep the scaled tensor
    match.scale *= q_factor * k_factor
    match.out = _trace_output(pv_mm.outputs[0], graph, match)
    if _rank(pv_mm.outputs[0]) not in (None, 4):
        raise _Skip(f"the MatMul with V '{pv_mm.name}' is not rank 4")
    return match


# ----------------------------------------------------------------------------------------------------------
# ONNX Attention (opset 23+)


def _match_onnx_attention(node: gs.Node, graph: gs.Graph) -> _Match:
    inputs = list(node.inputs) + [None] * (7 - len(node.inputs))
    q, k, v, mask, past_key, past_value, nonpad = inputs[:7]
    if is_present(past_key) or is_present(past_value):
        raise _Skip("Attention with past_key/past_value (KV cache) is not supported by FusedAttention")
    for index, what in ((1, "present_key"), (2, "present_value"), (3, "qk_matmul_output")):
        if len(node.outputs) > index and (node.outputs[index].outputs or is_graph_output(node.outputs[index], graph)):
            raise _Skip(f"Attention output {what} is in use; FusedAttention returns only the attention output")
    if node.attrs.get("softcap", 0.0):
        raise _Skip(f"Attention softcap={node.attrs['softcap']} is not supported by FusedAttention")
    if node.attrs.get("left_window_size", -1) >= 0 or node.attrs.get("right_window_size", -1) >= 0:
        raise _Skip("Attention with a sliding window is not supported by FusedAttention")
    match = _Match(anchor=node, q=_Operand(), k=_Operand(), v=_Operand(), out=_Output())
    rank = _rank(q)
    if rank == 4:
        match.q, q_factor = _trace_bhsd(q, allow_repeat=False)
        match.k, k_factor = _trace_bhsd(k, allow_repeat=True)
        match.v, v_factor = _trace_bhsd(v, allow_repeat=True)
        if v_factor != 1.0:
            match.v = _Operand(bhsd=v)
        match.out = _trace_output(node.outputs[0], graph, match)
    elif rank == 3:
        hq, hkv = node.attrs.get("q_num_heads"), node.attrs.get("kv_num_heads")
        if not hq or not hkv:
            raise _Skip("3-D Attention without q_num_heads/kv_num_heads")
        match.q, match.k, match.v = _Operand(flat=q, heads=hq), _Operand(flat=k, heads=hkv), _Operand(flat=v, heads=hkv)
        q_factor = k_factor = 1.0
        match.out = _Output(flat=node.outputs[0], producer=node)
    else:
        raise _Skip(f"Attention inputs of rank {rank or 'unknown'} (3 or 4 expected)")
    base = node.attrs.get("scale")
    if base is None or base == 0:
        dim = _dim(q, 3) if rank == 4 else (_dim(q, 2) // hq if _dim(q, 2) else None)
        if q_factor * k_factor != 1.0 and dim is None:
            raise _Skip("cannot fold the Q/K scale without the head dim")
        base = 1.0 / math.sqrt(dim) if dim else 0.0
    match.scale = base * q_factor * k_factor if base else 0.0
    if is_present(mask):
        if _dtype(mask) == np.dtype(bool):
            match.keep_masks.append((mask, False))
        else:
            match.float_masks.append(mask)
        mask_len, keys_len = _dim(mask, -1), _dim(k, 2 if rank == 4 else 1)
        if mask_len is not None and keys_len is not None and mask_len != keys_len:
            raise _Skip(f"Attention mask covers {mask_len} of {keys_len} keys (ONNX pads it with -inf); "
                        f"FusedAttention needs a mask over all keys")
    if node.attrs.get("is_causal", 0):
        if is_present(nonpad):
            raise _Skip("Attention is_causal with nonpad_kv_seqlen aligns causality to each batch's valid keys "
                        "(offset nonpad_kv_seqlen[b] - L_q); FusedAttention's causal alignment is one for all")
        match.causal = 1
    if is_present(nonpad):
        match.key_lengths = nonpad
    return match


# ----------------------------------------------------------------------------------------------------------
# Masks: constant triangles and Trilu become ``causal``; all-pass constants vanish; And chains split


def _triangle(keep: np.ndarray) -> str | None:
    """The causal alignment a constant boolean [..., Lq, Lkv] keep-mask is, else None."""
    if keep.ndim < 2:
        return None
    lq, lkv = keep.shape[-2:]
    if not (keep == keep.reshape(-1, lq, lkv)[0]).all():
        return None
    plane = keep.reshape(-1, lq, lkv)[0]
    rows, cols = np.arange(lq)[:, None], np.arange(lkv)[None, :]
    if (plane == (cols <= rows)).all():
        return "top_left"
    if (plane == (cols <= rows + lkv - lq)).all():
        return "bottom_right"
    return None


def _mask_constant(tensor: gs.Tensor) -> np.ndarray | None:
    """A constant mask's value; for ConstantOfShape its fill and for Expand its source (enough to tell an
    all-pass mask; a triangle check compares the shape with the scores')."""
    node = producer(tensor)
    if _is_op(node, "ConstantOfShape"):
        fill = node.attrs.get("value")
        return np.asarray(fill.values if isinstance(fill, gs.Constant) else 0.0).reshape(-1)[:1]
    if _is_op(node, "Expand"):
        return _mask_constant(node.inputs[0])
    return constant_value(tensor)


def _constant_keep(tensor: gs.Tensor, negate: bool) -> np.ndarray | None:
    value = _mask_constant(tensor)
    if value is None:
        return None
    keep = value.astype(bool) if value.dtype == bool else value != 0
    return ~keep if negate else keep


def _trilu_keep(tensor: gs.Tensor, negate: bool, scores_lq, scores_lkv, additive: bool = False) -> str | None:
    """Causal alignment of a Trilu-of-ones keep mask (possibly compared with 0, cast, negated), or (``additive``)
    of a Trilu of -inf added to the scores (torch's triu(full(-inf), 1) square subsequent mask); else None."""
    node = producer(tensor)
    while True:  # leading Unsqueezes (any mask); Cast, Not and Equal(x, 0) (keep masks)
        if _adds_leading_axes(node) or not additive and (_is_op(node, "Cast") or _is_op(node, "Not")):
            negate ^= _is_op(node, "Not")
            tensor = node.inputs[0]
        elif not additive and _is_op(node, "Equal") and 0.0 in map(scalar_value, node.inputs):
            negate ^= True
            tensor = node.inputs[1] if scalar_value(node.inputs[0]) == 0 else node.inputs[0]
        else:
            break
        node = producer(tensor)
    if not _is_op(node, "Trilu"):
        return None
    plane = (_shape(node.outputs[0]) or [None, None])[-2:]
    if (plane[0] == 1 and scores_lq != 1) or (plane[1] == 1 and scores_lkv != 1):
        return None  # a row or column that broadcasts is no triangle
    filled = _mask_constant(node.inputs[0])
    if filled is None or not ((filled <= MASKED_FILL_LIMIT).all() if additive else (filled == 1).all()):
        return None
    negate ^= additive  # the Trilu's kept region holds -inf: those keys are the masked ones
    diagonal = scalar_value(node.inputs[1]) if len(node.inputs) > 1 and is_present(node.inputs[1]) else 0.0
    upper = node.attrs.get("upper", 1)
    # keep j <= i + d  is  lower(diagonal=d) kept, or upper(diagonal=d+1) negated
    if upper and negate:
        offset = diagonal - 1
    elif not upper and not negate:
        offset = diagonal
    else:
        return None
    if offset == 0 and (scores_lq is None or scores_lq == scores_lkv or scores_lkv is None):
        return "top_left"
    if scores_lq is not None and scores_lkv is not None and offset == scores_lkv - scores_lq:
        return "bottom_right"
    return None


def _adds_leading_axes(node: gs.Node | None) -> bool:
    """Whether ``node`` is an Unsqueeze that only puts new axes in front (a mask's broadcast does the same)."""
    if not _is_op(node, "Unsqueeze"):
        return False
    axes = constant_value(node.inputs[1]) if len(node.inputs) > 1 else np.asarray(node.attrs.get("axes", []))
    rank = _rank(node.outputs[0])
    return axes is not None and rank is not None and sorted(int(a) % rank for a in axes.reshape(-1)) == \
        list(range(axes.size))


def _split_and(tensor: gs.Tensor, negate: bool) -> list:
    """A keep-mask And chain as its (tensor, negate) factors (De Morgan through Or of negated parts)."""
    node = producer(tensor)
    if not negate and _is_op(node, "And") or negate and _is_op(node, "Or"):
        return _split_and(node.inputs[0], negate) + _split_and(node.inputs[1], negate)
    if _is_op(node, "Not"):
        return _split_and(node.inputs[0], not negate)
    if _is_op(node, "Expand") or _is_op(node, "Cast") and _dtype(node.inputs[0]) == np.dtype(bool):
        return _split_and(node.inputs[0], negate)  # the scores' broadcast does what Expand did
    return [(tensor, negate)]


_RELATIONS = {"Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}
_SWAPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


def _position_index(tensor: gs.Tensor) -> tuple[int, float] | None:
    """(axis counted from the end, value at position 0) of a tensor of positions start, start+1, ... along
    one axis and size 1 elsewhere: Range(start, L, 1) through Unsqueeze, Cast and added constants."""
    chain, offset = [], 0.0
    node = producer(tensor)
    while _is_op(node, "Unsqueeze") or _is_op(node, "Cast") or _is_op(node, "Add") or _is_op(node, "Sub"):
        if node.op in ("Add", "Sub"):
            sides = [i for i in (0, 1) if scalar_value(node.inputs[i]) is not None]
            if len(sides) != 1 or node.op == "Sub" and sides[0] == 0:
                return None
            offset += scalar_value(node.inputs[sides[0]]) * (-1 if node.op == "Sub" else 1)
            node = producer(node.inputs[1 - sides[0]])
            continue
        chain.append(node)
        node = producer(node.inputs[0])
    if not _is_op(node, "Range") or scalar_value(node.inputs[2]) != 1 or scalar_value(node.inputs[0]) is None:
        return None
    position, rank = 0, 1
    for unsq in reversed(chain):
        if unsq.op != "Unsqueeze":
            continue
        axes = constant_value(unsq.inputs[1]) if len(unsq.inputs) > 1 else np.asarray(unsq.attrs.get("axes", []))
        if axes is None:
            return None
        rank += axes.size
        for axis in sorted(int(a) % rank for a in axes.reshape(-1)):
            position += axis <= position
    return position - rank, scalar_value(node.inputs[0]) + offset


def _comparison_causal(tensor: gs.Tensor, negate: bool) -> float | None:
    """d when the keep mask is  key position j <= query position i + d  built from Range comparisons."""
    node = producer(tensor)
    if node is None or node.op not in _RELATIONS or node.domain not in (None, "", "ai.onnx"):
        return None
    left, right = _position_index(node.inputs[0]), _position_index(node.inputs[1])
    if left is None or right is None:
        return None
    relation = _RELATIONS[node.op]
    if (left[0], right[0]) == (-2, -1):  # query on the left: flip to  key <rel> query
        left, right, relation = right, left, _SWAPPED[relation]
    if (left[0], right[0]) != (-1, -2):
        return None
    relation = _NEGATED[relation] if negate else relation
    # keep  j + a <rel> i + b
    bound = right[1] - left[1]
    if relation == "<=":
        return bound
    if relation == "<":
        return bound - 1
    return None


def _classify_masks(match: _Match, lq, lkv, shared: _Shared) -> None:
    """Turn recognized causal triangles into ``causal`` and drop all-pass constants."""
    keeps = [part for keep in match.keep_masks for part in _split_and(*keep)]
    floats = []
    for mask in match.float_masks:
        value = constant_value(mask)
        cond = producer(mask)
        if value is not None:
            if not value.any():
                continue  # all-zero additive mask
            blocked = (value == -np.inf) | (value <= MASKED_FILL_LIMIT)
            if ((value == 0) | blocked).all():
                key = ("keep", id(mask))
                if key not in shared.nodes:
                    shared.nodes[key] = gs.Constant(unique_name(f"{mask.name}_keep", shared.taken), ~blocked)
                keeps.append((shared.nodes[key], False))
                continue
        elif (alignment := _trilu_keep(mask, False, lq, lkv, additive=True)) and \
                (not match.causal or match.causal_alignment == alignment):
            match.causal, match.causal_alignment = 1, alignment
            continue
        elif _is_op(cond, "Where") and -math.inf in (scalar_value(cond.inputs[1]), scalar_value(cond.inputs[2])) \
                and 0.0 in (scalar_value(cond.inputs[1]), scalar_value(cond.inputs[2])):
            # Where(keep, 0, -inf) or Where(drop, -inf, 0): a boolean mask in additive form, passed as the boolean
            keeps.extend(_split_and(cond.inputs[0], scalar_value(cond.inputs[1]) != 0))
            continue
        floats.append(mask)
    rest = []
    for tensor, negate in keeps:
        alignment = _causal_of((tensor, negate), lq, lkv)
        if alignment and (not match.causal or match.causal_alignment == alignment):
            match.causal, match.causal_alignment = 1, alignment
            continue
        constant = _constant_keep(tensor, negate)
        if constant is not None and constant.all():
            continue
        rest.append((tensor, negate))
    match.float_masks, match.keep_masks = floats, rest


def _causal_of(part, lq, lkv) -> str | None:
    tensor, negate = part
    constant = _constant_keep(tensor, negate)
    if constant is not None:  # a triangle spans both sequence axes (a dim of 1 would broadcast)
        if constant.ndim < 2 or 1 in constant.shape[-2:] or lq is not None and constant.shape[-2:] != (lq, lkv):
            return None
        return _triangle(constant)
    offset = _comparison_causal(tensor, negate)
    if offset is not None:
        if offset == 0 and (lq is None or lq == lkv):
            return "top_left"
        if lq is not None and lkv is not None and offset == lkv - lq:
            return "bottom_right"
        return None
    return _trilu_keep(tensor, negate, lq, lkv)


# ----------------------------------------------------------------------------------------------------------
# Replacement


@dataclass
class _Shared:
    """What the sites of one rewrite share: the names in use, and mask nodes emitted once for all layers."""

    taken: set
    nodes: dict = field(default_factory=dict)  # (op, input ids, attrs) -> output tensor


class _Emitter:
    """Adds the new nodes of one site, with names derived from the anchor's."""

    def __init__(self, graph: gs.Graph, base: str, shared: _Shared):
        self.graph, self.base, self.shared, self.taken = graph, base, shared, shared.taken

    def shared_node(self, op: str, inputs: list, what: str, dtype=None, attrs=None) -> gs.Tensor:
        """A node every site with the same inputs reuses (the mask conversions of each layer)."""
        key = (op, tuple(id(t) for t in inputs), tuple(sorted((attrs or {}).items())))
        if key not in self.shared.nodes:
            self.shared.nodes[key] = self.node(op, inputs, what, dtype, attrs)
        return self.shared.nodes[key]

    def tensor(self, what: str, dtype=None) -> gs.Variable:
        return gs.Variable(unique_name(f"{self.base}/{what}", self.taken), dtype=dtype)

    def node(self, op: str, inputs: list, what: str, dtype=None, attrs=None, outputs=None) -> gs.Tensor:
        outputs = outputs or [self.tensor(what, dtype)]
        self.graph.nodes.append(gs.Node(op=op, name=unique_name(f"{self.base}/{what}", self.taken),
                                        attrs=attrs or {}, inputs=inputs, outputs=outputs))
        return outputs[0]

    def transpose(self, tensor: gs.Tensor, perm: tuple, what: str) -> gs.Tensor:
        return self.node("Transpose", [tensor], what, _dtype(tensor), {"perm": list(perm)})

    def operand(self, op: _Operand, layout: str, what: str) -> gs.Tensor:
        if getattr(op, layout.lower()) is not None:
            return getattr(op, layout.lower())
        if op.flat is not None:
            shape = gs.Constant(unique_name(f"{self.base}/{what}_heads", self.taken),
                                np.array([0, 0, op.heads, -1], np.int64))
            return self.node("Reshape", [op.flat, shape], f"{what}_bshd", _dtype(op.flat))
        if op.kt is not None:
            perm = KEY_TRANSPOSE if layout == "BHSD" else (0, 3, 1, 2)
            return self.transpose(op.kt, perm, f"{what}_{layout.lower()}")
        return self.transpose(op.any(), HEAD_SPLIT, f"{what}_{layout.lower()}")


def _layout(match: _Match) -> str:
    """The layout needing the fewest new Transposes (BSHD on a tie: it absorbs the head split/merge)."""
    if match.out.flat is not None:
        return "BSHD"
    costs = {layout: sum(op.cost(layout) for op in (match.q, match.k, match.v)) + match.out.cost(layout)
             for layout in ("BSHD", "BHSD")}
    return min(("BSHD", "BHSD"), key=lambda layout: costs[layout])


def _mask_input(match: _Match, emit: _Emitter, qtype) -> tuple[gs.Tensor | None, str]:
    """The one mask tensor to pass (combining several), and its kind for the report."""
    keep = None
    if match.keep_masks:
        parts = [emit.shared_node("Not", [t], "keep", np.dtype(bool)) if negate else t for t, negate in match.keep_masks]
        keep = parts[0]
        for part in parts[1:]:
            keep = emit.shared_node("And", [keep, part], "keep", np.dtype(bool))
        if not match.float_masks:
            return keep, "bool"
    if not match.float_masks:
        return None, "none"
    masks = [mask if qtype is None or _dtype(mask) in (None, qtype) else
             emit.shared_node("Cast", [mask], "mask_cast", qtype, {"to": helper.np_dtype_to_tensor_dtype(qtype)})
             for mask in match.float_masks]
    if keep is not None:  # both kinds: the boolean one in additive form (-inf where masked), once for all layers
        key = ("keep_additive", id(keep), qtype.str)
        if key not in emit.shared.nodes:
            zero, neg_inf = (gs.Constant(unique_name(f"{emit.base}/{what}", emit.taken), np.array(value, qtype))
                             for what, value in (("zero", 0.0), ("neg_inf", -np.inf)))
            emit.shared.nodes[key] = emit.node("Where", [keep, zero, neg_inf], "keep_additive", qtype)
        masks.append(emit.shared.nodes[key])
    mask = masks[0]
    for part in masks[1:]:
        mask = emit.shared_node("Add", [mask, part], "mask", qtype or _dtype(mask))
    return mask, "float"


def _check_masks(match: _Match) -> None:
    if match.float_masks and match.keep_masks and _dtype(match.q.any()) is None:
        raise _Skip("the site has an additive and a boolean mask and Q's dtype is unknown")
    for mask in match.float_masks + [t for t, _ in match.keep_masks]:
        rank = _rank(mask)
        if rank is None:
            raise _Skip(f"the rank of mask '{mask.name}' is unknown; run shape inference first")
        if not 2 <= rank <= 4:
            raise _Skip(f"mask '{mask.name}' has rank {rank}; FusedAttention broadcasts masks of rank 2 to 4")


def _route_output(out: _Output, layout: str, emit: _Emitter, qtype) -> gs.Tensor:
    """The tensor the fused node writes (in ``layout`` and Q's dtype), wired to the original output's readers
    through the head merge, a Transpose or a Cast as needed."""
    out.producer.outputs.clear()
    readers_see = out.flat if out.flat is not None else out.bhsd
    if qtype is not None and _dtype(readers_see) not in (None, qtype):  # fp16 exports that compute P·V in fp32
        fused_out = emit.tensor("O", qtype)
        emit.node("Cast", [fused_out], "O_cast", attrs={"to": helper.np_dtype_to_tensor_dtype(_dtype(readers_see))},
                  outputs=[readers_see])
        readers_see = fused_out
    if out.flat is not None:
        result = emit.tensor("O_bshd", qtype)
        shape = gs.Constant(unique_name(f"{emit.base}/merge_heads", emit.taken), np.array([0, 0, -1], np.int64))
        emit.node("Reshape", [result, shape], "O_merge", outputs=[readers_see])
        return result
    if layout == "BHSD":
        return readers_see
    if out.bshd is not None and readers_see is out.bhsd:
        result = out.bshd
        for merge in out.merges:
            merged = merge.outputs[0]
            _detach(merge)
            if merged is not result:
                emit.node("Identity", [result], "O_alias", outputs=[merged])
        for reshape in out.bypassed:
            _detach(reshape)
        if out.shape_readers:  # Shape of the BHSD output: the BSHD output's, permuted
            bhsd_shape = emit.node("Gather", [emit.node("Shape", [result], "O_shape", np.dtype(np.int64)),
                                              gs.Constant(unique_name(f"{emit.base}/bhsd_axes", emit.taken),
                                                          np.array(HEAD_SPLIT, np.int64))],
                                   "O_bhsd_shape", np.dtype(np.int64), {"axis": 0})
            for reader in out.shape_readers:
                _reroute_shape(reader, bhsd_shape, emit)
        return result
    result = emit.tensor("O_bshd", qtype)
    emit.node("Transpose", [result], "O_bhsd", attrs={"perm": list(HEAD_SPLIT)}, outputs=[readers_see])
    return result


def _detach(node: gs.Node) -> None:
    """Cut a node the fused node replaces out of the graph (the driver's cleanup then drops it)."""
    node.inputs.clear()
    node.outputs.clear()


def _reroute_shape(reader: gs.Node, shape: gs.Tensor, emit: _Emitter) -> None:
    """Make ``reader``'s output (Shape of the old BHSD output, maybe sliced by start/end) come from ``shape``."""
    out = reader.outputs[0]
    start, end = reader.attrs.get("start"), reader.attrs.get("end")
    _detach(reader)
    if start is None and end is None:
        emit.node("Identity", [shape], "O_shape_alias", outputs=[out])
        return
    bounds = [gs.Constant(unique_name(f"{emit.base}/shape_{what}", emit.taken), np.array([value], np.int64))
              for what, value in (("start", start or 0), ("end", 4 if end is None else end))]
    emit.node("Slice", [shape, *bounds], "O_shape_slice", outputs=[out])


def _replace(match: _Match, graph: gs.Graph, shared: _Shared) -> gs.Node:
    """Emit the FusedAttention node and route the output to the original readers."""
    base = match.anchor.name or "attention"
    emit, taken = _Emitter(graph, f"{base}/fused", shared), shared.taken
    layout = _layout(match)
    qtype = _dtype(match.q.any())
    mask, kind = _mask_input(match, emit, qtype)
    inputs = [emit.operand(match.q, layout, "Q"), emit.operand(match.k, layout, "K"),
              emit.operand(match.v, layout, "V")] + ([mask] if mask is not None else [])
    if match.key_lengths is not None:  # int32 [B], after the mask slot (left empty when there is no mask)
        lengths = match.key_lengths
        if _dtype(lengths) != np.dtype(np.int32):
            lengths = emit.shared_node("Cast", [lengths], "key_lengths", np.dtype(np.int32), {"to": TensorProto.INT32})
        inputs += ([] if mask is not None else [gs.Variable.empty()]) + [lengths]
    result = _route_output(match.out, layout, emit, qtype)
    attrs = {"layout": layout, "scale": match.scale, "causal": match.causal}
    if match.causal:
        attrs["causal_alignment"] = match.causal_alignment
    node = gs.Node(op=FUSED_ATTENTION.name, domain=FUSED_ATTENTION.domain,
                   name=unique_name(f"{base}/FusedAttention", taken),
                   attrs=FUSED_ATTENTION.explicit_attributes(**attrs), inputs=inputs, outputs=[result])
    graph.nodes.append(node)
    if match.key_lengths is not None:
        match.details["key_lengths"] = True
    match.details.update(layout=layout, mask=kind, scale=match.scale, causal=match.causal,
                         **({"causal_alignment": match.causal_alignment} if match.causal else {}),
                         **({"gqa_group": match.k.repeats or "from shapes"} if match.k.repeats != 1 else {}))
    return node


def _shapes(match: _Match) -> dict:
    """Shapes of Q, K, V as the match found them (a site left alone reports these)."""
    return {name: _reported(op.any()) for name, op in (("Q", match.q), ("K", match.k), ("V", match.v))
            if _reported(op.any()) is not None}


def _check(match: _Match) -> None:
    """Assumptions the replacement relies on, from what shapes and dtypes are known."""
    kr, vr = match.k.repeats, match.v.repeats
    if (kr == 1) != (vr == 1) or None not in (kr, vr) and kr != vr:
        raise _Skip(f"K heads are repeated {kr or 'some'}x but V heads {vr or 'some'}x; FusedAttention shares "
                    f"one K/V head group")
    qtype = _dtype(match.q.any())
    for name, op in (("K", match.k), ("V", match.v)):
        if qtype is not None and _dtype(op.any()) is not None and _dtype(op.any()) != qtype:
            raise _Skip(f"{name} has dtype {_dtype(op.any())} but Q has {qtype}")
    if qtype is not None and qtype not in _FLOAT_DTYPES - {np.dtype(np.float64)} and qtype.name != "bfloat16":
        raise _Skip(f"Q has dtype {qtype}; FusedAttention takes float16, bfloat16 or float32")
    out = match.out.flat if match.out.flat is not None else match.out.bhsd
    if qtype is not None and _dtype(out) is not None and _dtype(out) != qtype and not _is_float(_dtype(out)):
        raise _Skip(f"the attention output has dtype {_dtype(out)}, not a float type")
    hq, hkv = _heads(match.q), _heads(match.k)
    if hq and hkv and hq % hkv:
        raise _Skip(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    dq, dk, dv = _head_dim(match.q), _head_dim(match.k), _head_dim(match.v)
    if dq is None:
        raise _Skip("the head dim of Q is not static; FusedAttention kernels are compiled per head dim")
    if dq not in HEAD_DIMS:
        raise _Skip(f"head dim {dq} is not one the FusedAttention kernels are built for {HEAD_DIMS}")
    for name, d in (("K", dk), ("V", dv)):
        if d is not None and d != dq:
            raise _Skip(f"Q has head dim {dq} but {name} has {d}; FusedAttention takes one head dim")
    _check_masks(match)


def _heads(op: _Operand) -> int | None:
    """The static head count of an operand, where known."""
    if op.flat is not None:
        return op.heads
    return _dim(op.bhsd, 1) if op.bhsd is not None else _dim(op.bshd, 2) if op.bshd is not None else _dim(op.kt, 1)


def _head_dim(op: _Operand) -> int | None:
    if op.flat is not None:
        return _dim(op.flat, 2) // op.heads if _dim(op.flat, 2) else None
    return _dim(op.kt, 2) if op.kt is not None else _dim(op.any(), 3)


def _sequence_lengths(match: _Match) -> tuple:
    """Static (L_q, L_kv) where known."""
    def seq(op: _Operand):
        if op.bhsd is not None:  # recorded only: sequence lengths are static only in static models
            return _dim(op.bhsd, 2, infer=False)
        if op.bshd is not None:
            return _dim(op.bshd, 1, infer=False)
        if op.kt is not None:
            return _dim(op.kt, 3, infer=False)
        return _dim(op.flat, 1, infer=False)
    return seq(match.q), seq(match.k)


def _fuse(anchor: gs.Node, graph: gs.Graph, shared: _Shared) -> Site:
    site = Site(family=FAMILY, anchor=anchor.name, fused=False)
    try:
        match = _match_softmax(anchor, graph) if anchor.op == "Softmax" else _match_onnx_attention(anchor, graph)
        site.shapes = _shapes(match)
        _classify_masks(match, *_sequence_lengths(match), shared)
        _check(match)
        node = _replace(match, graph, shared)
    except _Skip as skip:
        site.reason = str(skip)
        return site
    site.fused, site.op, site.node, site.details = True, FUSED_ATTENTION.qualified_name, node.name, match.details
    tensors = dict(zip(("Q", "K", "V", "mask", "key_lengths"), node.inputs), O=node.outputs[0])
    site.shapes = {name: _reported(t) for name, t in tensors.items() if _reported(t) is not None}
    return site


def _listed(shape) -> list | None:
    return None if shape is None else [d if isinstance(d, int) else str(d) for d in shape]


def _reported(tensor: gs.Tensor) -> list | None:
    return _INFERRED.get().reported(tensor) if _INFERRED.get() else _listed(_shape(tensor))


def rewrite(graph: gs.Graph) -> list[Site]:
    """Fuse every attention site of ``graph`` in place; one Site per Softmax and per ONNX Attention node."""
    shared = _Shared(names_in_use(graph))
    anchors = [n for n in graph.nodes if n.domain in (None, "", "ai.onnx") and n.op in ("Softmax", "Attention")]
    token = _INFERRED.set(_InferredDims(graph) if anchors else None)
    try:
        return [_fuse(anchor, graph, shared) for anchor in anchors]
    finally:
        _INFERRED.reset(token)
