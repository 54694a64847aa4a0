"""FP8 attention end to end on the CPU: ``fuse(precision="fp8")`` with calibration and Q/DQ models (Model
Optimizer's FP8 pattern on attention's MatMuls and Softmax) absorbed into FP8 FusedAttention, verified at the FP8
tolerance, and the patterns left alone with their reason.

The samples are models/samples/fp8/ (heads of 64: the FP8 kernel takes 64, 128, 256). A calibrated site's
scales are checked against the amax of what its node quantizes, found by running the fused model itself; the
error against the float original is FP8's (visible, bounded by FP8_RTOL). A Q/DQ model's fusion is compared with
its own Q/DQ original: close to FP8's size, not to float rounding, since the contract quantizes P before the
softmax's normalization and Model Optimizer's graph after it (verification.py says why)."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from trt_fusedattn.calibration import E4M3_MAX, Rotated, calibration_batches, record_amax
from trt_fusedattn.fp8 import qk_rotation
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, MIN_P_SCALE
from trt_fusedattn.verification import FP8_RTOL, verify

from _fp8_models import FP8_ATTENTION_SAMPLES, matmul_qdq_version, sample

QDQ_SAMPLES = tuple(name for name in FP8_ATTENTION_SAMPLES if name.endswith("torchscript"))  # Softmax patterns (the
# float16 Llama's pairs on P and V sit on its float32 P V, V's above the Cast up)


def fp8_attention_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if FUSED_ATTENTION.is_node(n) and FUSED_ATTENTION.node_attributes(n)["q_scale"]]


def worst(verification) -> float:
    return max(o.max_rel for o in verification.outputs)


def attention_sites(report) -> list:
    return [s for s in report.sites if s.family == "attention"]


@pytest.mark.parametrize("name", FP8_ATTENTION_SAMPLES)
def test_calibrated_sample_runs_fp8_attention_with_amax_over_448_scales(name):
    model = sample(name)
    fused, report = fuse(model, ["attention"], precision="fp8", calibration="random:3")  # ViT's conv: below
    nodes, sites = fp8_attention_nodes(fused), attention_sites(report)
    assert len(nodes) == len(sites) > 0 and all(s.fused and s.details["fp8"].startswith("calibrated") for s in sites)
    assert "q_scale=" in report.table()
    # the scales are amax / 448 of what each node quantizes (its QuantizeLinear inputs, run in the fused model: the
    # first node's inputs are the original's tensors exactly; later ones come through FP8 layers, FP8-close)
    producers = {o: n for n in fused.graph.node for o in n.output}
    quantized = {n.name: [producers[i].input[0] for i in n.input[:3]] for n in nodes}
    assert all(producers[i].op_type == "QuantizeLinear" for n in nodes for i in n.input[:3])
    amax = record_amax(fused, sorted({t for ts in quantized.values() for t in ts}), calibration_batches(model, 3))
    for i, node in enumerate(nodes):
        attrs = FUSED_ATTENTION.node_attributes(node)
        got = [attrs[k] for k in ("q_scale", "k_scale", "v_scale")]
        exact = 2e-3 if "fp16" in name else 1e-6  # a float16 model's QuantizeLinear holds its scale in float16
        np.testing.assert_allclose(got, [amax[t] / E4M3_MAX for t in quantized[node.name]],
                                   rtol=exact if i == 0 else 0.05)
        assert attrs["p_scale"] == 0.0 and attrs["output_dtype"] == "auto"
    assert fused.opset_import[0].version >= 19 and fused.ir_version >= 9
    onnx.checker.check_model(fused)
    result = verify(model, fused)
    print(name, result.table())
    assert result.passed and all(o.rtol == FP8_RTOL for o in result.outputs), result.table()
    assert 1e-5 < worst(result) < FP8_RTOL  # FP8's own error: visible, bounded


def test_vit_runs_fp8_convs_and_fp8_attention_together():
    model = sample("vit_hd64_torchscript")
    fused, report = fuse(model, precision="fp8", calibration="random:3")
    assert len(fp8_attention_nodes(fused)) == 2 and any(s.family == "conv" and "input_scale=" in s.details["fp8"]
                                                         for s in report.sites)
    result = verify(model, fused)
    print("vit_hd64_torchscript conv+attention", result.table())
    assert result.passed and 1e-4 < worst(result) < FP8_RTOL, result.table()


def test_file_calibration_with_percentile_gives_fp8_attention(tmp_path):
    from trt_fusedattn.random_inputs import random_inputs

    model = sample("llama_gqa_hd64_torchscript")
    feeds = [random_inputs(model, seed=300 + i) for i in range(3)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    by_max, _ = fuse(model, precision="fp8", calibration=str(tmp_path / "calib.npz"))
    fused, report = fuse(model, precision="fp8", calibration=str(tmp_path / "calib.npz"),
                         calib_method="percentile:99.9")
    assert len(fp8_attention_nodes(fused)) == 2
    scales = [[FUSED_ATTENTION.node_attributes(n)[k] for k in ("q_scale", "k_scale", "v_scale")]
              for n in fp8_attention_nodes(fused)]
    maxed = [[FUSED_ATTENTION.node_attributes(n)[k] for k in ("q_scale", "k_scale", "v_scale")]
             for n in fp8_attention_nodes(by_max)]
    assert np.all(np.array(scales) <= np.array(maxed)) and np.any(np.array(scales) < np.array(maxed))
    result = verify(model, fused)
    assert result.passed and 1e-5 < worst(result) < FP8_RTOL, result.table()


@pytest.mark.parametrize("name", QDQ_SAMPLES)
def test_qdq_sample_is_absorbed_into_fp8_attention(name):
    original = sample(name)
    qdq = matmul_qdq_version(original)
    pairs = sum(n.op_type == "DequantizeLinear" for n in qdq.graph.node)
    fused, report = fuse(qdq)
    sites = attention_sites(report)
    assert len(fp8_attention_nodes(fused)) == len(sites) > 0
    assert all(s.details["fp8"].startswith("Q/DQ") for s in sites)
    for node in fp8_attention_nodes(fused):
        assert FUSED_ATTENTION.node_attributes(node)["p_scale"] == pytest.approx(MIN_P_SCALE, rel=1e-6)
    # each site's four pairs (Q, Kᵀ, P, V) are gone (constant folding may take weights' pairs too); the
    # projections' MatMuls keep theirs for TensorRT
    left = sum(n.op_type == "DequantizeLinear" for n in fused.graph.node)
    assert 0 < left <= pairs - 4 * len(sites)
    result = verify(qdq, fused)
    print(name, "vs its Q/DQ original:", result.table())
    assert result.passed and worst(result) < 0.1, result.table()
    assert verify(original, fused).passed


def _bert_qdq() -> onnx.ModelProto:
    return matmul_qdq_version(sample("bert_sdpa_hd64_torchscript"), samples=2)


def _softmax_pair(model: onnx.ModelProto) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """The first site's Q/DQ pair on the probabilities (its QuantizeLinear reads a tensor computed from Softmax)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            source = producers.get(node.input[0])
            for _ in range(3):
                if source is None or source.op_type == "Softmax":
                    break
                source = producers.get(source.input[-1] if source.op_type == "Where" else source.input[0])
            if source is not None and source.op_type == "Softmax":
                dq = next(n for n in model.graph.node
                          if n.op_type == "DequantizeLinear" and n.input[0] == node.output[0])
                return node, dq
    raise AssertionError("no Q/DQ on the probabilities")


