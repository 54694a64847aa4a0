"""What FusedAttention needs of a match, checked on the dims and dtypes the graph determines: one K/V head
group, float dtypes, query heads a multiple of K/V heads, static head dims the kernels take (V's may differ from
Q/K's), masks it broadcasts."""
from __future__ import annotations

import numpy as np

from trt_fusedattn.plugins.attention.contract import head_dim_problem
from trt_fusedattn.rewrites import CannotFuse
from trt_fusedattn.rewrites._graph import numpy_dtype
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.masks import check_masks
from trt_fusedattn.rewrites.attention.match import Match, Operand
from trt_fusedattn.rewrites.attention.operands import FLOAT_DTYPES, is_float

def check(match: Match, shapes: TensorShapes) -> tuple[tuple, tuple]:
    """Assumptions the replacement relies on, from what shapes and dtypes are known; returns the static
    (query heads, K/V heads) and (Q/K head dim, V head dim), None where unknown."""
    kr, vr = match.k.repeats, match.v.repeats
    if (kr == 1) != (vr == 1) or None not in (kr, vr) and kr != vr:
        raise CannotFuse(f"K heads are repeated {kr or 'some'}x but V heads {vr or 'some'}x; FusedAttention "
                         f"shares one K/V head group")
    qtype = numpy_dtype(match.q.any())
    for name, op in (("K", match.k), ("V", match.v)):
        if qtype is not None and numpy_dtype(op.any()) is not None and numpy_dtype(op.any()) != qtype:
            raise CannotFuse(f"{name} has dtype {numpy_dtype(op.any())} but Q has {qtype}")
    if qtype is not None and qtype not in FLOAT_DTYPES - {np.dtype(np.float64)} and qtype.name != "bfloat16":
        raise CannotFuse(f"Q has dtype {qtype}; FusedAttention takes float16, bfloat16 or float32")
    out = next(t for t in (match.out.flat, match.out.folded, match.out.bhsd) if t is not None)
    out_type = numpy_dtype(out)
    if qtype is not None and out_type is not None and out_type != qtype and not is_float(out_type):
        raise CannotFuse(f"the attention output has dtype {out_type}, not a float type")
    hq, hkv = _heads(match.q, shapes), _heads(match.k, shapes)
    if hq and hkv and hq % hkv:
        raise CannotFuse(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    dq, dk, dv = (_head_dim(op, shapes) for op in (match.q, match.k, match.v))
    if dq is not None and dk is not None and dk != dq:
        raise CannotFuse(f"Q has head dim {dq} but K has {dk}; Q·Kᵀ needs one head dim")
    problem = head_dim_problem(dq if dq is not None else dk, dv)
    if problem:
        raise CannotFuse(problem)
    check_masks(match, shapes)
    return (hq, hkv), (dq if dq is not None else dk, dv)


def _heads(op: Operand, shapes: TensorShapes) -> int | None:
    """The static head count of an operand, where known."""
    if op.flat is not None or op.folded is not None or op.folded_kt is not None:
        return op.heads
    if op.bhsd is not None:
        return shapes.dim(op.bhsd, 1)
    return shapes.dim(op.bshd, 2) if op.bshd is not None else shapes.dim(op.kt, 1)


def _head_dim(op: Operand, shapes: TensorShapes) -> int | None:
    """The static head dim of an operand, where known."""
    if op.flat is not None:
        return shapes.dim(op.flat, 2) // op.heads if shapes.dim(op.flat, 2) else None
    if op.folded is not None or op.folded_kt is not None:
        return shapes.dim(op.folded, 2) if op.folded is not None else shapes.dim(op.folded_kt, 1)
    return shapes.dim(op.kt, 2) if op.kt is not None else shapes.dim(op.any(), 3)


def sequence_lengths(match: Match, shapes: TensorShapes) -> tuple:
    """Static (L_q, L_kv) where known."""
    def seq(op: Operand):
        if op.bhsd is not None:  # recorded only: sequence lengths are static only in static models
            return shapes.dim(op.bhsd, 2, infer=False)
        if op.bshd is not None:
            return shapes.dim(op.bshd, 1, infer=False)
        if op.kt is not None:
            return shapes.dim(op.kt, 3, infer=False)
        if op.folded is not None or op.folded_kt is not None:
            return shapes.dim(op.folded, 1, infer=False) if op.folded is not None else \
                shapes.dim(op.folded_kt, 2, infer=False)
        return shapes.dim(op.flat, 1, infer=False)
    return seq(match.q), seq(match.k)
