"""The Softmax rule: a Softmax over the last axis whose input comes, through scalar scales, additive or boolean
masks and Casts, from a rank-4 MatMul (Q·Kᵀ), and whose output reaches, through Casts, Dropout, the sdpa NaN
guard and an FP8 Q/DQ pair, the left operand of a second MatMul (P·V)."""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from trt_fusedattn.rewrites import CannotFuse
from trt_fusedattn.rewrites._graph import (consumers, is_graph_output, is_op, is_present, is_standard, permutation,
                                           producer, scalar_value)
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.masks import MASKED_FILL_LIMIT
from trt_fusedattn.rewrites.attention.match import FOLDED_KEY_TRANSPOSE, FilledMask, Match, Operand, Output
from trt_fusedattn.rewrites.attention.fp8 import peel_qdq
from trt_fusedattn.rewrites.attention.operands import (FLOAT_DTYPES, peel_float_cast, peel_operand, scalar_factor,
                                                       trace_bhsd, trace_keys, trace_output, with_fp8_scale)

_SCORE_STEPS = {"Cast", "Mul", "Div", "Add", "Where", "Tanh", "Reshape"}


_PROBABILITY_STEPS = {"Cast", "Dropout", "Reshape", "Where", "IsNaN", "Identity", "Squeeze", "Unsqueeze",
                      "QuantizeLinear", "DequantizeLinear"}


def weights_values(softmax: gs.Node) -> bool:
    """Whether the Softmax output reaches, through probability steps (Cast, Dropout, Reshape, the NaN guard), the
    left operand of a MatMul whose right operand is computed (P·V): what makes a Softmax attention. A MoE router
    (read by TopK) or a classifier head (a model output) does not."""
    frontier = [softmax.outputs[0]]
    for _ in range(6):
        reached = []
        for tensor in frontier:
            for node in consumers(tensor):
                if is_op(node, "MatMul") and node.inputs[0] is tensor and not _is_weight(node.inputs[1]):
                    return True
                if is_standard(node) and node.op in _PROBABILITY_STEPS:
                    reached.extend(node.outputs[:1])
        frontier = reached
    return False


def _is_weight(tensor: gs.Tensor) -> bool:
    """Whether ``tensor`` is a constant of the model, maybe cast or transposed (decided without loading values)."""
    while not isinstance(tensor, gs.Constant):
        node = producer(tensor)
        if is_op(node, "Constant"):
            return True
        if not (is_op(node, "Identity") or is_op(node, "Cast") or is_op(node, "Transpose")):
            return False
        tensor = node.inputs[0]
    return True


def _reaches_scores(tensor: gs.Tensor, depth: int = 8) -> bool:
    """Whether ``tensor`` is computed, through score steps (Cast, scale, mask), from a MatMul."""
    node = producer(tensor)
    if node is None or depth == 0:
        return False
    if is_op(node, "MatMul"):
        return True
    if node.op in _SCORE_STEPS and is_standard(node):
        inputs = node.inputs[1:] if node.op == "Where" else node.inputs
        return any(_reaches_scores(t, depth - 1) for t in inputs if not isinstance(t, gs.Constant))
    return False


def _blocking_step(tensor: gs.Tensor, depth: int = 8) -> gs.Node | None:
    """The first node above ``tensor``, past score steps, that is no score step yet is computed from a MatMul
    (e.g. the Tanh of logit softcapping): what keeps a Softmax from being matched. None if there is none."""
    node = producer(tensor)
    if node is None or depth == 0 or is_op(node, "MatMul"):
        return None
    if node.op in _SCORE_STEPS and is_standard(node):
        found = (_blocking_step(t, depth - 1) for t in node.inputs if not isinstance(t, gs.Constant))
        return next((n for n in found if n is not None), None)
    return node if _from_matmul(tensor, 4) else None


def _from_matmul(tensor: gs.Tensor, depth: int) -> bool:
    node = producer(tensor)
    return node is not None and depth > 0 and (is_op(node, "MatMul") or any(
        _from_matmul(t, depth - 1) for t in node.inputs if not isinstance(t, gs.Constant)))


def _not_attention_step(node: gs.Node) -> CannotFuse:
    if is_op(node, "DequantizeLinear"):  # Model Optimizer quantizes the inputs of the mask's Add, scores included
        return CannotFuse(f"DequantizeLinear '{node.name}' quantizes the attention scores; FusedAttention quantizes "
                          f"Q, K, V and P, not the scores: left to TensorRT")
    hint = " (only a rank-3 to rank-4 split of folded heads is one)" if node.op == "Reshape" else ""
    return CannotFuse(f"{node.op} '{node.name}' between the Q·Kᵀ MatMul and the Softmax is not an attention "
                      f"step{hint}")


