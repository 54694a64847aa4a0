"""The attention rewrite on the exported samples (both torch exporters) and on hand-built graphs: every site
fused and the fused model verified under onnxruntime against the original, or the site left with its reason."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests._attention_graphs import (attention_inputs, folded_heads_attention, irregular_scores, onnx_attention,
                                     softmax_attention)
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.verification import verify

SAMPLES = Path(__file__).resolve().parent.parent / "models" / "samples"
# item 5 of the issue: each architecture, both exporters (fp16 variants as the generator writes them)
REQUIRED = ("bert_eager_torchscript", "bert_eager_dynamo", "bert_sdpa_torchscript", "bert_sdpa_dynamo",
            "gpt2_torchscript", "gpt2_dynamo", "llama_gqa_torchscript", "llama_gqa_dynamo",
            "vit_torchscript", "vit_dynamo",
            # issue 14: folded heads + disentangled bias, softcap, D_v != D_qk, MoE routers beside attention
            "deberta_v2_torchscript", "deberta_v2_dynamo", "gemma2_torchscript", "gemma2_dynamo",
            "levit_torchscript", "levit_dynamo", "mixtral_torchscript", "mixtral_dynamo",
            "whisper_encoder_torchscript", "whisper_encoder_dynamo", "torch_transformer_torchscript",
            "torch_transformer_dynamo")
ATTENTION_OPS = ("Softmax", "Attention")


def _holds_attention(path: Path) -> bool:
    return any(n.op_type in ATTENTION_OPS for n in onnx.load(path, load_external_data=False).graph.node)


# every sample with a Softmax or an ONNX Attention node (the CNN samples have none)
ATTENTION_SAMPLES = sorted(p.stem for p in SAMPLES.glob("*.onnx") if _holds_attention(p))
# Decoders whose masks fill with -inf or are boolean: their causal part must become ``causal``. (Eager
# TorchScript exports fill with finfo.min: the causal part stays in the additive mask, which keeps rows with
# no visible key - left padding - exactly as the original computes them.)
CAUSAL = ("gpt2", "llama", "bart")


def _anchors(model: onnx.ModelProto) -> int:
    return sum(n.op_type in ATTENTION_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _routers(model: onnx.ModelProto) -> int:
    """Softmaxes whose probabilities go to a TopK (MoE expert routing), not to a MatMul with values."""
    topk_inputs = {n.input[0] for n in model.graph.node if n.op_type == "TopK"}
    return sum(n.op_type == "Softmax" and n.output[0] in topk_inputs for n in model.graph.node)


def _fused_nodes(model: onnx.ModelProto) -> list:
    return [n for n in model.graph.node if FUSED_ATTENTION.is_node(n)]


def _fuse_one_site(original: onnx.ModelProto):
    """(fused model, its one attention site) of a graph holding exactly one Softmax/Attention site."""
    fused, report = fuse(original, only=["attention"])
    (site,) = report.sites
    return fused, site


def _assert_verified(original: onnx.ModelProto, fused: onnx.ModelProto, seed: int) -> None:
    result = verify(original, fused, inputs=attention_inputs(original, seed=seed))
    assert result.passed, result.table()


def _sample_inputs(model: onnx.ModelProto, seed: int) -> dict:
    """Token ids or pixels at random, and an attention mask padded on the right in one row and on the left in
    another (so masks are exercised, including query rows with no key to attend)."""
    rng = np.random.default_rng(seed)
    feeds, dims = {}, {"batch": 2, "seq": 9, "height": 12, "width": 8}  # even sides: a UNet's skips meet again
    for value in model.graph.input:
        shape = [d.dim_value or dims.get(d.dim_param, 3) for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):  # pixels, latents
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in value.name:
            mask = np.ones(shape, np.int64)
            mask[0, -3:] = 0
            mask[-1, :2] = 0
            feeds[value.name] = mask
        else:
            feeds[value.name] = rng.integers(0, 50, shape, dtype=np.int64)
    return feeds


def test_required_samples_exist():
    missing = [name for name in REQUIRED if not (SAMPLES / f"{name}.onnx").exists()]
    assert not missing, f"samples missing from {SAMPLES}: {missing} (run models/generate.py)"


@pytest.mark.parametrize("name", ATTENTION_SAMPLES)
def test_sample_every_site_fused_and_verified(name):
    original = onnx.load(SAMPLES / f"{name}.onnx")
    fused, report = fuse(original, only=["attention"])
    sites = [s for s in report.sites if s.family == "attention"]
    assert sites and all(s.fused for s in sites), [(s.anchor, s.reason) for s in sites if not s.fused]
    assert len(_fused_nodes(fused)) == len(sites) == _anchors(original) - _routers(original)
    assert _anchors(fused) == _routers(original) == _routers(fused)  # routers are no sites and stay as they are
    if name.startswith("mixtral"):
        assert _routers(original) == 2
    if name.startswith("deberta"):  # [B*H, L, L] scores, the disentangled terms passed as the additive mask
        assert all(s.details["folded_heads"] == 2 and s.details["mask"] == "float" for s in sites), sites
    if name.startswith("gemma2"):
        assert all(s.details["softcap"] == 5.0 for s in sites), sites
    if name.startswith(CAUSAL) and "eager" not in name:
        decoder = [s for s in sites if "encoder" not in s.anchor]
        assert any(s.details["causal"] for s in decoder), [s.details for s in sites]
    if name.startswith(("bert", "gpt2", "bart")):  # every head split/merge Transpose absorbed by BSHD
        assert not [n for n in fused.graph.node if n.op_type == "Transpose"]
    if name.startswith("llama"):  # K and V enter with their own (fewer) heads: the repeat is gone
        assert all("gqa_group" in s.details for s in sites)
    for seed in (0, 1):
        result = verify(original, fused, inputs=_sample_inputs(original, seed))
        assert result.passed, result.table()


CASES = {
    "div_scale": dict(scale="div"),
    "mul_scale_bhsd_keys": dict(scale="mul", keys="bhsd"),
    "split_scale": dict(scale="split"),
    "float_mask": dict(mask="float"),
    "bool_where": dict(mask="where"),
    "masked_fill": dict(mask="masked_fill"),
    "causal_constant": dict(mask="causal_const"),
    "causal_trilu": dict(mask="trilu"),
    "causal_square_subsequent_mask": dict(mask="triu_neg_inf"),
    "causal_range": dict(mask="range"),
    "causal_range_and_float_mask": dict(mask="float+range"),
    "causal_range_less": dict(mask="range_less"),
    "causal_range_greater_drop": dict(mask="range_greater_drop"),
    "causal_range_bottom_right": dict(lq=3, lkv=6, mask="range_bottom_right"),
    "cross_attention": dict(lq=3, lkv=7, mask="float"),
    "causal_bottom_right": dict(lq=3, lkv=6, mask="causal_const_br"),
    "gqa_expand": dict(kv_heads=2, gqa="expand"),
    "gqa_tile": dict(kv_heads=2, gqa="tile", mask="where"),
    "mqa_tile_heads": dict(kv_heads=1, gqa="tile_heads"),
    "fp16_softmax_casts": dict(fp16_softmax=True),
    "merge_through_own_shape": dict(merge="shape", mask="float"),
}
EXPECTED = {  # details the fused node must carry
    "bool_where": {"mask": "bool"}, "masked_fill": {"mask": "bool"},
    "float_mask": {"mask": "float"}, "cross_attention": {"mask": "float"},
    "causal_constant": {"causal": 1, "mask": "none", "causal_alignment": "top_left"},
    "causal_trilu": {"causal": 1, "mask": "none"}, "causal_range": {"causal": 1, "mask": "none"},
    "causal_square_subsequent_mask": {"causal": 1, "mask": "none"},
    "causal_range_and_float_mask": {"causal": 1, "mask": "float"},
    "causal_bottom_right": {"causal": 1, "causal_alignment": "bottom_right"},
    "causal_range_less": {"causal": 1, "mask": "none"}, "causal_range_greater_drop": {"causal": 1, "mask": "none"},
    "causal_range_bottom_right": {"causal": 1, "mask": "none", "causal_alignment": "bottom_right"},
    "gqa_expand": {"gqa_group": 2}, "gqa_tile": {"gqa_group": 2}, "mqa_tile_heads": {"gqa_group": 4},
    "split_scale": {"layout": "BSHD"}, "merge_through_own_shape": {"layout": "BSHD"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hand_built_pattern_fused_and_verified(case):
    original = softmax_attention(**CASES[case])
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    assert abs(site.details["scale"] - 0.25) < 1e-6
    for key, value in EXPECTED.get(case, {}).items():
        assert site.details[key] == value, site.details
    (node,) = _fused_nodes(fused)
    assert not [n for n in fused.graph.node if n.op_type == "Softmax"]
    _assert_verified(original, fused, seed=3)


def test_additive_and_boolean_mask_combined():
    """Where(keep, S, -inf) + additive mask: one float mask input (the boolean part as -inf), verified."""
    original = irregular_scores("float_and_bool")
    fused, site = _fuse_one_site(original)
    assert site.fused and site.details["mask"] == "float", site.reason
    _assert_verified(original, fused, seed=6)


def test_keys_given_transposed():
    """Kᵀ with no Transpose to undo: one Transpose back to K is inserted; BHSD needs no other (Q, V, O)."""
    original = irregular_scores("kt_input")
    fused, site = _fuse_one_site(original)
    assert site.fused and site.details["layout"] == "BHSD", (site.reason, site.details)
    assert [n.op_type for n in fused.graph.node].count("Transpose") == 1
    _assert_verified(original, fused, seed=7)


def test_layers_share_one_mask_conversion():
    """masked_fill masks (True = drop) become one Not for all layers, not one per layer."""
    original = softmax_attention(mask="masked_fill", layers=3, lq=5, lkv=5)
    fused, report = fuse(original, only=["attention"])
    assert [s.fused for s in report.sites] == [True] * 3
    assert [n.op_type for n in fused.graph.node].count("Not") == 1
    _assert_verified(original, fused, seed=4)


def test_layout_absorbs_head_transposes():
    """BSHD in, BSHD out: the fused node reads the Reshapes' outputs and no Transpose is left."""
    fused, _ = fuse(softmax_attention(), only=["attention"])
    assert FUSED_ATTENTION.node_attributes(_fused_nodes(fused)[0])["layout"] == "BSHD"
    assert not [n for n in fused.graph.node if n.op_type == "Transpose"]


