"""FusedAttention's numpy reference (CPU) against a loop written straight from the contract's text, one query row
at a time: any head dims, D_v != D_qk, softcap (Gemma-2: cap after scale, before the mask), GQA, masks, causal
alignments, key lengths, both layouts. FP8 Q/K/V: the emulation of the e4m3 roundings against the same loop, its
error against float64 on heavy-tailed inputs with outliers, the FP8 attributes' rules and the output dtype rule."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from trt_fusedattn.fp8 import is_e4m3, quantize_e4m3, to_e4m3
from trt_fusedattn.plugins.attention import OP as ATTENTION_OP
from trt_fusedattn.plugins.attention.contract import (FUSED_ATTENTION, MAX_HEAD_DIM_PORTABLE, check_attributes,
                                                      effective_p_scale, fused_attention_reference, head_dim_problem,
                                                      mask_dtype_name, output_dtype_name)


def row_by_row(q, k, v, mask, key_lengths, layout, scale, causal, alignment, softcap):
    """The contract's semantics, one (b, h, i) at a time in float64 (BHSD inputs)."""
    batch, hq, lq, dqk = q.shape
    hkv, lkv, dv = k.shape[1], k.shape[2], v.shape[3]
    out = np.zeros((batch, hq, lq, dv))
    scale = scale or 1.0 / math.sqrt(dqk)
    m = None if mask is None else np.broadcast_to(mask, (batch, hq, lq, lkv))
    for b in range(batch):
        for h in range(hq):
            hk = h // (hq // hkv)
            for i in range(lq):
                s, keep = [], []
                for j in range(lkv):
                    x = scale * float(np.dot(q[b, h, i], k[b, hk, j]))
                    if softcap:
                        x = softcap * math.tanh(x / softcap)
                    ok = True
                    if m is not None:
                        if m.dtype == bool:
                            ok = bool(m[b, h, i, j])
                        elif m[b, h, i, j] == -np.inf:
                            ok = False
                        else:
                            x += float(m[b, h, i, j])
                    if causal and j > i + (0 if alignment == "top_left" else lkv - lq):
                        ok = False
                    if key_lengths is not None and j >= key_lengths[b]:
                        ok = False
                    s.append(x)
                    keep.append(ok)
                if not any(keep):
                    continue
                top = max(x for x, ok in zip(s, keep) if ok)
                w = np.array([math.exp(x - top) if ok else 0.0 for x, ok in zip(s, keep)])
                out[b, h, i] = (w / w.sum()) @ v[b, hk]
    return out if layout == "BHSD" else out.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dqk, dv, softcap, mask, causal, alignment, layout", [
    (40, 40, 0.0, None, 0, "top_left", "BSHD"),
    (16, 32, 0.0, "bool", 1, "bottom_right", "BHSD"),
    (24, 8, 2.5, "additive", 0, "top_left", "BSHD"),
    (7, 13, 0.7, None, 1, "top_left", "BHSD"),
    (160, 80, 30.0, "additive", 1, "bottom_right", "BSHD"),
])
def test_reference_matches_the_contract_row_by_row(dqk, dv, softcap, mask, causal, alignment, layout):
    rng = np.random.default_rng(dqk * 1000 + dv)
    batch, hq, hkv, lq, lkv = 2, 4, 2, 5, 9
    qh = rng.standard_normal((batch, hq, lq, dqk))
    kh = rng.standard_normal((batch, hkv, lkv, dqk))
    vh = rng.standard_normal((batch, hkv, lkv, dv))
    m = None
    if mask == "bool":
        m = rng.random((batch, 1, lq, lkv)) > 0.3
        m[0, 0, 2] = False  # a row with every key masked
    elif mask == "additive":
        m = np.where(rng.random((lq, lkv)) > 0.3, rng.standard_normal((lq, lkv)), -np.inf)
    lengths = np.array([lkv - 3, 0], dtype=np.int32)
    scale = 0.9 if softcap else 0.0  # softcap models use a query scale that is not 1/sqrt(D)
    to_layout = (lambda x: x) if layout == "BHSD" else (lambda x: x.transpose(0, 2, 1, 3))
    got = fused_attention_reference(to_layout(qh), to_layout(kh), to_layout(vh), m, lengths, layout=layout,
                                    scale=scale, causal=causal, causal_alignment=alignment, softcap=softcap)
    want = row_by_row(qh, kh, vh, m, lengths, layout, scale, causal, alignment, softcap)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.abs(want).sum() > 0