def _is_masked_fill(value: float | None) -> bool:
    return value is not None and (value == -math.inf or value <= MASKED_FILL_LIMIT)


def _walk_scores(softmax: gs.Node, graph: gs.Graph, match: Match, shapes: TensorShapes) -> gs.Node:
    """From the Softmax input up to the Q·Kᵀ MatMul, recording scales, the softcap, masks, Casts and the Reshape
    that splits heads folded into the batch ([B*H,L,L] -> [B,H,L,L]); returns the MatMul."""
    tensor, scale, masks, fold, reader = softmax.inputs[0], 1.0, [], None, softmax
    while True:
        node = producer(tensor)
        if node is None:
            raise CannotFuse("the Softmax input is not computed from a MatMul (not attention)")
        others = [n for n in consumers(tensor) if n is not reader and not _sizes_only(n, reader, graph)]
        if others or is_graph_output(tensor, graph):
            names = sorted({n.op for n in others} | ({"graph output"} if is_graph_output(tensor, graph) else set()))
            raise CannotFuse(f"the attention scores '{tensor.name}' are also read by {', '.join(names)}")
        reader = node
        if is_op(node, "MatMul"):
            match.scale = scale
            _file_masks(match, masks, fold, shapes.rank(tensor), shapes)
            return node
        if is_op(node, "Cast"):
            if np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["to"])) not in FLOAT_DTYPES \
                    and node.attrs["to"] != TensorProto.BFLOAT16:
                raise CannotFuse(f"Cast '{node.name}' on the scores is not to a float type")
            match.details["casts"] = match.details.get("casts", 0) + 1
            tensor = node.inputs[0]
        elif is_op(node, "Mul") or is_op(node, "Div"):
            sides = [s for s in (0, 1) if scalar_factor(node, s, shapes) is not None]
            if not sides:
                raise CannotFuse(f"{node.op} '{node.name}' scales the scores by a non-constant or non-scalar")
            scale *= scalar_factor(node, sides[0], shapes)
            if scale <= 0:
                raise CannotFuse(f"{node.op} '{node.name}' scales the scores by a non-positive factor")
            tensor = node.inputs[sides[0]]
        elif is_op(node, "Tanh"):  # logit softcapping: cap * tanh(s / cap), cap the factor applied after the Tanh
            if match.softcap:
                raise CannotFuse(f"Tanh '{node.name}' caps the scores a second time")
            match.softcap, scale = scale, scale  # inside the Tanh, s / cap: the factors below multiply into cap
            tensor = node.inputs[0]
        elif is_op(node, "Reshape") and fold is None and shapes.rank(node.inputs[0]) == 3 \
                and shapes.rank(tensor) == 4:
            fold = node
            tensor = node.inputs[0]
        elif is_op(node, "Add"):
            sides = [s for s in (0, 1) if _reaches_scores(node.inputs[s])]
            blocker = next((b for b in map(_blocking_step, node.inputs) if b is not None), None)
            if not sides and blocker is not None:
                raise _not_attention_step(blocker)
            if len(sides) != 1:
                raise CannotFuse(f"cannot tell the scores from the added term in Add '{node.name}': both are "
                                 f"computed from MatMuls")
            if match.softcap:
                raise CannotFuse(f"Add '{node.name}' adds to the scores inside the softcap's Tanh; FusedAttention "
                                 f"adds masks and biases after the cap")
            if scale != 1.0:
                raise CannotFuse(f"the mask of Add '{node.name}' is added before the scores are scaled")
            masks.append((node.inputs[1 - sides[0]], "float", fold is not None))
            tensor = node.inputs[sides[0]]
        elif is_op(node, "Where"):
            cond, a, b = node.inputs
            if match.softcap:
                raise CannotFuse(f"Where '{node.name}' masks the scores inside the softcap's Tanh")
            if _reaches_scores(a) and _is_masked_fill(scalar_value(b)):
                masks.append(((cond, False), "keep", fold is not None))
                tensor, fill = a, scalar_value(b)
            elif _reaches_scores(b) and _is_masked_fill(scalar_value(a)):
                masks.append(((cond, True), "keep", fold is not None))
                tensor, fill = b, scalar_value(a)
            else:
                raise CannotFuse(f"Where '{node.name}' does not fill masked scores with -inf or a large negative")
            if fill != -math.inf:
                match.fills[id(cond)] = fill
        else:
            raise _not_attention_step(node)


_SIZE_STEPS = {"Gather", "Slice", "Unsqueeze", "Squeeze", "Concat", "Cast", "Mul", "Div", "Add", "Sub"}