@pytest.mark.parametrize("case", ["bhsd_causal_gqa", "bshd_3d", "bool_mask", "float_mask_scale", "nonpad_kv_seqlen",
                                  "nonpad_kv_seqlen_3d_mask"])
def test_onnx_attention_op_fused_and_verified(case):
    kwargs = {"bhsd_causal_gqa": dict(is_causal=1, lq=7, lkv=7), "bshd_3d": dict(rank=3),
              "bool_mask": dict(mask="bool"), "float_mask_scale": dict(mask="float", scale=0.3),
              "nonpad_kv_seqlen": dict(nonpad=True), "nonpad_kv_seqlen_3d_mask": dict(nonpad=True, rank=3, mask="bool")}[case]
    original = onnx_attention(**kwargs)
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    _assert_verified(original, fused, seed=5)


LEFT_ALONE = {
    "softmax over the query axis": (lambda: softmax_attention(softmax_axis=2), "not the last"),
    "Tile repeating heads in h % H order": (lambda: softmax_attention(kv_heads=2, gqa="tile_heads"), "h % H_kv"),
    "Attention with past KV": (lambda: onnx_attention(past=True), "past_key/past_value"),
    "Attention causal per batch (nonpad_kv_seqlen)": (lambda: onnx_attention(nonpad=True, is_causal=1), "each batch"),
    "Attention mask shorter than the keys": (lambda: onnx_attention(mask="float", mask_len=4), "covers 4 of 7"),
    "probabilities also a graph output": (lambda: irregular_scores("probs_output"), "are a graph output"),
    "head dim the kernels cannot take": (lambda: softmax_attention(dim=520, heads=1, kv_heads=1), "head dim 520"),
    "Q and K head dims differ": (lambda: onnx_attention(dim=16, dim_k=8), "Q has head dim 16 but K has 8"),
    "mask added before the scale": (lambda: irregular_scores("mask_before_scale"), "before the scores are scaled"),
    "Where filling masked scores with 0": (lambda: irregular_scores("fill_zero"), "does not fill masked scores"),
    "scale from a graph input": (lambda: irregular_scores("dynamic_scale"), "non-constant"),
    "mask added inside the softcap": (lambda: irregular_scores("mask_inside_softcap"), "inside the softcap"),
}


