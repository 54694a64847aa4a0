"""Masks of a matched site: constant causal triangles, Trilu of ones (or of -inf: torch's square subsequent
mask) and Range comparisons (alone or And-ed with other masks) become ``causal`` + ``causal_alignment``;
all-pass constants vanish; Where(keep, 0, -inf) forms pass their boolean; other additive masks pass as they are.
A mask filled with a finite value (finfo.min) stays additive even when it holds a causal part: rows with no
visible key then average V as the original does, where a boolean or causal mask gives 0."""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites import CannotFuse
from trt_fusedattn.rewrites._graph import (constant_value, is_op, is_present, is_standard, numpy_dtype, producer,
                                           scalar_value, unique_name)
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.match import FilledMask, Match, Shared

MASKED_FILL_LIMIT = -1.0e4          # a fill at or below this removes a key from the softmax (exp underflows)


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
    if is_op(node, "ConstantOfShape"):
        fill = node.attrs.get("value")
        return np.asarray(fill.values if isinstance(fill, gs.Constant) else 0.0).reshape(-1)[:1]
    if is_op(node, "Expand"):
        return _mask_constant(node.inputs[0])
    return constant_value(tensor)


def _constant_keep(tensor: gs.Tensor, negate: bool) -> np.ndarray | None:
    value = _mask_constant(tensor)
    if value is None:
        return None
    keep = value.astype(bool) if value.dtype == bool else value != 0
    return ~keep if negate else keep


def _trilu_keep(tensor: gs.Tensor, negate: bool, scores_lq, scores_lkv, shapes: TensorShapes,
                additive: bool = False) -> str | None:
    """Causal alignment of a Trilu-of-ones keep mask (possibly compared with 0, cast, negated), or (``additive``)
    of a Trilu of -inf added to the scores (torch's triu(full(-inf), 1) square subsequent mask); else None."""
    node = producer(tensor)
    while True:  # leading Unsqueezes (any mask); Cast, Not and Equal(x, 0) (keep masks)
        if _adds_leading_axes(node, shapes) or not additive and (is_op(node, "Cast") or is_op(node, "Not")):
            negate ^= is_op(node, "Not")
            tensor = node.inputs[0]
        elif not additive and is_op(node, "Equal") and 0.0 in map(scalar_value, node.inputs):
            negate ^= True
            tensor = node.inputs[1] if scalar_value(node.inputs[0]) == 0 else node.inputs[0]
        else:
            break
        node = producer(tensor)
    if not is_op(node, "Trilu"):
        return None
    plane = list(node.outputs[0].shape or [None, None])[-2:]
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


def _adds_leading_axes(node: gs.Node | None, shapes: TensorShapes) -> bool:
    """Whether ``node`` is an Unsqueeze that only puts new axes in front (a mask's broadcast does the same)."""
    if not is_op(node, "Unsqueeze"):
        return False
    axes = constant_value(node.inputs[1]) if len(node.inputs) > 1 else np.asarray(node.attrs.get("axes", []))
    rank = shapes.rank(node.outputs[0])
    return axes is not None and rank is not None and sorted(int(a) % rank for a in axes.reshape(-1)) == \
        list(range(axes.size))


def _split_and(tensor: gs.Tensor, negate: bool) -> list:
    """A keep-mask And chain as its (tensor, negate) factors (De Morgan through Or of negated parts)."""
    node = producer(tensor)
    if not negate and is_op(node, "And") or negate and is_op(node, "Or"):
        return _split_and(node.inputs[0], negate) + _split_and(node.inputs[1], negate)
    if is_op(node, "Not"):
        return _split_and(node.inputs[0], not negate)
    if is_op(node, "Expand") or is_op(node, "Cast") and numpy_dtype(node.inputs[0]) == np.dtype(bool):
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
    while is_op(node, "Unsqueeze") or is_op(node, "Cast") or is_op(node, "Add") or is_op(node, "Sub"):
        if node.op in ("Add", "Sub"):
            sides = [i for i in (0, 1) if scalar_value(node.inputs[i]) is not None]
            if len(sides) != 1 or node.op == "Sub" and sides[0] == 0:
                return None
            offset += scalar_value(node.inputs[sides[0]]) * (-1 if node.op == "Sub" else 1)
            node = producer(node.inputs[1 - sides[0]])
            continue
        chain.append(node)
        node = producer(node.inputs[0])
    if not is_op(node, "Range") or scalar_value(node.inputs[2]) != 1 or scalar_value(node.inputs[0]) is None:
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
    if node is None or node.op not in _RELATIONS or not is_standard(node):
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


