"""FusedAttention's numpy reference (CPU) against a loop written straight from the contract's text, one query row
at a time: any head dims, D_v != D_qk, softcap (Gemma-2: cap after scale, before the mask), GQA, masks, causal
alignments, key lengths, both layouts."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trt_fusedattn.plugins.attention.contract import (FUSED_ATTENTION, MAX_HEAD_DIM_PORTABLE,
                                                      fused_attention_reference, head_dim_problem)


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