@pytest.mark.parametrize("case", sorted(LEFT_ALONE))
def test_site_left_alone_with_reason(case):
    build, reason = LEFT_ALONE[case]
    original = build()
    fused, site = _fuse_one_site(original)
    assert not site.fused and reason in site.reason, site.reason
    assert not _fused_nodes(fused)
    assert sorted(n.op_type for n in fused.graph.node) == sorted(n.op_type for n in original.graph.node)


@pytest.mark.parametrize("reader", ["output", "TopK"])
def test_softmax_that_weights_no_values_is_no_site(reader):
    """A classifier head's Softmax (a model output) and a MoE router's (read by TopK) are not attention: no site,
    nothing counted, the graph unchanged."""
    from tests._attention_graphs import GraphBuilder

    g = GraphBuilder()
    logits = g.op("MatMul", [g.input("x", onnx.TensorProto.FLOAT, [2, 8]), g.const(np.ones((8, 3), np.float32))])
    probs = g.op("Softmax", [logits], axis=-1)
    original = g.model(probs if reader == "output" else g.op("TopK", [probs, g.const([2], np.int64)], outputs=2)[0],
                       rank=2)
    fused, report = fuse(original, only=["attention"])
    assert report.sites == [] and "no attention" in report.summary(), report.summary()
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in original.graph.node]