def _sizes_only(node: gs.Node, reshape: gs.Node, graph: gs.Graph) -> bool:
    """Whether ``node`` is a Shape whose value only goes, through shape arithmetic, into the target of
    ``reshape`` (a Reshape the site replaces, as TorchScript sizes ``scores.view(-1, H, L, L)``)."""
    if not is_op(node, "Shape") or not is_op(reshape, "Reshape"):
        return False
    frontier = list(node.outputs)
    while frontier:
        tensor = frontier.pop()
        if is_graph_output(tensor, graph):
            return False
        for reader in consumers(tensor):
            if reader is reshape and reshape.inputs[1] is tensor and reshape.inputs[0] is not tensor:
                continue
            if not (is_standard(reader) and reader.op in _SIZE_STEPS):
                return False
            frontier.extend(reader.outputs)
    return True


def _file_masks(match: Match, masks: list, fold: gs.Node | None, rank: int | None, shapes: TensorShapes) -> None:
    """Sort the walk's masks: those in the scores' [B,H,L,L] space (and any of rank <= 2, which broadcast alike)
    are classified as usual; rank-3 ones added to scores whose heads are folded into the batch are passed as
    [B*H,L,L] tensors the replacement splits. Sets ``folded_heads`` for rank-3 scores."""
    if rank == 3:
        match.folded_heads = 1 if fold is None else shapes.dim(fold.outputs[0], 1)
        if match.folded_heads is None:
            raise CannotFuse(f"Reshape '{fold.name}' splits the folded scores into a head count that is not static")
    for mask, kind, past_fold in masks:
        tensor = mask if kind == "float" else mask[0]
        if rank == 3 and (past_fold or fold is None) and shapes.rank(tensor) == 3 and shapes.dim(tensor, 0) != 1:
            fill = match.fills.get(id(tensor)) if kind == "keep" else None
            match.folded_masks.append(mask if fill is None else FilledMask(*mask, fill))
        elif kind == "float":
            match.float_masks.append(mask)
        else:
            match.keep_masks.append(mask)


def _walk_probabilities(softmax: gs.Node, graph: gs.Graph, match: Match, shapes: TensorShapes) -> gs.Node:
    """From the Softmax output down to the MatMul with V, through Casts, Dropout, the NaN guard and (scores with
    heads folded into the batch) the Reshape folding [B,H,L,L] probabilities back to [B*H,L,L]."""
    tensor = softmax.outputs[0]
    folds = match.folded_heads is not None and shapes.rank(tensor) == 4  # [B,H,L,L] P of [B*H,L,L] scores
    while True:
        if is_graph_output(tensor, graph):
            raise CannotFuse(f"the attention probabilities '{tensor.name}' are a graph output")
        readers = consumers(tensor)
        if len(readers) == 1 and (is_op(readers[0], "Cast") or is_op(readers[0], "Dropout")):
            node = readers[0]
            if is_op(node, "Dropout") and (len(node.outputs) > 1 and node.outputs[1].outputs
                                            or len(node.inputs) > 2 and is_present(node.inputs[2])
                                            and scalar_value(node.inputs[2]) != 0):
                raise CannotFuse(f"Dropout '{node.name}' on the probabilities runs in training mode")
            tensor = node.outputs[0]
            continue
        unfold = next((n for n in readers if is_op(n, "Reshape") and n.inputs[0] is tensor), None)
        if folds and unfold is not None and shapes.rank(unfold.outputs[0]) == 3 and all(
                n is unfold or _sizes_only(n, unfold, graph) for n in readers):
            folds, tensor = False, unfold.outputs[0]
            continue
        guard = _nan_guard(tensor, readers)
        if guard is not None:
            tensor = guard.outputs[0]
            continue
        pair = _probability_qdq(tensor, readers)
        if pair is not None:
            if match.p_scale is not None:
                raise CannotFuse("the attention probabilities pass two FP8 Q/DQ pairs; FusedAttention quantizes P once")
            tensor, match.p_scale = pair
            continue
        if len(readers) == 1 and is_op(readers[0], "MatMul") and readers[0].inputs[0] is tensor \
                and readers[0].inputs[1] is not tensor:
            return readers[0]
        names = ", ".join(sorted({f"{n.op}" for n in readers})) or "nothing"
        raise CannotFuse(f"the attention probabilities '{tensor.name}' are read by {names}, not only by the MatMul "
                         f"with V")


