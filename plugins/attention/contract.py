"""``trt_fusedattn::FusedAttention``: scaled dot-product attention, its one definition and numpy reference.

Semantics, for batch b, query head h, query i, key j (H_q query heads, H_kv key/value heads,
H_q % H_kv == 0, query head h reads key/value head h // (H_q // H_kv); Q and K have head dim D_qk, V and
the output head dim D_v, which may differ):

    s[i, j] = scale * <Q[b, h, i, :], K[b, h_kv, j, :]>          (scale 0 means 1/sqrt(D_qk))
    s[i, j] = softcap * tanh(s[i, j] / softcap)   when softcap > 0 (Gemma-2's logit soft-capping)
    s[i, j] += mask[b, h, i, j]                   when the mask is float (after the cap, as Gemma-2)
    key j is *masked* for query i when any of:
        the boolean mask is False at [b, h, i, j];
        the float mask is -inf at [b, h, i, j];
        causal and j > i + offset  (offset = 0 for top_left, L_kv - L_q for bottom_right);
        key_lengths is given and j >= key_lengths[b]
    p[i, :] = softmax over the unmasked j of s[i, j]
    O[b, h, i, :] = sum_j p[i, j] V[b, h_kv, j, :];  a query row with every key masked gives O = 0

Any head dims from 1 to MAX_HEAD_DIM are part of the op; the kernels pad a head dim to their granularity
inside shared memory and registers, never in memory (``head_dim_problem`` says what a kernel cannot take).

Layouts (attribute ``layout``, the same for Q, K, V and the output): ``BSHD`` is [batch, seq, heads,
head_dim] (what a Linear projection reshaped to heads gives, no transpose), ``BHSD`` is [batch, heads,
seq, head_dim] (after the usual Transpose(0, 2, 1, 3)). The mask is in [batch, heads, L_q, L_kv] order
whatever the layout and broadcasts from any leading dims of size 1 (rank 2, 3 or 4). A float mask has
the dtype of Q; a boolean mask is True where attention is allowed (as ONNX Attention and torch SDPA).
"""
from __future__ import annotations

import numpy as np

from trt_fusedattn.contract import AttrSpec, OpContract, TensorSpec

LAYOUTS = ("BSHD", "BHSD")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
MAX_HEAD_DIM = 256      # Q/K and V head dims the kernels take on every path
MAX_HEAD_DIM_PORTABLE = 512  # ... and on the mma.sync path, which also takes 257-512 (correct, not tuned)


def head_dim_problem(dim_qk, dim_v) -> str | None:
    """Why the kernels cannot run head dims (D_qk, D_v) -- one line for a rewrite's skip reason -- or None.
    Dims that are not plain ints (not static in the model) are a problem: they are compile-time constants."""
    for name, d in (("Q/K", dim_qk), ("V", dim_v)):
        if not isinstance(d, int):
            return f"the {name} head dim is not static ({d!r}); the kernels are compiled for one head dim"
        if not 1 <= d <= MAX_HEAD_DIM_PORTABLE:
            return f"the {name} head dim {d} is outside 1..{MAX_HEAD_DIM_PORTABLE}"
    return None


def to_bhsd(x: np.ndarray, layout: str) -> np.ndarray:
    """View a Q/K/V/O tensor in [batch, heads, seq, head_dim] order."""
    return x if layout == "BHSD" else x.transpose(0, 2, 1, 3)


def allowed_keys(lq: int, lkv: int, batch: int, heads: int, *, mask=None, causal: int = 0,
                 causal_alignment: str = "top_left", key_lengths=None) -> np.ndarray:
    """Boolean [batch, heads, L_q, L_kv]: True where query i may attend to key j (all mask kinds but additive values)."""
    keep = np.ones((batch, heads, lq, lkv), dtype=bool)
    if mask is not None:
        m = np.asarray(mask)
        keep &= np.broadcast_to(m if m.dtype == bool else m != -np.inf, keep.shape)
    if causal:
        offset = 0 if causal_alignment == "top_left" else lkv - lq
        keep &= np.arange(lkv)[None, :] <= np.arange(lq)[:, None] + offset
    if key_lengths is not None:
        lengths = np.asarray(key_lengths).reshape(batch, 1, 1, 1)
        keep &= np.arange(lkv)[None, None, None, :] < lengths
    return keep


