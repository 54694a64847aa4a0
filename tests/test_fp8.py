"""FP8 end to end on the CPU: ``fuse(precision="fp8")`` with calibration, Q/DQ models absorbed into FP8
FusedConv, verification at the FP8 tolerance, and the cases left alone with their reason.

Two kinds of check: a Q/DQ model already computes in FP8 (onnxruntime runs its QuantizeLinear/DequantizeLinear),
so its fused model must match it to float rounding: the fusion's own error, separate from FP8's. A calibrated
model is compared with its float original: that error is FP8's (bounded by FP8_RTOL), and the calibrated fused
model must equal the Q/DQ model built with the same scales (the emulation is the same computation)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from trt_fusedattn.calibration import E4M3_MAX, calibration_batches, record_amax
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.qdq import ConvScales, insert_conv_qdq
from trt_fusedattn.verification import FP8_RTOL, verify

import _conv_graphs as graphs
from _fp8_models import ATTENTION_SAMPLES, CONV_SAMPLES, conv_qdq_version, fp8_convs, matmul_qdq_version, sample

EXACT = 1e-5  # float rounding: the reference sums in float64, onnxruntime in float32 (4e-6 seen over 576 terms)


def fp8_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if FUSED_CONV.is_node(n) and FUSED_CONV.node_attributes(n)["input_scale"]]


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def worst(verification) -> float:
    return max(o.max_rel for o in verification.outputs)


def test_calibrated_conv_takes_amax_over_448_and_per_channel_e4m3_weights():
    model = graphs.conv_case(channels=16, out_channels=8)
    fused, report = fuse(model, precision="fp8", calibration="random:3")
    node = fp8_nodes(fused)[0]
    amax = record_amax(model, ["x"], calibration_batches(model, 3))["x"]
    assert FUSED_CONV.node_attributes(node)["input_scale"] == pytest.approx(amax / E4M3_MAX, rel=1e-6)
    w8, scale = initializer(fused, node.input[1]), initializer(fused, node.input[3])
    assert w8.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (8,)
    assert np.allclose(np.abs(w8.astype(np.float32)).reshape(8, -1).max(axis=1), E4M3_MAX)
    assert "input_scale=" in report.sites[0].details["fp8"] and fused.ir_version >= 9
    result = verify(model, fused)
    assert result.passed and 0 < worst(result) < FP8_RTOL, result.table()


def test_calibrated_equals_the_qdq_model_of_the_same_scales():
    """The FP8 reference is the Q/DQ computation: fused(calibrated) vs original-with-Q/DQ at the same scales."""
    model = graphs.residual_case(bn=True)
    fused, _ = fuse(model, precision="fp8", calibration="random:4")
    node, conv = fp8_nodes(fused)[0], next(n for n in model.graph.node if n.op_type == "Conv")
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    gamma, _, _, var = (initializer(model, name).astype(np.float64) for name in bn.input[1:])
    factor = gamma / np.sqrt(var + 1e-5)  # what BatchNorm multiplies each channel by, folded into W
    scales = ConvScales(FUSED_CONV.node_attributes(node)["input_scale"],
                        initializer(fused, node.input[3]) / np.abs(factor))
    qdq = insert_conv_qdq(model, {conv.name: scales})
    assert worst(verify(qdq, fused)) < 1e-5


@pytest.mark.parametrize("name", CONV_SAMPLES)
def test_conv_sample_fuses_in_fp8_from_random_calibration(name):
    model = sample(name)
    fused, report = fuse(model, precision="fp8", calibration="random:8")
    assert len(fp8_nodes(fused)) == len(fp8_convs(model)) > 0
    depthwise = [s for s in report.sites if "depthwise" in s.details.get("fp8", "")]
    assert len(depthwise) + len(fp8_nodes(fused)) == sum(s.family == "conv" for s in report.sites)
    result = verify(model, fused)
    assert result.passed and all(o.rtol == FP8_RTOL for o in result.outputs), result.table()
    assert 1e-4 < worst(result) < FP8_RTOL  # FP8's own error: visible, bounded


@pytest.mark.parametrize("name", ["resnet_dynamo", "mobilenetv2_torchscript", "vit_dynamo"])
def test_conv_sample_fuses_in_fp8_from_file_calibration(name, tmp_path):
    from trt_fusedattn.random_inputs import random_inputs

    model = sample(name)
    stacks = [random_inputs(model, seed=100 + i) for i in range(4)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([s[k] for s in stacks]) for k in stacks[0]})
    fused, report = fuse(model, precision="fp8", calibration=str(tmp_path / "calib.npz"),
                         calib_method="percentile:99.9")
    assert fp8_nodes(fused) and any("4 samples of" in note for note in report.notes)
    result = verify(model, fused)
    assert result.passed, result.table()


def site_errors(original: onnx.ModelProto, fused: onnx.ModelProto) -> dict[str, float]:
    """Each FP8 node alone: its reference on the tensors the original computes for its inputs (X as its Conv
    read it: after the Q/DQ pair, which the reference's own quantization leaves unchanged), against the tensor
    the original computes for its output (max relative error per node). Deep FP8 stacks amplify a
    single e4m3 rounding that float32 and float64 place on different sides of a tie (a Q/DQ ResNet: 0 to 2%
    at the output, by calibration seed), so the whole-model comparison is exact only for shallow ones; per
    node, the fusion's own computation is checked exactly everywhere."""
    from trt_fusedattn.ort_session import run_model
    from trt_fusedattn.random_inputs import random_inputs

    nodes = fp8_nodes(fused)
    producers = {out: n for n in original.graph.node for out in n.output}
    dequantized = {producers[n.input[0]].input[0]: n.output[0] for n in original.graph.node  # Q's input -> DQ's output
                   if n.op_type == "DequantizeLinear" and n.input[0] in producers}
    probed = onnx.ModelProto()
    probed.CopyFrom(original)
    wanted = {name for node in nodes for name in [node.input[0], *node.input[4:], node.output[0]]}
    wanted |= {dequantized[node.input[0]] for node in nodes if node.input[0] in dequantized}
    probed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in wanted)
    tensors = run_model(probed, random_inputs(original))
    weights = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    errors = {}
    for node in nodes:
        args = [tensors.get(name, weights.get(name)) if name else None for name in node.input]
        if node.input[0] in dequantized:  # X as the original's Conv read it: its quantization is checked apart
            args[0] = tensors[dequantized[node.input[0]]]
        elif producers[node.input[0]].op_type == "QuantizeLinear":  # e4m3 X: onnxruntime returns its bytes
            args[0] = tensors[node.input[0]].view(ml_dtypes.float8_e4m3fn)
        got = FUSED_CONV.reference(*args, **FUSED_CONV.node_attributes(node)).astype(np.float64)
        want = tensors[node.output[0]].astype(np.float64)
        errors[node.name] = float(np.abs(got - want).max() / np.abs(want).max())
    return errors