def _set_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    old = next(t for t in model.graph.initializer if t.name == name)
    model.graph.initializer.remove(old)
    model.graph.initializer.append(numpy_helper.from_array(value, name))


def _unquantized_p(model):
    q, dq = _softmax_pair(model)
    model.graph.node.remove(q)
    model.graph.node.remove(dq)
    for node in model.graph.node:
        node.input[:] = [q.input[0] if i == dq.output[0] else i for i in node.input]


def _small_p_scale(model):
    q, _ = _softmax_pair(model)
    _set_initializer(model, q.input[1], np.array(0.5 / E4M3_MAX, np.float32))


def _per_channel_k(model):
    """K's pair (on the Q·Kᵀ MatMul's right input, [B, H, D, L]) with one scale per head-dim channel (axis 2)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers[next(n for n in model.graph.node if n.op_type == "Softmax").input[0]]
    while node.op_type != "MatMul":
        node = producers[node.input[0]]
    dq = producers[node.input[1]]
    for pair in (producers[dq.input[0]], dq):
        scale = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == pair.input[1])))
        name = f"{pair.output[0]}_channel"
        model.graph.initializer.extend([numpy_helper.from_array(np.full(64, scale, np.float32), f"{name}_scale"),
                                        numpy_helper.from_array(np.zeros(64, ml_dtypes.float8_e4m3fn), f"{name}_zero")])
        pair.input[1:] = [f"{name}_scale", f"{name}_zero"]
        pair.attribute.append(helper.make_attribute("axis", 2))


@pytest.mark.parametrize("change, reason", [
    (_unquantized_p, "but not on P"),
    (_small_p_scale, "below 1/448"),
    (_per_channel_k, "not per tensor"),
])
def test_unabsorbable_qdq_attention_is_left_with_its_reason(change, reason):
    model = _bert_qdq()
    change(model)
    fused, report = fuse(model)
    left = [s for s in attention_sites(report) if not s.fused]
    assert left and all(reason in s.reason for s in left), [s.reason for s in attention_sites(report)]
    assert len(fp8_attention_nodes(fused)) == len(attention_sites(report)) - len(left)  # the change hit one site
    assert verify(model, fused).passed


def test_heads_the_fp8_kernel_does_not_take_keep_their_dtype_with_the_plans_reason():
    model = sample("bert_sdpa_torchscript")  # heads of 16
    fused, report = fuse(model, precision="fp8", calibration="random:2")
    assert not fp8_attention_nodes(fused)
    assert all(s.details["fp8"].startswith("no: no FP8 kernel") for s in attention_sites(report))
    qdq = matmul_qdq_version(model, samples=2)
    fused, report = fuse(qdq)
    assert all(not s.fused and "no FP8 kernel" in s.reason for s in attention_sites(report))
    assert worst(verify(qdq, fused)) < 1e-4


def test_float32_graph_with_additive_mask_and_gqa_gets_float16_mask_and_output_casts():
    from _attention_graphs import attention_inputs, softmax_attention

    model = softmax_attention(heads=4, kv_heads=2, dim=64, mask="float", lq=9, lkv=9)
    fused, report = fuse(model, precision="fp8", calibration="random:2")
    (node,) = fp8_attention_nodes(fused)
    producers = {o: n for n in fused.graph.node for o in n.output}
    readers = [n for n in fused.graph.node if node.output[0] in n.input]
    assert producers[node.input[3]].op_type == "Cast" and helper.get_attribute_value(
        producers[node.input[3]].attribute[0]) == onnx.TensorProto.FLOAT16  # the float32 mask in float16
    assert [n.op_type for n in readers] == ["Cast"]  # float16 O back to the float32 readers
    result = verify(model, fused, inputs=attention_inputs(model, seed=4))
    assert result.passed and 1e-4 < worst(result) < FP8_RTOL, result.table()


def test_fp8_node_on_cast_e4m3_inputs_with_an_fp8_output_runs_under_onnxruntime():
    """float8 Q/K/V from Cast nodes (not Q/DQ), an e4m3 output with output_scale: the onnxruntime bridge carries
    both and the node computes its reference exactly."""
    from onnx import TensorProto

    from trt_fusedattn.ort_session import run_model

    rng = np.random.default_rng(8)
    shape = [1, 12, 2, 64]
    scales = dict(q_scale=0.02, k_scale=0.03, v_scale=0.01, p_scale=1 / 224, output_dtype="float8e4m3fn",
                  output_scale=0.005)
    nodes = [helper.make_node("Cast", [n], [f"{n}8"], to=TensorProto.FLOAT8E4M3FN) for n in "qkv"]
    nodes += [FUSED_ATTENTION.make_node(["q8", "k8", "v8"], ["o8"], causal=1, **scales),
              helper.make_node("Cast", ["o8"], ["o"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "fp8", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), FUSED_ATTENTION.opset()])
    model.ir_version = 9
    feeds = {n: (rng.standard_t(3, shape) * s * 100).astype(np.float32) for n, s in zip("qkv", (0.02, 0.03, 0.01))}
    got = run_model(model, feeds)["o"]
    e4m3 = {n: feeds[n].astype(ml_dtypes.float8_e4m3fn) for n in "qkv"}
    want = FUSED_ATTENTION.reference(e4m3["q"], e4m3["k"], e4m3["v"], causal=1, **scales)
    assert want.dtype == ml_dtypes.float8_e4m3fn and np.abs(want.astype(np.float32)).max() > 1
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_fp8_attention_samples_are_the_generated_set_and_match_their_generator():
    """models/samples/fp8 holds exactly models.generate's FP8 attention samples, each < 1 MB, each agreeing with
    the seeded torch model it came from."""
    torch = pytest.importorskip("torch")  # noqa: F841 - the generator builds the torch models
    from models import generate
    from models.export import relative_error

    from _fp8_models import SAMPLES

    made = [(name, exporter, torch.float32) for name, exporter in generate.FP8_ATTENTION_SAMPLES] + \
        [(name, exporter, torch.float16) for name, exporter in generate.FP8_ATTENTION_FP16_SAMPLES]
    files = sorted(p.name for p in (SAMPLES / "fp8").glob("*.onnx"))
    assert files == sorted(generate.fp8_attention_file(*spec) for spec in made)
    assert set(files) == {f"{name}.onnx" for name in FP8_ATTENTION_SAMPLES}
    for name, exporter, dtype in made:
        path = SAMPLES / "fp8" / generate.fp8_attention_file(name, exporter, dtype)
        assert path.stat().st_size < 1_000_000
        sample = generate.build(name, dtype, **generate.FP8_ATTENTION_CONFIG[name])
        assert relative_error(sample, path, batch=2, seq=6, seed=11) < (1e-2 if dtype == torch.float16 else 1e-4)


MODEL_OPTIMIZER = Path(__file__).parent / "data"  # exports of nvidia-modelopt 0.47 (quantize_mode="fp8", CPU)


def test_model_optimizer_fp8_vit_export_is_absorbed_into_fp8_attention():
    """Model Optimizer's own FP8 export of vit_hd64_torchscript (calibrated on its random inputs): Q/DQ on both
    inputs of both attention MatMuls and on the Softmax output; both sites become FP8 FusedAttention."""
    exported = onnx.load(MODEL_OPTIMIZER / "vit_hd64_modelopt_fp8.onnx")
    fused, report = fuse(exported)
    sites = attention_sites(report)
    assert len(fp8_attention_nodes(fused)) == len(sites) == 2 and all(s.details["fp8"].startswith("Q/DQ")
                                                                      for s in sites)
    result = verify(exported, fused)
    assert result.passed and worst(result) < 0.1, result.table()
    assert verify(sample("vit_hd64_torchscript"), fused).passed


def test_model_optimizer_fp8_bert_export_quantizes_the_scores_and_is_left_with_the_reason():
    """Model Optimizer's FP8 export of bert_sdpa_hd64_torchscript also quantizes the inputs of the mask's Add, the
    attention scores among them: no FP8 attention computes that, so the sites are left to TensorRT."""
    exported = onnx.load(MODEL_OPTIMIZER / "bert_hd64_modelopt_fp8.onnx")
    fused, report = fuse(exported)
    sites = attention_sites(report)
    assert len(sites) == 2 and all(not s.fused and "quantizes the attention scores" in s.reason for s in sites)
    # nothing fused, and the weights' Q(W) -> DQ pairs are kept (not folded): the same model up to float error
    result = verify(exported, fused)
    assert result.passed and worst(result) < 1e-3, result.table()


def test_a_scalar_scale_between_a_qdq_pair_and_the_head_split_divides_the_pairs_scale():
    """Kᵀ = DQ(Q(Transpose(c * K))): the fused node reads K, so it quantizes K with the pair's scale / c (the same
    e4m3 values) and c joins the attention scale; quantizing K with the pair's own scale would saturate at 448 c."""
    from onnx import TensorProto

    rng = np.random.default_rng(12)
    shape, c = [1, 9, 2, 64], 0.125
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    scales = {"q": np.abs(feeds["q"]).max() / E4M3_MAX, "k": c * np.abs(feeds["k"]).max() / E4M3_MAX,
              "v": np.abs(feeds["v"]).max() / E4M3_MAX, "p": 1 / E4M3_MAX}
    inits = [numpy_helper.from_array(np.array(s, np.float32), f"{n}_scale") for n, s in scales.items()]
    inits += [numpy_helper.from_array(np.zeros((), ml_dtypes.float8_e4m3fn), "zero"),
              numpy_helper.from_array(np.array(c, np.float32), "c")]

    def qdq(x, n):
        return [helper.make_node("QuantizeLinear", [x, f"{n}_scale", "zero"], [f"{n}8"]),
                helper.make_node("DequantizeLinear", [f"{n}8", f"{n}_scale", "zero"], [f"{n}_dq"])]
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Mul", ["k", "c"], ["kc"]),
             helper.make_node("Transpose", ["kc"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
             *qdq("qt", "q"), *qdq("kt", "k"), *qdq("vt", "v"),
             helper.make_node("MatMul", ["q_dq", "k_dq"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1), *qdq("p", "p"),
             helper.make_node("MatMul", ["p_dq", "v_dq"], ["o"]),
             helper.make_node("Transpose", ["o"], ["out"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    fused, report = fuse(model)
    (node,) = fp8_attention_nodes(fused)
    attrs = FUSED_ATTENTION.node_attributes(node)
    assert attrs["k_scale"] == pytest.approx(scales["k"] / c, rel=1e-6) and attrs["scale"] == pytest.approx(c)
    result = verify(model, fused, inputs=feeds)
    assert result.passed and worst(result) < 0.05, result.table()


def test_cli_fp8_attention_reports_each_sites_scales_and_verifies_at_the_fp8_tolerance(tmp_path, capsys):
    import json

    from trt_fusedattn.cli import main

    model = tmp_path / "bert.onnx"
    model.write_bytes(sample("bert_sdpa_hd64_torchscript").SerializeToString())
    code = main([str(model), "--precision", "fp8", "--calib", "random:2", "--verify", "--report",
                 str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "calibrating [" in err and "q_scale=" in out and "p_scale=1/448" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert [s["details"]["fp8"].split()[0] for s in report["sites"]] == ["calibrated"] * 2
    assert any("random calibration inputs" in note for note in report["notes"])
    assert all(o["rtol"] == FP8_RTOL and o["passed"] and o["max_rel"] > 1e-5 for o in report["verification"]["outputs"])
    assert len(fp8_attention_nodes(onnx.load(tmp_path / "bert.fused.onnx"))) == 2


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_qk_rotation_is_exact_in_16_bits_and_undone_by_the_scale(dim):
    rotation, c = qk_rotation(dim)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        assert np.array_equal(rotation.astype(dtype).astype(np.float64), rotation)
    np.testing.assert_array_equal(rotation @ rotation.T, c * np.eye(dim))
    rng = np.random.default_rng(dim)
    q, k = rng.standard_normal((2, 5, dim))
    np.testing.assert_allclose((q @ rotation) @ (k @ rotation).T / c, q @ k.T, atol=1e-12)


def _outlier_channel_inputs(model: onnx.ModelProto, seed: int, factor: float) -> dict:
    """attention_inputs with one head-dim channel of Q and K scaled by ``factor`` (an outlier channel, as LLMs'
    keys have)."""
    from _attention_graphs import attention_inputs

    feeds = attention_inputs(model, seed)
    for name in ("q", "k"):
        feeds[name][..., 5] *= factor
    return feeds


def test_rotated_qk_quantize_the_rotation_with_its_amax_and_undo_it_in_the_scale(tmp_path):
    from _attention_graphs import onnx_attention

    model = onnx_attention(batch=2, lq=32, lkv=32, heads=2, kv_heads=2, dim=128, rank=4)
    calibration = [_outlier_channel_inputs(model, seed, 8.0) for seed in (11, 12)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([c[k] for c in calibration]) for k in calibration[0]})
    fused, report = fuse(model, ["attention"], precision="fp8", calibration=str(tmp_path / "calib.npz"),
                         fp8_rotate_qk=True)
    (node,) = fp8_attention_nodes(fused)
    producers = {o: n for n in fused.graph.node for o in n.output}
    weights = {i.name: numpy_helper.to_array(i) for i in fused.graph.initializer}
    for i in (0, 1):  # Q and K: QuantizeLinear(MatMul(x, R)); V as before
        rotate = producers[producers[node.input[i]].input[0]]
        assert rotate.op_type == "MatMul" and np.array_equal(weights[rotate.input[1]], qk_rotation(128)[0])
    assert producers[node.input[2]].input[0] == "v"  # V quantized as it comes
    amax = [max(np.abs(Rotated(n, -1, 128).of(c[n])).max() for c in calibration) for n in "qk"]
    amax.append(max(np.abs(c["v"]).max() for c in calibration))
    attrs = FUSED_ATTENTION.node_attributes(node)
    np.testing.assert_allclose([attrs[k] for k in ("q_scale", "k_scale", "v_scale")], np.array(amax) / E4M3_MAX,
                               rtol=1e-6)
    assert attrs["scale"] == pytest.approx(128 ** -0.5 / 2)  # R Rᵀ = 2 I at head dim 128
    assert "Q/K rotated (Hadamard 128)" in report.sites[0].details["fp8"]
    assert verify(model, fused, inputs=_outlier_channel_inputs(model, 0, 8.0)).passed


def test_rotation_lowers_the_error_of_an_outlier_channel(tmp_path):
    """One Q/K channel 8x the others: per-tensor scales spend E4M3's range on it; rotated, it is spread over all
    channels (benchmarks/results/attention_fp8_accuracy.md measures the same on the kernel's contract)."""
    from _attention_graphs import onnx_attention

    model = onnx_attention(batch=2, lq=64, lkv=64, heads=2, kv_heads=2, dim=64, rank=4)
    calibration = [_outlier_channel_inputs(model, seed, 8.0) for seed in (11, 12, 13)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([c[k] for c in calibration]) for k in calibration[0]})
    errors = {}
    for rotate in (False, True):
        fused, _ = fuse(model, ["attention"], precision="fp8", calibration=str(tmp_path / "calib.npz"),
                        fp8_rotate_qk=rotate)
        result = verify(model, fused, inputs=_outlier_channel_inputs(model, 0, 8.0))
        errors[rotate] = (result.outputs[0].rel_l2, result.passed)
    assert errors[True][1] and errors[True][0] < 0.7 * errors[False][0], errors  # unrotated: beyond FP8_RTOL here


def test_fp8_rotate_qk_needs_fp8_calibration(tmp_path, capsys):
    from trt_fusedattn.cli import main

    model = tmp_path / "bert.onnx"
    model.write_bytes(sample("bert_sdpa_hd64_torchscript").SerializeToString())
    assert main([str(model), "--fp8-rotate-qk", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--fp8-rotate-qk" in err and "--precision fp8" in err
    assert not (tmp_path / "bert.fused.onnx").exists()


def _rotation_matmuls(model: onnx.ModelProto) -> list:
    rotations = {i.name for i in model.graph.initializer
                 if i.dims and i.dims[0] in (64, 128, 256) and list(i.dims) == [i.dims[0]] * 2
                 and np.array_equal(numpy_helper.to_array(i).astype(np.float64), qk_rotation(i.dims[0])[0])}
    return [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in rotations]


@pytest.mark.parametrize("name", ["bert_sdpa_hd64_torchscript", "bert_sdpa_hd64_dynamo", "vit_hd64_torchscript"])
def test_rotation_folds_into_the_qk_projections(name):
    """Q and K come from MatMul + bias through a head split: the rotation moves into those weights (no MatMul added),
    and the model computes what the rotated one with explicit MatMuls did."""
    model = sample(name)
    plain, _ = fuse(model, ["attention"], precision="fp8", calibration="random:3")
    fused, report = fuse(model, ["attention"], precision="fp8", calibration="random:3", fp8_rotate_qk=True)
    assert all("Q/K rotated" in s.details["fp8"] for s in attention_sites(report))
    assert not _rotation_matmuls(fused)
    count = lambda m: sum(n.op_type == "MatMul" for n in m.graph.node)  # noqa: E731
    assert count(fused) == count(plain)
    result = verify(model, fused)
    assert result.passed and worst(result) < FP8_RTOL, result.table()


def test_rotation_after_rope_stays_an_explicit_matmul():
    """Llama's Q and K pass RoPE after the projection: nothing to fold into, the emitted MatMuls stay."""
    model = sample("llama_gqa_hd64_torchscript")
    fused, report = fuse(model, ["attention"], precision="fp8", calibration="random:3", fp8_rotate_qk=True)
    assert len(_rotation_matmuls(fused)) == 2 * len(attention_sites(report))
    assert verify(model, fused).passed
