"""Never slower than TensorRT alone, for attention: with a target arch the attention pass leaves to TensorRT each
site its own fused attention (cuDNN-class) runs faster there, by the rules of plugins/attention/tensorrt_choice,
and says why; without a target, or on an arch without evidence, every site is fused."""
from __future__ import annotations

import subprocess

import onnx
import pytest

import _attention_graphs as graphs
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.tensorrt_choice import RULES, ROWS_FULL, AttentionShape, choose

LEFT = "left to TensorRT: its fused attention is faster for this shape on sm_90"


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def to_tensorrt(**shape) -> bool:
    return choose(AttentionShape(**shape), "sm_90a").to_tensorrt


# (shape, left to TensorRT?, the measurement it stands on)
CASES = [
    (dict(precision="bfloat16", head_dim=64, len_q=2048, len_kv=2048, rows=ROWS_FULL * 4), True, "2k 0.91-1.02x"),
    (dict(precision="float16", head_dim=64, len_q=2048, len_kv=2048, rows=ROWS_FULL * 4), True, "fp16 2k 0.89-0.93x"),
    (dict(precision="bfloat16", head_dim=64, len_q=8192, len_kv=8192, rows=ROWS_FULL * 4), False, "8k 1.08-1.11x"),
    (dict(precision="float16", head_dim=64, len_q=4096, len_kv=4096, rows=ROWS_FULL * 4), False, "fp16 4k 1.02x"),
    (dict(precision="bfloat16", head_dim=64, len_q=4096, len_kv=4096, rows=2 ** 16), True, "SD self 0.96x"),
    (dict(precision="bfloat16", head_dim=64, len_q=1500, len_kv=1500, rows=8 * 20 * 1500), False, "Whisper 1.11x"),
    (dict(precision="bfloat16", head_dim=64, len_q=197, len_kv=197, rows=32 * 16 * 197), False, "ViT-L 1.01x"),
    (dict(precision="bfloat16", head_dim=64, causal=True, len_q=4096, len_kv=4096, rows=ROWS_FULL * 4), True,
     "hd64 causal 4k 0.88x"),
    (dict(precision="bfloat16", head_dim=64, causal=True, len_q=8192, len_kv=8192, rows=ROWS_FULL * 4), False,
     "hd64 causal 8k 1.02x"),
    (dict(precision="bfloat16", head_dim=128, causal=True, len_q=8192, len_kv=8192, rows=ROWS_FULL * 4), True,
     "hd128 causal 8k 0.93-0.94x"),
    (dict(precision="bfloat16", head_dim=128, causal=True, len_q=16384, len_kv=16384, rows=ROWS_FULL * 2), False,
     "hd128 causal 16k 1.04-1.10x"),
    (dict(precision="bfloat16", head_dim=128, len_q=16384, len_kv=16384, rows=ROWS_FULL * 2), False,
     "hd128 non-causal 16k 1.02-1.07x"),
    (dict(precision="float16", head_dim=128, len_q=4096, len_kv=4096, rows=ROWS_FULL * 4), False,
     "fp16 hd128 non-causal 4k 1.00-1.08x"),
    (dict(precision="bfloat16", head_dim=128, len_q=2048, len_kv=2048, rows=ROWS_FULL * 8), True,
     "hd128 non-causal 2k 0.81-0.96x"),
    (dict(precision="bfloat16", head_dim=128, causal=True), True, "dynamic lengths: the class rule"),
    (dict(precision="bfloat16", head_dim=256, causal=True, len_q=16384, len_kv=16384, rows=ROWS_FULL), False,
     "hd256 causal 16k 1.08-1.11x"),
    (dict(precision="bfloat16", head_dim=256, len_q=16384, len_kv=16384, rows=ROWS_FULL), True,
     "hd256 non-causal 16k 0.97-0.99x"),
    (dict(precision="bfloat16", head_dim=128, causal=True, len_q=512, len_kv=4096, chunked=True), False,
     "chunked prefill 2.06x"),
    (dict(precision="bfloat16", head_dim=64, len_q=512, len_kv=512, masked=True), False, "BERT padded 1.73x"),
    (dict(precision="bfloat16", head_dim=128, len_q=16, len_kv=32768, causal=True), False, "16-query decode 12.5x"),
    (dict(precision="bfloat16", head_dim=128, len_q=1, len_kv=32768), True, "1-query decode 0.74-1.02x"),
    (dict(precision="bfloat16", head_dim=64, len_q=1, len_kv=49), False, "1 query, 49 keys: the short-keys rule"),
    (dict(precision="bfloat16", head_dim=128, len_q=4096, len_kv=4096, softcap=True), False, "no softcap in cuDNN"),
    (dict(precision="fp8", head_dim=64, len_q=8192, len_kv=8192, rows=ROWS_FULL * 4), False, "FP8 hd64 8k 1.07x"),
    (dict(precision="fp8", head_dim=64, causal=True, len_q=16384, len_kv=16384, rows=ROWS_FULL * 2), False,
     "FP8 hd64 causal 16k 1.03x"),
    (dict(precision="fp8", head_dim=64, len_q=4096, len_kv=4096, rows=ROWS_FULL * 4), True, "FP8 hd64 4k 1.00x"),
    (dict(precision="fp8", head_dim=128, len_q=16384, len_kv=16384, rows=ROWS_FULL * 2), True, "FP8 hd128 0.83x"),
    (dict(precision="fp8-calibrated", head_dim=128, len_q=4096, len_kv=4096, rows=ROWS_FULL * 2), False,
     "calibrated FP8 hd128 4k 1.17x the 16-bit backend"),
    (dict(precision="fp8-calibrated", head_dim=256, causal=True, len_q=4096, len_kv=4096, rows=ROWS_FULL), True,
     "calibrated FP8 hd256 causal 4k 0.98x"),
]