def test_softcap_bounds_the_scores_and_changes_the_result():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 6, 2, 32)) * 4 for _ in range(3))
    plain = fused_attention_reference(q, k, v, scale=1.0)
    capped = fused_attention_reference(q, k, v, scale=1.0, softcap=1.0)
    # with |s| <= 1 every weight is within e^2 of every other: the capped output is close to the mean of V
    assert np.abs(capped - v.mean(axis=1, keepdims=True)).max() < np.abs(plain - v.mean(axis=1, keepdims=True)).max()
    with pytest.raises(ValueError, match="softcap"):
        fused_attention_reference(q, k, v, softcap=-1.0)


def test_contract_attribute_and_head_dim_rules():
    assert FUSED_ATTENTION.resolve({})["softcap"] == 0.0
    assert FUSED_ATTENTION.explicit_attributes(softcap=50.0) == {"softcap": 50.0}
    assert head_dim_problem(40, 40) is None and head_dim_problem(192, 128) is None
    assert head_dim_problem(MAX_HEAD_DIM_PORTABLE, 16) is None
    assert "outside" in head_dim_problem(16, MAX_HEAD_DIM_PORTABLE + 1)
    assert "not static" in head_dim_problem("d", 64)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="head dim"):
        fused_attention_reference(rng.random((1, 2, 1, 8)), rng.random((1, 2, 1, 16)), rng.random((1, 2, 1, 8)))


# ---- FP8 (E4M3) Q/K/V: the contract's emulation of the kernels' roundings ----

def e4m3(x, scale):
    """Quantize like the tests' own reading of the contract: e4m3(x / scale) with ml_dtypes, saturating."""
    return np.clip(np.asarray(x, np.float64) / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)


def heavy_tailed(rng, shape, outliers=True):
    """Student-t (3 degrees of freedom) values with a few outliers 30x the typical size: what activations look like."""
    x = rng.standard_t(3, shape)
    if outliers:
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, max(1, flat.size // 500), replace=False)] *= 30
    return x


def quantized(x, scale=None):
    """(e4m3 tensor, its scale): per-tensor amax / 448 unless given."""
    scale = scale or float(np.abs(x).max() / 448)
    return e4m3(x, scale), scale


def fp8_row_by_row(q8, k8, v8, qs, ks, vs, ps, mask, causal):
    """The FP8 semantics one query row at a time (BHSD, float64 but for e4m3 of P)."""
    batch, hq, lq, d = q8.shape
    hkv, lkv = k8.shape[1], k8.shape[2]
    out = np.zeros((batch, hq, lq, v8.shape[3]))
    ps = ps or 1 / 448
    for b, h, i in np.ndindex(batch, hq, lq):
        hk = h // (hq // hkv)
        s = np.array([qs * ks / math.sqrt(d) * float(np.dot(q8[b, h, i].astype(np.float64),
                                                             k8[b, hk, j].astype(np.float64))) for j in range(lkv)])
        keep = np.ones(lkv, bool) if mask is None else mask[b, 0, i].copy()
        if causal:
            keep &= np.arange(lkv) <= i
        if not keep.any():
            continue
        p = np.where(keep, np.exp(s - s[keep].max()), 0.0)
        p8 = e4m3(p, ps).astype(np.float64)
        out[b, h, i] = vs * ps * (p8 @ v8[b, hk].astype(np.float64)) / p.sum()
    return out


@pytest.mark.parametrize("p_scale, causal, masked", [(0.0, 0, False), (1 / 256, 1, False), (0.0, 0, True)])
def test_fp8_reference_matches_the_contract_row_by_row(p_scale, causal, masked):
    rng = np.random.default_rng(int(p_scale * 1e4) + 10 * causal + masked)
    batch, hq, hkv, lq, lkv, d = 2, 4, 2, 6, 11, 32
    (q8, qs), (k8, ks), (v8, vs) = (quantized(heavy_tailed(rng, (batch, h, n, d)))
                                    for h, n in ((hq, lq), (hkv, lkv), (hkv, lkv)))
    mask = None
    if masked:
        mask = rng.random((batch, 1, lq, lkv)) > 0.4
        mask[1, 0, 3] = False  # a fully masked row gives 0
    got = fused_attention_reference(q8, k8, v8, mask, layout="BHSD", causal=causal, q_scale=qs, k_scale=ks, v_scale=vs,
                                    p_scale=p_scale)
    want = fp8_row_by_row(q8, k8, v8, qs, ks, vs, p_scale, mask, causal)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    assert np.abs(want).max() > 0
    if masked:
        assert not got[1, :, 3].any()


def fp8_error(rng, scale_factor=1.0, outliers=True, d=64):
    """RMSE of the FP8 emulation against float64 attention of the real (unquantized) inputs, relative to the
    output's RMS, with per-tensor scales of amax / 448 times ``scale_factor``."""
    q, k, v = (heavy_tailed(rng, (1, 96, 2, d), outliers) for _ in range(3))
    want = fused_attention_reference(q, k, v)
    scales = [float(np.abs(t).max() / 448 * scale_factor) for t in (q, k, v)]
    got = fused_attention_reference(*(e4m3(t, s) for t, s in zip((q, k, v), scales)),
                                    q_scale=scales[0], k_scale=scales[1], v_scale=scales[2]).astype(np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2)))