def _probability_qdq(tensor: gs.Tensor, readers: list) -> tuple[gs.Tensor, float] | None:
    """(the DequantizeLinear output, its scale) when the probabilities' one reader is an FP8 QuantizeLinear read
    only by a DequantizeLinear (Model Optimizer's Q/DQ on P), else None."""
    if len(readers) != 1 or not is_op(readers[0], "QuantizeLinear"):
        return None
    dq = consumers(readers[0].outputs[0])
    if len(dq) != 1 or not is_op(dq[0], "DequantizeLinear"):
        return None
    source, scale = peel_qdq(dq[0].outputs[0])
    return (dq[0].outputs[0], scale) if scale is not None and source is tensor else None


def _nan_guard(tensor: gs.Tensor, readers: list) -> gs.Node | None:
    """The Where(IsNaN(p), 0, p) the sdpa export puts after Softmax (fully masked rows -> 0), else None."""
    if len(readers) != 2:
        return None
    isnan = next((n for n in readers if is_op(n, "IsNaN")), None)
    where = next((n for n in readers if is_op(n, "Where")), None)
    if isnan is None or where is None or consumers(isnan.outputs[0]) != [where]:
        return None
    if where.inputs[0] is isnan.outputs[0] and where.inputs[2] is tensor and scalar_value(where.inputs[1]) == 0:
        return where
    return None


def match_softmax(softmax: gs.Node, graph: gs.Graph, shapes: TensorShapes) -> Match:
    """The attention site a Softmax anchors, traced through the scores to Q·Kᵀ and through P to P·V."""
    match = Match(anchor=softmax, q=Operand(), k=Operand(), v=Operand(), out=Output())
    scores_mm = _walk_scores(softmax, graph, match, shapes)
    qb, kt = scores_mm.inputs
    rank = shapes.rank(qb) or shapes.rank(kt) or shapes.rank(scores_mm.outputs[0])
    if rank not in (3, 4):
        raise CannotFuse(f"the Softmax input comes from MatMul '{scores_mm.name}' of rank {rank or 'unknown'}, not a "
                         f"rank-4 Q·Kᵀ or a rank-3 one with the heads folded into the batch")
    axis = softmax.attrs.get("axis", -1 if graph.opset >= 13 else 1)  # before opset 13: 2-D coercion at axis
    if axis not in (-1, (shapes.rank(softmax.inputs[0]) or rank) - 1):
        raise CannotFuse(f"Softmax '{softmax.name}' normalizes axis {axis}, not the last (keys) axis")
    pv_mm = _walk_probabilities(softmax, graph, match, shapes)
    values = peel_float_cast(pv_mm.inputs[1])
    if rank == 3:
        return _folded_match(match, qb, kt, values, pv_mm, shapes)
    match.q, q_factor = trace_bhsd(qb, False, shapes)
    match.k, k_factor = trace_keys(kt, shapes)
    match.v, v_factor = trace_bhsd(values, True, shapes)
    if v_factor != 1.0:
        match.v = Operand(bhsd=values)  # scaled values: keep the scaled tensor
    match.scale *= q_factor * k_factor
    match.out = trace_output(pv_mm.outputs[0], graph, match, shapes)
    if shapes.rank(pv_mm.outputs[0]) not in (None, 4):
        raise CannotFuse(f"the MatMul with V '{pv_mm.name}' is not rank 4")
    return match


def _folded_match(match: Match, q: gs.Tensor, kt: gs.Tensor, values: gs.Tensor, pv_mm: gs.Node,
                  shapes: TensorShapes) -> Match:
    """Q·Kᵀ and P·V on [B*H,L,D] operands (heads folded into the batch, as torch's MultiheadAttention and
    DeBERTa compute them): operands traced through scalar scales, Kᵀ's Transpose undone."""
    heads = match.folded_heads
    q, q_factor, q_fp8 = peel_operand(q, shapes)
    kt, k_factor, k_fp8 = peel_operand(kt, shapes)
    values, v_fp8 = peel_qdq(values)
    if permutation(producer(kt)) == FOLDED_KEY_TRANSPOSE:
        keys, more, inner = peel_operand(producer(kt).inputs[0], shapes)
        match.k = with_fp8_scale(Operand(folded=keys, heads=heads, fp8_scale=inner), k_fp8, more)
        k_factor *= more
    else:
        match.k = Operand(folded_kt=kt, heads=heads, fp8_scale=k_fp8)
    match.q = Operand(folded=q, heads=heads, fp8_scale=q_fp8)
    match.v = Operand(folded=values, heads=heads, fp8_scale=v_fp8)
    match.scale *= q_factor * k_factor
    match.out = Output(folded=pv_mm.outputs[0], producer=pv_mm)
    if shapes.rank(pv_mm.outputs[0]) not in (None, 3) or shapes.rank(values) not in (None, 3):
        raise CannotFuse(f"the MatMul with V '{pv_mm.name}' is not rank 3 as the folded Q·Kᵀ is")
    match.details["folded_heads"] = heads
    return match
