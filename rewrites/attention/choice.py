"""The attention rewrite's side of "never slower than TensorRT alone": a matched, checked site becomes an
AttentionShape from what the graph knows statically, and plugins/attention/tensorrt_choice decides for the target
arch whether it is fused or left to TensorRT (the site then stays as the model wrote it, reported with the
evidence)."""
from __future__ import annotations

import math

from trt_fusedattn.plugins.attention.tensorrt_choice import AttentionShape, choose
from trt_fusedattn.plugins.tensorrt_choice import Choice
from trt_fusedattn.rewrites._graph import numpy_dtype
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.fp8 import Fp8Scales
from trt_fusedattn.rewrites.attention.match import Match


def attention_shape(match: Match, dims: tuple, lengths: tuple, shapes: TensorShapes,
                    scales: Fp8Scales | None) -> AttentionShape:
    """The site as the choice rules key it; lengths and rows only where static."""
    if scales is not None:
        precision = "fp8" if scales.source == "Q/DQ" else "fp8-calibrated"
    else:
        dtype = numpy_dtype(match.q.any())
        precision = dtype.name if dtype is not None else "float16"
    head_dim = max((d for d in dims if d is not None), default=None)
    q_dims = shapes.of(match.q.any())
    rows = (math.prod(q_dims) // dims[0] if q_dims and dims[0] and all(isinstance(d, int) for d in q_dims)
            else None)
    len_q, len_kv = lengths
    masked = bool(match.float_masks or match.keep_masks or match.folded_masks or match.key_lengths is not None)
    chunked = (bool(match.causal) and match.causal_alignment == "bottom_right" and None not in lengths
               and len_q < len_kv)
    return AttentionShape(precision, head_dim, bool(match.causal), len_q, len_kv, rows, masked, chunked,
                          match.softcap > 0)


def site_choice(match: Match, dims: tuple, lengths: tuple, shapes: TensorShapes, scales: Fp8Scales | None,
                target: str | None) -> Choice | None:
    """The target's decision for this site (None without a target or evidence for its arch)."""
    if target is None:
        return None
    return choose(attention_shape(match, dims, lengths, shapes, scales), target)