def test_fp8_error_is_fp8_sized_and_shrinks_when_the_scales_fit_the_data():
    rng = np.random.default_rng(11)
    fitted = [fp8_error(rng) for _ in range(3)]
    # e4m3 keeps 3 mantissa bits (relative step 1/16), and softmax amplifies score errors: about 10%, never exact
    assert all(1e-3 < e < 0.2 for e in fitted), fitted
    # scales 8x too small saturate everything above amax / 8; 4096x too large push the values into e4m3's
    # subnormals (below 2^-6) where few bits are left
    for factor in (1 / 8, 4096):
        misfit = [fp8_error(rng, factor) for _ in range(3)]
        assert min(misfit) > 3 * max(fitted), (factor, fitted, misfit)


def test_fp8_output_dtypes_follow_the_attributes():
    rng = np.random.default_rng(5)
    (q8, qs), (k8, ks), (v8, vs) = (quantized(rng.standard_normal((1, 7, 2, 16))) for _ in range(3))
    scales = dict(q_scale=qs, k_scale=ks, v_scale=vs)
    auto = fused_attention_reference(q8, k8, v8, **scales)
    assert auto.dtype == np.float16 and auto.shape == (1, 7, 2, 16)
    bf16 = fused_attention_reference(q8, k8, v8, output_dtype="bfloat16", **scales)
    assert bf16.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(bf16.astype(np.float64), auto.astype(np.float64), rtol=1e-2, atol=1e-2)
    out_scale = float(np.abs(auto.astype(np.float64)).max() / 448)
    o8 = fused_attention_reference(q8, k8, v8, output_dtype="float8e4m3fn", output_scale=out_scale, **scales)
    assert o8.dtype == ml_dtypes.float8_e4m3fn
    exact = fused_attention_reference(q8, k8, v8, output_dtype="float8e4m3fn", output_scale=out_scale / 4, **scales)
    assert np.abs(o8.astype(np.float64)).max() == 448 and np.abs(exact.astype(np.float64)).max() == 448
    np.testing.assert_allclose(o8.astype(np.float64) * out_scale, auto.astype(np.float64), rtol=0.07,
                               atol=out_scale / 64)
    assert output_dtype_name("float8_e4m3fn", {}) == "float16"
    assert output_dtype_name("bfloat16", {"output_dtype": "auto"}) == "bfloat16"
    assert output_dtype_name("float8_e4m3fn", {"output_dtype": "float8e4m3fn"}) == "float8_e4m3fn"
    assert mask_dtype_name("float8_e4m3fn", {"output_dtype": "float8e4m3fn"}) == "float16"
    assert mask_dtype_name("float8_e4m3fn", {"output_dtype": "bfloat16"}) == "bfloat16"
    assert effective_p_scale(0.0) == 1 / 448 and effective_p_scale(0.01) == 0.01


F8 = "float8_e4m3fn"
SCALES = {"q_scale": 0.1, "k_scale": 0.1, "v_scale": 0.1}