@pytest.mark.parametrize("name", CONV_SAMPLES)
def test_qdq_sample_is_absorbed_and_each_site_matches_its_original_exactly(name):
    original = conv_qdq_version(sample(name))
    fused, report = fuse(original, fp8_chains=False)  # each node's tensors are the original's (chains: test_fp8_chain)
    assert len(fp8_nodes(fused)) == len(fp8_convs(sample(name)))
    assert not [n for n in fused.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    fp8_names = {n.name for n in fp8_nodes(fused)}
    assert all(s.details["fp8"].startswith("Q/DQ") for s in report.sites if s.node in fp8_names)
    assert max(site_errors(original, fused).values()) < EXACT
    result = verify(original, fused)
    assert result.passed and (worst(result) < EXACT or "resnet" in name), result.table()


def test_qdq_with_float_weights_through_quantizelinear_is_absorbed():
    original = conv_qdq_version(sample("resnet_bn_torchscript"), quantize_weights=True)
    fused, _ = fuse(original, fp8_chains=False)
    assert len(fp8_nodes(fused)) == 17 and max(site_errors(original, fused).values()) < EXACT


def _single_conv_qdq(**changes):
    """A Q/DQ Conv -> BatchNorm -> Relu (BatchNorm factors of both signs), with one part of the pattern changed."""
    b = graphs.GraphBuilder()
    y = b.conv("x", 16, 8, (3, 3), pads=[1, 1, 1, 1])
    gamma = b.rng.uniform(0.5, 1.5, 8) * np.where(np.arange(8) % 3 == 0, -1, 1)
    params = [b.const(gamma), b.random((8,), 0.3), b.random((8,), 0.3), b.const(b.rng.uniform(0.5, 2, 8))]
    y = b.op("Relu", [b.op("BatchNormalization", [y] + params)])
    model = b.model({"x": [2, 16, 9, 9]}, {y: None})
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    w = initializer(model, conv.input[1])
    w_scale = changes.pop("w_scale") if "w_scale" in changes else np.abs(w).reshape(8, -1).max(1) / E4M3_MAX
    qdq = insert_conv_qdq(model, {conv.name: ConvScales(4.0 / E4M3_MAX, w_scale)})
    for node in qdq.graph.node:
        for key, edit in changes.items():
            if node.name.endswith(key):
                edit(node, qdq)
    return qdq


def test_negative_batchnorm_factors_flip_e4m3_signs_exactly():
    original = _single_conv_qdq()
    fused, _ = fuse(original)
    assert len(fp8_nodes(fused)) == 1 and worst(verify(original, fused)) < EXACT
    assert (initializer(fused, fp8_nodes(fused)[0].input[3]) > 0).all()


def test_per_tensor_weight_scale_is_absorbed():
    original = _single_conv_qdq(w_scale=np.array([0.01] * 8, np.float32))
    fused, _ = fuse(original)
    assert len(fp8_nodes(fused)) == 1 and worst(verify(original, fused)) < EXACT


def _replace_input(position, value):
    def edit(node, model):
        name = f"{node.name}_edited_{position}"
        model.graph.initializer.append(numpy_helper.from_array(value, name))
        node.input[position] = name
    return edit


@pytest.mark.parametrize("case, reason", [
    ({"x_DequantizeLinear": _replace_input(1, np.array(0.5, np.float32))}, "different scales"),
    ({"_QuantizeLinear": lambda node, model: node.attribute.append(helper.make_attribute("saturate", 0))},
     "does not saturate"),
    ({"_w_DequantizeLinear": _replace_input(2, np.ones(8, ml_dtypes.float8_e4m3fn))}, "nonzero zero point"),
])
def test_unabsorbable_qdq_is_left_with_its_reason_and_still_verifies(case, reason):
    original = _single_conv_qdq(**case)
    fused, report = fuse(original)
    site = next(s for s in report.sites if s.family == "conv")
    assert not fp8_nodes(fused) and reason in site.details.get("fp8", "") + site.reason, site
    result = verify(original, fused)  # onnxruntime refuses nonzero FP8 zero points: that original does not run
    assert result.passed or "zero point" in reason and "zero points should be 0" in result.original_error


def test_int8_qdq_conv_is_left_to_tensorrt():
    b = graphs.GraphBuilder()
    w = b.rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    scale = b.const(np.float32(0.02))
    zero = b.const(np.int8(0), np.int8)
    x = b.op("DequantizeLinear", [b.op("QuantizeLinear", ["x", scale, zero]), scale, zero])
    wq = b.const(np.clip(np.round(w / 0.02), -127, 127).astype(np.int8), np.int8)
    y = b.op("Conv", [x, b.op("DequantizeLinear", [wq, scale, zero])])
    model = b.model({"x": [2, 4, 9, 9]}, {y: None})
    fused, report = fuse(model, precision="fp8", calibration="random:2")
    assert not fp8_nodes(fused) and "INT8" in report.sites[0].reason
    assert verify(model, fused).passed


def test_weight_only_fp8_runs_dequantized_with_the_reason():
    original = _single_conv_qdq()
    conv = next(n for n in original.graph.node if n.op_type == "Conv")
    x_dq = next(n for n in original.graph.node if n.output[0] == conv.input[0])
    q = next(n for n in original.graph.node if n.output[0] == x_dq.input[0])
    conv.input[0] = q.input[0]  # the Conv reads X unquantized
    fused, report = fuse(original)
    site = next(s for s in report.sites if s.family == "conv")
    assert site.fused and not fp8_nodes(fused)
    assert verify(original, fused).passed


def test_unfused_conv_keeps_its_dequantizelinear():
    """A 3-D Conv (no FusedConv) with Q/DQ: the rewrite leaves it, and its weights' DequantizeLinear stays."""
    b = graphs.GraphBuilder()
    y = b.conv("x", 4, 8, (3, 3, 3))
    model = b.model({"x": [1, 4, 6, 6, 6]}, {y: None})
    conv = model.graph.node[0]
    w = initializer(model, conv.input[1])
    original = insert_conv_qdq(model, {conv.name: ConvScales(0.01, np.abs(w).reshape(8, -1).max(1) / 448)})
    fused, report = fuse(original)
    assert not report.sites[0].fused and "3-D" in report.sites[0].reason
    conv = next(n for n in fused.graph.node if n.op_type == "Conv")
    assert any(n.op_type == "DequantizeLinear" and n.output[0] == conv.input[1] for n in fused.graph.node)
    assert worst(verify(original, fused)) == 0.0


@pytest.mark.parametrize("name", ATTENTION_SAMPLES)
def test_attention_samples_keep_their_dtype_under_fp8_with_the_reason(name):
    model = sample(name)
    fused, report = fuse(model, precision="fp8", calibration="random:2")
    attention = [s for s in report.sites if s.family == "attention" and s.fused]
    if attention:  # heads of 16: the FP8 kernel takes 64, 128, 256 (tests/test_fp8_attention.py: FP8 samples)
        assert any(f"0 of {len(attention)} attention sites FP8" in note for note in report.notes), report.notes
        assert all(s.details["fp8"].startswith("no: no FP8 kernel") for s in attention)
    assert verify(model, fused).passed


@pytest.mark.parametrize("name", ATTENTION_SAMPLES)
def test_attention_qdq_samples_are_left_to_tensorrt_with_the_reason(name):
    original = matmul_qdq_version(sample(name))
    fused, report = fuse(original, precision="fp8", calibration="random:2")
    assert any("FP8 Q/DQ left as it is" in note and "MatMul" in note for note in report.notes), report.notes
    assert worst(verify(original, fused)) < 1e-4


def test_cli_fp8_calibrates_verifies_and_reports_scales(tmp_path, capsys):
    import json

    from trt_fusedattn.cli import main

    model = tmp_path / "resnet.onnx"
    model.write_bytes((sample("resnet_dynamo")).SerializeToString())
    code = main([str(model), "--precision", "fp8", "--calib", "random:2", "--calib-method", "percentile:99.9",
                 "--verify", "--report", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "calibrating [" in err and "2/2" in err and "input_scale=" in out and "rel l2" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert all("input_scale=" in s["details"]["fp8"] for s in report["sites"])
    assert all(o["rtol"] == FP8_RTOL and o["passed"] for o in report["verification"]["outputs"])
    fused = onnx.load(tmp_path / "resnet.fused.onnx")
    assert len(fp8_nodes(fused)) == 17
    assert main([str(model), "-q", "--precision", "fp8", "--calib", "random:1", "-o", str(tmp_path / "q.onnx")]) == 0
    assert capsys.readouterr().err == ""
    assert main([str(model), "-q", "--precision", "fp8", "--calib", "random:1", "--no-fp8-chains",
                 "-o", str(tmp_path / "unchained.onnx")]) == 0
    producers = [[n for n in fp8_nodes(onnx.load(tmp_path / f)) if FUSED_CONV.node_attributes(n)["output_scale"]]
                 for f in ("q.onnx", "unchained.onnx")]
    assert producers[0] and not producers[1]


@pytest.mark.parametrize("args, message", [
    (["--calib", "random:2"], "add --precision fp8"),
    (["--precision", "fp8", "--calib", "random:0"], "random:N takes N"),
    (["--precision", "fp8", "--calib", "nowhere.npz"], "no such file"),
    (["--precision", "fp8", "--calib-method", "mean"], "--calib-method"),
    (["--precision", "fp16"], "add --engine"),
])
def test_cli_fp8_usage_errors_are_one_line(tmp_path, capsys, args, message):
    from trt_fusedattn.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(graphs.conv_case().SerializeToString())
    assert main([str(model), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "m.fused.onnx").exists()


def test_model_optimizer_fp8_export_is_absorbed():
    """tests/data/resnet_bn_modelopt_fp8.onnx: models/samples/resnet_bn_torchscript.onnx quantized by NVIDIA Model
    Optimizer 0.47.0 on the CPU (``modelopt.onnx.quantization.quantize(path, quantize_mode="fp8",
    calibration_data_path=<8 standard-normal images>, calibration_eps=["cpu"])``): float16, opset 19, Q/DQ on 9
    Convs' X and W (per-channel Q of float16 W), and on the residual Adds' inputs. Every quantized Conv becomes
    FP8 (BatchNorm folded into the scales) reading the QuantizeLinear's e4m3 output; each site matches the export
    to float16 rounding; the Q/DQ on the Adds stays (TensorRT's), named in the report."""
    from pathlib import Path

    original = onnx.load(Path(__file__).parent / "data" / "resnet_bn_modelopt_fp8.onnx")
    quantized = {n.output[0] for n in original.graph.node if n.op_type == "QuantizeLinear"}
    fused, report = fuse(original, fp8_chains=False)
    assert len(fp8_nodes(fused)) == 9 == sum(s.details.get("fp8", "").startswith("Q/DQ") for s in report.sites)
    assert any("FP8 Q/DQ left as it is" in note and "read by Add" in note for note in report.notes)
    assert max(site_errors(original, fused).values()) < 2e-3  # float16 outputs: 2^-11 per rounding
    assert {n.input[0] for n in fp8_nodes(fused)} <= quantized  # float16, C/G % 16 == 0: e4m3 X from the Q
    assert all("e4m3 X" in s.details["fp8"] for s in report.sites if s.details.get("fp8", "").startswith("Q/DQ"))
    result = verify(original, fused)
    assert result.passed, result.table()


def test_calibration_inputs_the_original_cannot_run_on_say_what_to_give(tmp_path):
    """Samples of a shape the model does not take (its X is static 2x6x6x6) fail in onnxruntime: one line says
    what to pass (not an internal error)."""
    from trt_fusedattn.errors import InputError

    model = graphs.residual_case()
    np.savez(tmp_path / "bad.npz", x=np.ones((2, 6, 5, 5), np.float32))  # the model's x is 2x6x6x6
    with pytest.raises(InputError, match="calibration inputs.*--calib samples.npz"):
        fuse(model, precision="fp8", calibration=str(tmp_path / "bad.npz"))


@pytest.mark.parametrize("name", ["bert_sdpa_dynamo", "llama_gqa_torchscript"])
def test_attention_samples_take_file_calibration_and_check_it(name, tmp_path):
    """No conv to calibrate, but the samples are still checked against the inputs (a wrong file is an error)."""
    from trt_fusedattn.errors import InputError
    from trt_fusedattn.random_inputs import random_inputs

    model = sample(name)
    feeds = [random_inputs(model, seed=200 + i) for i in range(3)]
    np.savez(tmp_path / "calib.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    fused, report = fuse(model, precision="fp8", calibration=str(tmp_path / "calib.npz"))
    assert verify(model, fused).passed and any("keep their dtype" in note for note in report.notes)
    np.savez(tmp_path / "wrong.npz", pixel_values=np.ones((1, 3, 8, 8), np.float32))
    with pytest.raises(InputError, match="do not match the model's inputs"):
        fuse(model, precision="fp8", calibration=str(tmp_path / "wrong.npz"))