def fused_attention_reference(q, k, v, mask=None, key_lengths=None, *, layout="BSHD", scale=0.0,
                              causal=0, causal_alignment="top_left", softcap=0.0):
    """The contract in numpy, computed in float64 and returned in Q's dtype and layout."""
    q64, k64, v64 = (to_bhsd(np.asarray(t), layout).astype(np.float64) for t in (q, k, v))
    batch, hq, lq, dim = q64.shape
    hkv, lkv = k64.shape[1], k64.shape[2]
    if k64.shape[3] != dim or v64.shape[:3] != k64.shape[:3]:
        raise ValueError(f"K must have Q's head dim and V K's batch, heads and length (Q {q64.shape}, K {k64.shape}, "
                         f"V {v64.shape}, all as [B, H, L, D])")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    group = hq // hkv
    k64, v64 = np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1)
    scores = (scale or 1.0 / np.sqrt(dim)) * q64 @ k64.transpose(0, 1, 3, 2)
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0: no cap), got {softcap}")
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    if mask is not None and np.asarray(mask).dtype != bool:
        additive = np.asarray(mask).astype(np.float64)
        scores = scores + np.where(additive == -np.inf, 0.0, additive)
    keep = allowed_keys(lq, lkv, batch, hq, mask=mask, causal=causal,
                        causal_alignment=causal_alignment, key_lengths=key_lengths)
    scores = np.where(keep, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.where(keep, np.exp(scores - row_max), 0.0)
    denom = weights.sum(axis=-1, keepdims=True)
    out = (weights / np.where(denom > 0, denom, 1.0)) @ v64
    out = out if layout == "BHSD" else out.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(out).astype(np.asarray(q).dtype)


FUSED_ATTENTION = OpContract(
    name="FusedAttention",
    version=1,
    doc=__doc__,
    inputs=(
        TensorSpec("Q", "queries, [B, L_q, H_q, D_qk] (BSHD) or [B, H_q, L_q, D_qk] (BHSD); float16, bfloat16 or float32"),
        TensorSpec("K", "keys, [B, L_kv, H_kv, D_qk] or [B, H_kv, L_kv, D_qk]; dtype of Q"),
        TensorSpec("V", "values, [B, L_kv, H_kv, D_v] or [B, H_kv, L_kv, D_v] (D_v may differ from D_qk); dtype of Q"),
        TensorSpec("mask", "additive (dtype of Q) or boolean (True = attend) mask, broadcast to [B, H_q, L_q, L_kv]",
                   optional=True),
        TensorSpec("key_lengths", "int32 [B]: keys j >= key_lengths[b] are masked (key padding)", optional=True),
    ),
    outputs=(TensorSpec("O", "attention output, shape of Q with V's head dim D_v, dtype and layout of Q"),),
    attributes=(
        AttrSpec("layout", "string", "BSHD", "memory order of Q, K, V and O", LAYOUTS),
        AttrSpec("scale", "float", 0.0, "multiplier of Q.K; 0 means 1/sqrt(D_qk)"),
        AttrSpec("softcap", "float", 0.0, "> 0: scores become softcap * tanh(scores / softcap) before the mask "
                 "is added (Gemma-2); 0: no cap"),
        AttrSpec("causal", "int", 0, "1: mask keys after the query's position", (0, 1)),
        AttrSpec("causal_alignment", "string", "top_left",
                 "top_left: query i sees keys <= i; bottom_right: keys <= i + L_kv - L_q", CAUSAL_ALIGNMENTS),
    ),
    reference=fused_attention_reference,
)