@pytest.mark.parametrize("kind", ["softcap", "softcap_mask"])
def test_softcap_becomes_the_softcap_attribute(kind):
    """Gemma-2's cap * tanh(scale * S / cap) (then the mask): softcap = cap, scale = the factor inside."""
    original = irregular_scores(kind)
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    assert site.details["softcap"] == pytest.approx(2.0) and site.details["scale"] == pytest.approx(0.4)
    assert not [n for n in fused.graph.node if n.op_type == "Tanh"]
    _assert_verified(original, fused, seed=8)


def test_onnx_attention_softcap_fused():
    original = onnx_attention(softcap=1.5, mask="float")
    fused, site = _fuse_one_site(original)
    assert site.fused and site.details["softcap"] == 1.5, site.reason
    _assert_verified(original, fused, seed=9)


@pytest.mark.parametrize("dims", [(40, 40), (80, 80), (24, 8), (16, 32)])
def test_any_head_dim_and_v_head_dim_differing_from_qk(dims):
    """Head dims outside the kernels' tiles (SD-1.5's 40, 80) and D_v != D_qk (LeViT) fuse as they are."""
    dim, dim_v = dims
    original = onnx_attention(dim=dim, dim_v=dim_v, rank=3)
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    _assert_verified(original, fused, seed=10)
    folded = folded_heads_attention(dim=dim, dim_v=dim_v)
    fused, site = _fuse_one_site(folded)
    assert site.fused, site.reason
    _assert_verified(folded, fused, seed=10)


FOLDED = {  # folded_heads_attention kwargs -> details the fused node must carry
    "mha": ({}, {"folded_heads": 1, "mask": "none"}),
    "mha_causal": ({"mask": "causal"}, {"folded_heads": 1, "causal": 1, "mask": "none"}),
    "mha_bias": ({"bias": True}, {"folded_heads": 1, "mask": "float"}),
    "split_heads": ({"split_heads": True, "scale": "keys"}, {"folded_heads": 4, "mask": "none"}),
    "deberta": ({"split_heads": True, "scale": "keys", "bias": True, "mask": "keep"},
                {"folded_heads": 4, "mask": "float"}),
}