@pytest.mark.parametrize("dtypes, attrs, message", [
    ((F8, "float16", F8), SCALES, "all float8e4m3fn or none"),
    ((F8, F8, F8), {"q_scale": 0.1, "k_scale": 0.1}, "v_scale=0"),
    ((F8, F8, F8), {**SCALES, "k_scale": -1.0}, "k_scale=-1"),
    ((F8, F8, F8), {**SCALES, "q_scale": math.inf}, "q_scale=inf"),
    ((F8, F8, F8), {**SCALES, "p_scale": 1 / 500}, "below 1/448"),
    (("float16",) * 3, {"q_scale": 0.5}, "apply to float8e4m3fn Q/K/V only"),
    (("float16",) * 3, {"p_scale": 0.01}, "apply to float8e4m3fn"),
    (("float16",) * 3, {"output_dtype": "bfloat16"}, "needs float8e4m3fn Q/K/V"),
    (("float32",) * 3, {"output_dtype": "float16"}, "writes its own dtype"),
    ((F8, F8, F8), {**SCALES, "output_dtype": "float8e4m3fn"}, "needs output_scale > 0"),
    ((F8, F8, F8), {**SCALES, "output_scale": 0.5}, "applies to output_dtype=float8e4m3fn only"),
])
def test_fp8_attribute_errors_are_one_line(dtypes, attrs, message):
    with pytest.raises(ValueError, match=message) as err:
        check_attributes(*dtypes, attrs)
    assert "\n" not in str(err.value)


def test_fp8_attribute_rules_accept_what_the_contract_allows():
    check_attributes(F8, F8, F8, {**SCALES, "p_scale": float(np.float32(1 / 448))})
    check_attributes(F8, F8, F8, {**SCALES, "p_scale": 1 / 448})  # float64 1/448 is below its float32 rounding
    check_attributes(F8, F8, F8, {**SCALES, "output_dtype": "float8e4m3fn", "output_scale": 0.02})
    check_attributes("bfloat16", "bfloat16", "bfloat16", {"output_dtype": "bfloat16"})
    check_attributes(None, None, None, SCALES)  # dtypes unknown: nothing to hold the scales against
    assert FUSED_ATTENTION.resolve({})["output_dtype"] == "auto"
    with pytest.raises(ValueError, match="not one of"):
        FUSED_ATTENTION.resolve({"output_dtype": "float32"})
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float16)
    with pytest.raises(ValueError, match="apply to float8e4m3fn"):
        fused_attention_reference(q, q, q, q_scale=1.0)


def test_op_record_output_dtype_and_mask_dtype_rule():
    assert ATTENTION_OP.output_dtype(["float16", "float16", "float16", "float16", None], {}) == "float16"
    assert ATTENTION_OP.output_dtype([F8, F8, F8, None, "int32"], SCALES) == "float16"
    assert ATTENTION_OP.output_dtype([F8, F8, F8, "bool", None], {**SCALES, "output_dtype": "bfloat16"}) == "bfloat16"
    assert ATTENTION_OP.output_dtype([F8, F8, F8, "float16", None],
                                     {**SCALES, "output_dtype": "float8e4m3fn", "output_scale": 1.0}) == F8
    with pytest.raises(ValueError, match="mask must be bfloat16"):
        ATTENTION_OP.output_dtype([F8, F8, F8, "float16", None], {**SCALES, "output_dtype": "bfloat16"})
    with pytest.raises(ValueError, match="mask must be float16"):
        ATTENTION_OP.output_dtype(["float16", "float16", "float16", "float32", None], {})
    with pytest.raises(ValueError, match="q_scale"):
        ATTENTION_OP.output_dtype([F8, F8, F8, None, None], {})


def test_e4m3_rounding_is_nearest_even_and_saturating():
    x = np.array([17.0, 19.0, 500.0, -1e9, 0.0, 1 / 1024, 3 / 1024, 448.0])  # ties at the subnormal 2^-9 step too
    np.testing.assert_array_equal(to_e4m3(x).astype(np.float64), [16.0, 20.0, 448.0, -448.0, 0.0, 0.0, 1 / 256, 448.0])
    np.testing.assert_array_equal(quantize_e4m3(x, 0.5), 0.5 * to_e4m3(x / 0.5).astype(np.float64))
    assert is_e4m3("float8e4m3fn") and is_e4m3(ml_dtypes.float8_e4m3fn) and not is_e4m3(np.float16)