@pytest.mark.parametrize("shape, left, why", CASES, ids=[c[2] for c in CASES])
def test_the_sm90_rules_follow_the_measurements(shape, left, why):
    assert to_tensorrt(**shape) is left, why


def test_every_rule_says_fused_or_tensorrt_with_its_evidence():
    for arch, rules in RULES.items():
        assert rules[-1].keys() == {"precision", "choice", "evidence"}  # a catch-all closes each arch's list
        for rule in rules:
            assert rule["choice"] in ("fused", "tensorrt") and rule["evidence"]


def test_arch_without_evidence_and_bad_targets():
    assert choose(AttentionShape("bfloat16", 128), "sm_80") is None
    with pytest.raises(ValueError, match="is not a GPU arch"):
        choose(AttentionShape("bfloat16", 128), "hopper")


def test_a_site_tensorrt_runs_faster_is_left_as_the_model_wrote_it():
    model = graphs.onnx_attention(batch=1, lq=300, lkv=300, heads=2, kv_heads=2, dim=16)
    left, report = fuse(model, target="sm_90a")
    (site,) = report.sites
    assert not site.fused and site.reason.startswith(LEFT) and "head dim 64 here" in site.reason
    assert site.details == {"left_to": "TensorRT", "target": "sm_90"}
    assert ops(left) == ["Attention"]
    fused, report = fuse(model)
    assert report.sites[0].fused and ops(fused) == [FUSED_ATTENTION.name]


def test_a_site_we_run_faster_is_fused_with_its_evidence():
    fused, report = fuse(graphs.onnx_attention(batch=1, lq=300, lkv=300, heads=2, kv_heads=2, dim=16, softcap=30.0),
                         target="sm_90")
    (site,) = report.sites
    assert site.fused and site.details["faster_than_tensorrt"].startswith("sm_90: soft-capped")
    assert FUSED_ATTENTION.name in ops(fused)


def test_static_lengths_come_from_the_graph():
    """The same site with 197 keys (ViT-L's) is fused, with 300 it is not: the rule reads the graph's lengths."""
    _, report = fuse(graphs.softmax_attention(batch=1, lq=197, lkv=197, heads=2, kv_heads=2, dim=16), target="sm_90a")
    assert report.sites[0].fused and "ViT-L" in report.sites[0].details["faster_than_tensorrt"]
    _, report = fuse(graphs.softmax_attention(batch=1, lq=300, lkv=300, heads=2, kv_heads=2, dim=16), target="sm_90a")
    assert not report.sites[0].fused and report.sites[0].reason.startswith(LEFT)


def test_arch_without_evidence_fuses_every_site():
    _, report = fuse(graphs.onnx_attention(batch=1, lq=300, lkv=300, heads=2, kv_heads=2, dim=16), target="sm_89")
    assert report.sites[0].fused and "faster_than_tensorrt" not in report.sites[0].details


def test_cli_target_leaves_the_site_and_says_why(tmp_path):
    model = tmp_path / "attention.onnx"
    onnx.save(graphs.onnx_attention(batch=1, lq=300, lkv=300, heads=2, kv_heads=2, dim=16), model)
    done = subprocess.run(["fuse-onnx", str(model), "-o", str(tmp_path / "out.onnx"), "--target", "sm_90a"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert ops(onnx.load(tmp_path / "out.onnx")) == ["Attention"]
    assert "left to TensorRT: its fused attention is faster" in done.stdout