@pytest.mark.parametrize("case", sorted(FOLDED))
def test_heads_folded_into_the_batch_fused_and_verified(case):
    """Rank-3 [B·H, L, L] scores (MultiheadAttention, DeBERTa-v2): score terms added before the mask pass as the
    additive mask; the heads split off by the scores' Reshape become H (else one head per folded batch)."""
    kwargs, expected = FOLDED[case]
    original = folded_heads_attention(**kwargs)
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    assert abs(site.details["scale"] - 0.25) < 1e-6
    for key, value in expected.items():
        assert site.details[key] == value, site.details
    assert not [n for n in fused.graph.node if n.op_type in ("Softmax", "Tanh")]
    _assert_verified(original, fused, seed=11)


TORCH_EXPORTS = {  # (style, exporter): details the fused node must carry
    ("repeat_interleave", "torchscript"): {"gqa_group": 2},
    ("repeat_interleave", "dynamo"): {"gqa_group": 2},
    ("bshd_expand", "torchscript"): {"gqa_group": 2},
    ("sdpa_causal", "torchscript"): {"gqa_group": 2, "causal": 1, "mask": "none"},  # Trilu mask, Tile repeat
    ("masked_fill_tril", "dynamo"): {"gqa_group": 2, "causal": 1, "mask": "none"},
    ("sdpa_gqa", "dynamo"): {"causal": 1, "mask": "none"},  # ONNX Attention with fewer K/V heads
    # head dim known to symbolic shape inference only; the packed projection's head split and the merge stay
    ("packed_qkv", "torchscript"): {"layout": "BHSD", "transposes": 2},
    # torch's module keeps its own sequence-first Transposes: no more than it had
    ("nn_mha_causal", "torchscript"): {"causal": 1, "mask": "none", "transposes": None},
    ("nn_mha_causal", "dynamo"): {"causal": 1, "mask": "none", "transposes": None},
}


@pytest.mark.parametrize("style,exporter", sorted(TORCH_EXPORTS))
def test_torch_export_variant_fused_and_verified(style, exporter, tmp_path):
    """Attention as authors write it (repeat_interleave, expand before the head split, sdpa with is_causal,
    masked_fill with tril, packed QKV), through either exporter: fused, the head Transposes absorbed, verified."""
    from tests._attention_graphs import export_torch_attention

    original = export_torch_attention(style, exporter, tmp_path / "attention.onnx")
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    expected = dict(TORCH_EXPORTS[(style, exporter)])
    transposes = expected.pop("transposes", 0)
    for key, value in expected.items():
        assert site.details[key] == value, site.details
    count = [n.op_type for n in fused.graph.node].count("Transpose")
    if transposes is None:
        assert count <= [n.op_type for n in original.graph.node].count("Transpose")
    else:
        assert count == transposes
    # torch's MultiheadAttention traces the sequence length into a Reshape: run it at the traced length
    result = verify(original, fused, dims={"batch": 2, "seq": 6 if style == "nn_mha_causal" else 5})
    assert result.passed, result.table()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_bfloat16_export_fused(exporter, tmp_path):
    """bfloat16 scales and fills are read as numbers (onnxruntime's CPU kernels cannot run bfloat16 models, so
    this checks the rewrite only; the GPU tests run such models)."""
    from tests._attention_graphs import export_torch_attention

    original = export_torch_attention("sdpa_causal", exporter, tmp_path / "attention.onnx", dtype="bfloat16")
    fused, site = _fuse_one_site(original)
    assert site.fused, site.reason
    assert abs(site.details["scale"] - 0.25) < 1e-6 and site.details["causal"] == 1, site.details
    assert len(_fused_nodes(fused)) == 1 and _anchors(fused) == 0
