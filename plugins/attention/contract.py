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

FP8 (E4M3): Q, K and V are all float8e4m3fn or none is. With FP8 Q/K/V, q_scale, k_scale, v_scale > 0
dequantize them (real Q = q_scale * Q8, likewise K, V) and, with e4m3() the saturating round to nearest
even and p_scale 0 meaning 1/448:

    s[i, j] = scale * q_scale * k_scale * <Q8[i], K8[j]>         (then softcap, masks, causal as above)
    P[i, j] = exp(s[i, j] - max_j s[i, j]) over the unmasked j (0 where masked), so P <= 1
    O[i] = v_scale * p_scale * (sum_j e4m3(P[i, j] / p_scale) * V8[j]) / (sum_j P[i, j])

(the row sum of the unquantized P; a fully masked row gives 0), accumulated in float32 or better, then
written in ``output_dtype`` (auto: float16), or as e4m3(O / output_scale) when that is float8e4m3fn. The
additive mask is in the output dtype, float16 when the output is float8e4m3fn. The reference computes in
float64 but for these e4m3 roundings (``trt_fusedattn.fp8``). A kernel quantizes P relative to its running
max, so its roundings of P differ from the reference's where the running max moved: close, not bit-exact.
"""
from __future__ import annotations

import math

import numpy as np

from trt_fusedattn.contract import AttrSpec, OpContract, TensorSpec
from trt_fusedattn.fp8 import E4M3_MAX, NUMPY_NAME, ONNX_NAME, is_e4m3, numpy_dtype, quantize_e4m3, to_e4m3

LAYOUTS = ("BSHD", "BHSD")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
MAX_HEAD_DIM = 256      # Q/K and V head dims the kernels take on every path
MAX_HEAD_DIM_PORTABLE = 512  # ... and on the mma.sync path, which also takes 257-512 (correct, not tuned)
OUTPUT_DTYPES = ("auto", "float16", "bfloat16", ONNX_NAME)
FP8_SCALES = ("q_scale", "k_scale", "v_scale")
MIN_P_SCALE = float(np.float32(1.0 / E4M3_MAX))  # P = 1 must not saturate (compared as the float32 attribute: 1/448
#                                                 in float64 is below its float32 rounding, and must pass)


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


def dtype_name(dtype) -> str | None:
    """A dtype (numpy dtype, ml_dtypes type, or already a name) as numpy names it; None stays None."""
    return dtype if dtype is None or isinstance(dtype, str) else np.dtype(dtype).name


def effective_p_scale(p_scale: float) -> float:
    """The scale P is quantized with: ``p_scale``, or 1/448 when it is 0 (P = 1 lands on E4M3's largest value)."""
    return p_scale or 1.0 / E4M3_MAX


def output_dtype_name(q_dtype, attrs) -> str:
    """O's dtype (numpy's name) for Q's dtype and the node's attributes: ``output_dtype``, where auto is Q's dtype
    and float16 for float8e4m3fn Q."""
    wanted = attrs.get("output_dtype", "auto")
    if wanted == "auto":
        return "float16" if is_e4m3(q_dtype) else dtype_name(q_dtype)
    return NUMPY_NAME if wanted == ONNX_NAME else wanted


def mask_dtype_name(q_dtype, attrs) -> str:
    """The dtype of an additive mask: the output's, float16 when the output is float8e4m3fn."""
    out = output_dtype_name(q_dtype, attrs)
    return "float16" if is_e4m3(out) else out


def check_attributes(q_dtype, k_dtype, v_dtype, attrs) -> None:
    """Raise a one-line ValueError where the FP8 attributes (``attrs``, resolved or partial) do not fit the
    dtypes of Q, K and V (unknown dtypes: None); the rules are the contract's."""
    names = [dtype_name(d) for d in (q_dtype, k_dtype, v_dtype)]
    known = [n for n in names if n is not None]
    if any(map(is_e4m3, known)) and not all(map(is_e4m3, known)):
        raise ValueError(f"FusedAttention takes Q, K and V all float8e4m3fn or none of them; got Q {names[0]}, "
                         f"K {names[1]}, V {names[2]} (quantize all three, or none)")
    scales = {name: float(attrs.get(name, 0.0)) for name in (*FP8_SCALES, "p_scale")}
    wanted, output_scale = attrs.get("output_dtype", "auto"), float(attrs.get("output_scale", 0.0))
    if is_e4m3(names[0]):
        bad = [f"{name}={scales[name]:g}" for name in FP8_SCALES
               if not (math.isfinite(scales[name]) and scales[name] > 0)]
        if bad:
            raise ValueError(f"FusedAttention with float8e4m3fn Q/K/V needs q_scale, k_scale and v_scale > 0 (their "
                             f"dequantization scales); got {', '.join(bad)}")
        p_scale = scales["p_scale"]
        if p_scale and not (math.isfinite(p_scale) and float(np.float32(p_scale)) >= MIN_P_SCALE):  # as stored
            raise ValueError(f"p_scale={p_scale:g} is below 1/448, so P = 1 would saturate; give p_scale >= 1/448 "
                             f"(0 means 1/448)")
    elif names[0] is not None:
        given = [f"{name}={value:g}" for name, value in scales.items() if value]
        if given:
            raise ValueError(f"{', '.join(given)} given but Q is {names[0]}: the FP8 scales apply to float8e4m3fn "
                             f"Q/K/V only (leave them 0)")
        if wanted not in ("auto", names[0]):
            raise ValueError(f"output_dtype={wanted} needs float8e4m3fn Q/K/V; a {names[0]} FusedAttention writes "
                             f"its own dtype (use auto)")
    if wanted == ONNX_NAME and not (math.isfinite(output_scale) and output_scale > 0):
        raise ValueError(f"output_dtype={ONNX_NAME} needs output_scale > 0 (O8 = e4m3(O / output_scale)); got "
                         f"output_scale={output_scale:g}")
    if wanted != ONNX_NAME and output_scale:
        raise ValueError(f"output_scale={output_scale:g} applies to output_dtype={ONNX_NAME} only, not "
                         f"{wanted} (leave it 0)")


def fused_attention_reference(q, k, v, mask=None, key_lengths=None, *, layout="BSHD", scale=0.0,
                              causal=0, causal_alignment="top_left", softcap=0.0, q_scale=0.0, k_scale=0.0,
                              v_scale=0.0, p_scale=0.0, output_dtype="auto", output_scale=0.0):
    """The contract in numpy, computed in float64 (but for the FP8 roundings), returned in the output dtype and
    Q's layout."""
    fp8_attrs = dict(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, p_scale=p_scale, output_dtype=output_dtype,
                     output_scale=output_scale)
    q, k, v = (np.asarray(t) for t in (q, k, v))
    check_attributes(q.dtype, k.dtype, v.dtype, fp8_attrs)
    fp8 = is_e4m3(q.dtype)
    dequantize = (q_scale, k_scale, v_scale) if fp8 else (1.0, 1.0, 1.0)
    q64, k64, v64 = (to_bhsd(t, layout).astype(np.float64) * s for t, s in zip((q, k, v), dequantize))
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
    weighted = (quantize_e4m3(weights, effective_p_scale(p_scale)) if fp8 else weights) @ v64
    out = weighted / np.where(denom > 0, denom, 1.0)
    out = np.ascontiguousarray(out if layout == "BHSD" else out.transpose(0, 2, 1, 3))
    out_dtype = output_dtype_name(q.dtype, fp8_attrs)
    return to_e4m3(out, output_scale) if is_e4m3(out_dtype) else out.astype(numpy_dtype(out_dtype))


FUSED_ATTENTION = OpContract(
    name="FusedAttention",
    version=1,
    doc=__doc__,
    inputs=(
        TensorSpec("Q", "queries, [B, L_q, H_q, D_qk] (BSHD) or [B, H_q, L_q, D_qk] (BHSD); float16, bfloat16, "
                        "float32, or float8e4m3fn (with q_scale)"),
        TensorSpec("K", "keys, [B, L_kv, H_kv, D_qk] or [B, H_kv, L_kv, D_qk]; dtype of Q"),
        TensorSpec("V", "values, [B, L_kv, H_kv, D_v] or [B, H_kv, L_kv, D_v] (D_v may differ from D_qk); dtype of Q"),
        TensorSpec("mask", "additive (dtype of the output; float16 for a float8e4m3fn output) or boolean (True = "
                           "attend) mask, broadcast to [B, H_q, L_q, L_kv]", optional=True),
        TensorSpec("key_lengths", "int32 [B]: keys j >= key_lengths[b] are masked (key padding)", optional=True),
    ),
    outputs=(TensorSpec("O", "attention output, shape of Q with V's head dim D_v, layout of Q; dtype of Q, or "
                             "output_dtype for float8e4m3fn Q (auto: float16)"),),
    attributes=(
        AttrSpec("layout", "string", "BSHD", "memory order of Q, K, V and O", LAYOUTS),
        AttrSpec("scale", "float", 0.0, "multiplier of Q.K; 0 means 1/sqrt(D_qk)"),
        AttrSpec("softcap", "float", 0.0, "> 0: scores become softcap * tanh(scores / softcap) before the mask "
                 "is added (Gemma-2); 0: no cap"),
        AttrSpec("causal", "int", 0, "1: mask keys after the query's position", (0, 1)),
        AttrSpec("causal_alignment", "string", "top_left",
                 "top_left: query i sees keys <= i; bottom_right: keys <= i + L_kv - L_q", CAUSAL_ALIGNMENTS),
        AttrSpec("q_scale", "float", 0.0, "FP8: real Q = q_scale * Q for float8e4m3fn Q (> 0 then); 0 otherwise"),
        AttrSpec("k_scale", "float", 0.0, "FP8: real K = k_scale * K for float8e4m3fn K (> 0 then); 0 otherwise"),
        AttrSpec("v_scale", "float", 0.0, "FP8: real V = v_scale * V for float8e4m3fn V (> 0 then); 0 otherwise"),
        AttrSpec("p_scale", "float", 0.0, "FP8: P is quantized as e4m3(P / p_scale) for P·V; >= 1/448, 0 means "
                 "1/448; 0 for non-FP8 Q"),
        AttrSpec("output_dtype", "string", "auto", "auto: Q's dtype (float16 for float8e4m3fn Q); float16, "
                 "bfloat16 or float8e4m3fn (with output_scale) for float8e4m3fn Q only", OUTPUT_DTYPES),
        AttrSpec("output_scale", "float", 0.0, "output_dtype float8e4m3fn: O is written as e4m3(O / output_scale) "
                 "(> 0 then); 0 otherwise"),
    ),
    reference=fused_attention_reference,
)