def classify_masks(match: Match, lq, lkv, shared: Shared, shapes: TensorShapes) -> None:
    """Turn recognized causal triangles into ``causal`` and drop all-pass constants; a Where with a finite fill
    that is more than that stays additive (``FilledMask``)."""
    keeps, filled = [], []
    for keep in match.keep_masks:
        parts, fill = _split_and(*keep), match.fills.get(id(keep[0]))
        if fill is not None and not all(_absorbed(part, match, lq, lkv, shapes) for part in parts):
            filled.append(FilledMask(*keep, fill))
        else:
            keeps.extend(parts)
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
        elif (alignment := _trilu_keep(mask, False, lq, lkv, shapes, additive=True)) and \
                (not match.causal or match.causal_alignment == alignment):
            match.causal, match.causal_alignment = 1, alignment
            continue
        elif is_op(cond, "Where") and -math.inf in (scalar_value(cond.inputs[1]), scalar_value(cond.inputs[2])) \
                and 0.0 in (scalar_value(cond.inputs[1]), scalar_value(cond.inputs[2])):
            # Where(keep, 0, -inf) or Where(drop, -inf, 0): a boolean mask in additive form, passed as the boolean
            keeps.extend(_split_and(cond.inputs[0], scalar_value(cond.inputs[1]) != 0))
            continue
        floats.append(mask)
    rest = []
    for tensor, negate in keeps:
        alignment = _causal_of((tensor, negate), lq, lkv, shapes)
        if alignment and (not match.causal or match.causal_alignment == alignment):
            match.causal, match.causal_alignment = 1, alignment
            continue
        constant = _constant_keep(tensor, negate)
        if constant is not None and constant.all():
            continue
        rest.append((tensor, negate))
    match.float_masks, match.keep_masks = floats + filled, rest


def _absorbed(part, match: Match, lq, lkv, shapes: TensorShapes) -> bool:
    """Whether a keep-mask factor becomes ``causal`` (consistent with the site's) or is an all-pass constant."""
    alignment = _causal_of(part, lq, lkv, shapes)
    if alignment:
        return not match.causal or match.causal_alignment == alignment
    constant = _constant_keep(*part)
    return constant is not None and bool(constant.all())


def _causal_of(part, lq, lkv, shapes: TensorShapes) -> str | None:
    """The causal alignment one keep-mask factor is (a constant triangle, a Range comparison, a Trilu), else None."""
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
    return _trilu_keep(tensor, negate, lq, lkv, shapes)


def check_masks(match: Match, shapes: TensorShapes) -> None:
    """The masks left after classification are ones FusedAttention broadcasts (rank 2 to 4, dtypes known)."""
    if numpy_dtype(match.q.any()) is None and (match.float_masks and match.keep_masks or any(
            isinstance(m, FilledMask) for m in match.float_masks + match.folded_masks)):
        raise CannotFuse("the site's masks need an additive form in Q's dtype and Q's dtype is unknown")
    for mask in [m.keep if isinstance(m, FilledMask) else m for m in match.float_masks] + \
            [t for t, _ in match.keep_masks]:
        rank = shapes.rank(mask)
        if rank is None:
            raise CannotFuse(f"the rank of mask '{mask.name}' is unknown; run shape inference first")
        if not 2 <= rank <= 4:
            raise CannotFuse(f"mask '{mask.name}' has rank {rank}; FusedAttention broadcasts masks of rank 2 to 4")
