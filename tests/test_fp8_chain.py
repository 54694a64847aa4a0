"""FP8 chains on the CPU: FusedConv's ``output_scale`` (Y written in e4m3 for FP8 readers) in the reference, the
plan and the compiled kernels (no spills), and ``rewrites/conv/fp8_chain.py`` on the calibrated and Q/DQ samples
and on small graphs for each reason a producer keeps its output 16-bit. GPU: tests/test_conv_gpu.py (producer
cases vs this reference) and tests/test_fp8_gpu.py (the chained samples on the kernels)."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from _fp8_chain_cases import PRODUCER_CASES, e4m3_mismatch
from _fp8_models import sample
from trt_fusedattn.fp8 import to_e4m3
from trt_fusedattn.launcher import compile as comp
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.conv.contract import FUSED_CONV, conv_reference
from trt_fusedattn.plugins.conv.plan import float_literal, plan_conv
from trt_fusedattn.rewrites import Site
from trt_fusedattn.rewrites.conv.fp8_chain import chain_fp8
from trt_fusedattn.verification import FP8_RTOL, verify

E4M3 = ml_dtypes.float8_e4m3fn


def test_reference_quantizes_after_the_residual_and_post_activation():
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal((2, 16, 7, 6)), rng.standard_normal((24, 3, 3, 16)) * 0.3
    shift, residual = rng.standard_normal(24), rng.standard_normal((2, 24, 7, 6))
    attrs = dict(pads=(1, 1, 1, 1), activation="relu", post_activation="leaky_relu", post_activation_alpha=0.1)
    y = np.maximum(conv_reference(x, w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
                   + shift[None, :, None, None], 0) + residual
    y = np.where(y >= 0, y, 0.1 * y)
    scale = float(np.quantile(np.abs(y), 0.99) / 448)  # the top 1% saturates
    got = FUSED_CONV.reference(x, w, shift, None, residual, output_scale=scale, **attrs)
    assert got.dtype == E4M3 and got.shape == y.shape
    want = np.clip(y / scale, -448, 448).astype(E4M3)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert (np.abs(got.astype(np.float64)) == 448).mean() > 0.005  # saturated, not wrapped to NaN
    float_y = FUSED_CONV.reference(x, w, shift, None, residual, **attrs)
    assert float_y.dtype == np.float64 and np.allclose(float_y, y)


def test_e4m3_x_with_output_scale_reads_and_writes_e4m3():
    rng = np.random.default_rng(12)
    x8 = to_e4m3(rng.standard_normal((1, 32, 5, 5)), 0.01)
    w8 = to_e4m3(rng.standard_normal((16, 1, 1, 32)) * 0.2)
    got = FUSED_CONV.reference(x8, w8, input_scale=0.01, output_scale=0.005)
    y = conv_reference(x8.astype(np.float64) * 0.01, w8.astype(np.float64), strides=(1, 1), pads=(0,) * 4,
                       dilations=(1, 1), group=1)
    assert got.dtype == E4M3 and np.array_equal(got.view(np.uint8), to_e4m3(y, 0.005).view(np.uint8))


def _shapes(n=2, c=64, k=64, residual=False):
    return [(n, c, 9, 9), (k, 3, 3, c), (k,), (k,), (n, k, 9, 9) if residual else None]


def test_the_gpu_tests_e4m3_rule_allows_one_step_flips_and_catches_a_wrong_scale_or_rounding():
    """The producers' rule of the GPU tests (tests/_fp8_chain_cases.e4m3_mismatch) on e4m3 outputs made here: one
    element one step off passes on a small tensor (as the H100's e4m3 conversion gives), a 3% scale error or
    truncation instead of round-to-nearest-even fails on a large one."""
    codes = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)
    magnitudes = np.unique(np.abs(codes[np.isfinite(codes)]))  # every e4m3 magnitude, ascending
    rng = np.random.default_rng(7)
    want = to_e4m3(np.maximum(rng.standard_normal(2 * 64 * 2 * 2), 0) * 40).astype(np.float64)  # a small ReLU output
    flipped = want.copy()
    i = int(np.argmax(want))
    flipped[i] = magnitudes[np.searchsorted(magnitudes, want[i], side="right")]  # one step up at the largest
    assert e4m3_mismatch(flipped, want) == ""
    big = rng.standard_normal(64 * 1024) * 40
    want = to_e4m3(big).astype(np.float64)
    assert "elements off" in e4m3_mismatch(to_e4m3(big * 1.03).astype(np.float64), want)
    truncated = np.sign(big) * magnitudes[np.searchsorted(magnitudes, np.abs(big), side="right") - 1]
    assert e4m3_mismatch(truncated, want) != ""


@pytest.mark.parametrize("x_dtype", ["float16", "bfloat16", "float8_e4m3fn"])
def test_plan_of_a_producer(x_dtype):
    attrs = FUSED_CONV.resolve(dict(pads=(1, 1, 1, 1), input_scale=0.02, output_scale=0.03))
    residual = "bfloat16" if x_dtype == "bfloat16" else "float16"
    plan = plan_conv(_shapes(residual=True), [x_dtype, "float8_e4m3fn", "float32", "float32", residual], attrs,
                     "sm_90a")
    assert plan.defines["OUTPUT_E4M3"] == 1 and plan.defines["OUTPUT_SCALE_INV"] == float_literal(1 / 0.03)
    assert plan.defines["DTYPE_BF16"] == (x_dtype == "bfloat16")  # the epilogue's dtype: X's, e4m3 X's float16
    assert "OUTPUT_E4M3" not in plan_conv(_shapes(), [x_dtype, "float8_e4m3fn", "float32", "float32", None],
                                          {**attrs, "output_scale": 0.0}, "sm_90a").defines


def test_producer_formats_in_tensorrt():
    """TensorRT's formats: the e4m3 Y is HWC16 (K % 16 == 0: the kernels write it unpadded), the residual HWC8."""
    attrs = FUSED_CONV.resolve(dict(pads=(1, 1, 1, 1), input_scale=0.02, output_scale=0.03))
    dtypes = ["float16", "float8_e4m3fn", "float32", "float32", "float16"]
    formats = ("HWC8", "LINEAR", "LINEAR", "LINEAR", "HWC8", "HWC16")
    assert plan_conv(_shapes(residual=True), dtypes, attrs, "sm_90a", formats=formats).scalars[-1] == 64
    with pytest.raises(ValueError, match="ask for HWC16"):
        plan_conv(_shapes(residual=True), dtypes, attrs, "sm_90a", formats=formats[:5] + ("HWC8",))
    with pytest.raises(ValueError, match="multiple of 16"):
        plan_conv(_shapes(k=24, residual=True), dtypes, attrs, "sm_90a", formats=formats)


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_producers_convert_to_e4m3_in_hardware(arch):
    """Each producer case's PTX (on both FP8 main loops) converts with cvt.rn.satfinite.e4m3x2; that they compile
    without spills is tests/test_conv_compile.py's check (PRODUCER_CASES are among its specializations)."""
    try:
        comp.nvcc_path()
    except comp.CompileError as err:
        pytest.skip(f"nvcc not found ({err})")
    plans = {(plan.source, tuple(sorted(plan.defines.items()))): p.name
             for p in PRODUCER_CASES for m in ("mma.sync", "wgmma") for plan in [p.plan(arch, mma=m)]}
    with ThreadPoolExecutor(max_workers=2) as pool:
        ptxs = dict(zip(plans.values(), pool.map(lambda spec: comp.compile_ptx(spec[0], arch, dict(spec[1])), plans)))
    for name, ptx in ptxs.items():
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx, f"{name} on {arch}: no hardware e4m3 conversion in the PTX"


def _value_types(model: onnx.ModelProto) -> dict:
    return {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}


def _fp8_convs(model):
    return [n for n in model.graph.node if FUSED_CONV.is_node(n) and FUSED_CONV.node_attributes(n)["input_scale"]]


@pytest.fixture(scope="module")
def resnet():
    """resnet_dynamo (float32, one bottleneck per stage: 8-channel first stage) fused in FP8, chained and not."""
    original = sample("resnet_dynamo")
    chained, report = fuse(original, precision="fp8", calibration="random:2")
    plain, _ = fuse(original, precision="fp8", calibration="random:2", fp8_chains=False)
    return original, chained, report, plain


def test_resnet_producers_write_e4m3_for_their_fp8_readers(resnet):
    _, chained, report, _ = resnet
    producers = {n.output[0]: n for n in chained.graph.node
                 if FUSED_CONV.is_node(n) and FUSED_CONV.node_attributes(n)["output_scale"]}
    readers = {n.input[0]: [] for n in chained.graph.node}
    for node in chained.graph.node:
        readers[node.input[0]].append(node) if node.input else None
    types = _value_types(chained)
    assert len(producers) == 9  # stages 2-4: 1x1 -> 3x3 -> 1x1, and each stage's end into the next stage's two convs
    for out, producer in producers.items():
        assert types[out] == TensorProto.FLOAT8E4M3FN
        scale = FUSED_CONV.node_attributes(producer)["output_scale"]
        assert readers[out] and all(FUSED_CONV.node_attributes(r)["input_scale"] == scale for r in readers[out])
    assert sorted(len(readers[out]) for out in producers) == [1] * 6 + [2] * 3  # conv1 + projection of a stage
    sites = {s.node: s for s in report.sites if s.fused}
    assert sum(s.details.get("fp8_output", "").startswith("e4m3") for s in sites.values()) == 9
    refused = [s.details["fp8_output"] for s in sites.values() if s.details.get("fp8_output", "").startswith("no")]
    reasons = {re.sub(r"node \S+ ", "node _ ", r) for r in refused}
    assert reasons == {"no: MaxPool node _ reads it (not a FusedConv)",  # the stem
                       "no: FusedConv node _ has C/G = 8; e4m3 X needs a multiple of 16",  # the 8-channel stage
                       "no: FusedConv node _ adds it as its residual, in float",  # projection shortcuts
                       "no: last_hidden_state is a graph output"}, reasons
    assert any("FP8 chains: 9 FusedConv outputs" in note and "12 in-kernel" in note for note in report.notes)


def test_float32_readers_compute_in_float16_with_casts(resnet):
    """e4m3 X gives float16 y (the contract): a float32 model's reader gets its residual cast to float16 and, unless
    it writes e4m3 itself, its output cast back to float32."""
    _, chained, _, plain = resnet
    producers = {n.output[0] for n in chained.graph.node if FUSED_CONV.is_node(n) and
                 FUSED_CONV.node_attributes(n)["output_scale"]}
    made_by = {o: n for n in chained.graph.node for o in n.output}
    casts_back = 0
    for node in _fp8_convs(chained):
        if node.input[0] not in producers:
            continue
        if len(node.input) > 4 and node.input[4]:
            cast = made_by[node.input[4]]
            assert cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.FLOAT16
        if node.output[0] not in producers:
            back = next(n for n in chained.graph.node if node.output[0] in n.input)
            assert back.op_type == "Cast" and back.attribute[0].i == TensorProto.FLOAT
            casts_back += 1
    assert casts_back == 4  # the 3 projection shortcuts (their output meets a residual Add) and the last 1x1
    assert {o.name for o in chained.graph.output} == {o.name for o in plain.graph.output}


def test_chained_resnet_verifies_and_stays_near_the_unchained_model(resnet):
    from trt_fusedattn.ort_session import run_model
    from trt_fusedattn.random_inputs import random_inputs

    original, chained, _, plain = resnet
    result = verify(original, chained)
    assert result.passed and all(o.rtol == FP8_RTOL for o in result.outputs), result.table()
    feeds = random_inputs(original, seed=5)
    got, want, exact = run_model(chained, feeds), run_model(plain, feeds), run_model(original, feeds)
    for name, y in want.items():
        chain_moves = np.linalg.norm(got[name] - y) / np.linalg.norm(y)
        fp8_error = np.linalg.norm(y - exact[name]) / np.linalg.norm(exact[name])
        assert 0 < chain_moves < fp8_error, (name, chain_moves, fp8_error)  # float16 y of readers, fp32 ties


def test_opset_17_chain_runs_under_onnxruntime():
    """The chained tensors pass between custom nodes in the bridge (a Cast to float8 is invalid below opset 19)."""
    original = sample("resnet_torchscript")
    chained, report = fuse(original, precision="fp8", calibration="random:2")
    assert next(o.version for o in chained.opset_import if o.domain == "") == 17
    assert any(n.op_type == "FusedConv" and FUSED_CONV.node_attributes(n)["output_scale"] for n in chained.graph.node)
    assert verify(original, chained).passed


def test_mobilenet_chains_depthwise_producers_and_names_each_refusal():
    original = sample("mobilenetv2_dynamo")
    chained, report = fuse(original, precision="fp8", calibration="random:2")
    weights = {t.name: t for t in chained.graph.initializer}
    producers = [n for n in chained.graph.node if FUSED_CONV.is_node(n) and
                 FUSED_CONV.node_attributes(n)["output_scale"]]
    depthwise = [n for n in producers if weights[n.input[1]].dims[-1] == 1]
    assert depthwise and all(not FUSED_CONV.node_attributes(n)["input_scale"] for n in depthwise)  # 16-bit dw
    refusals = " ".join(s.details["fp8_output"] for s in report.sites if s.details.get("fp8_output", "")[:2] == "no")
    assert "is not FP8 (depthwise: no FP8 kernel)" in refusals  # expand 1x1 -> depthwise
    assert "adds it as its residual" in refusals or "needs a multiple of 16" in refusals
    result = verify(original, chained)
    assert result.passed, result.table()


def _fused_graph(nodes, weights, x_shape=(1, 32, 6, 6), dtype=TensorProto.FLOAT16, outputs=("y",)):
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", dtype, x_shape)],
                              [helper.make_tensor_value_info(o, dtype, None) for o in outputs],
                              initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), FUSED_CONV.opset()], ir_version=10)


def _weights(rng, names, k=32, c=32):
    out = {}
    for name in names:
        out[f"{name}_w"] = to_e4m3(rng.standard_normal((k, 3, 3, c)) * 0.1)
        out[f"{name}_s"] = np.full(k, 0.01, np.float32)
    return out


def _conv(name, x, y, input_scale=0.02, **attrs):
    return FUSED_CONV.make_node([x, f"{name}_w", "", f"{name}_s", *attrs.pop("residual", [])], [y], name=name,
                                pads=[1, 1, 1, 1], activation="relu", input_scale=input_scale, **attrs)


def _chain(model):
    sites = [Site("conv", n.name, True, node=n.name) for n in model.graph.node if FUSED_CONV.is_node(n)]
    notes = chain_fp8(model, sites)
    return {s.node: s.details.get("fp8_output", "") for s in sites}, notes


@pytest.mark.parametrize("reader, reason", [
    (lambda: _conv("b", "a_out", "y", input_scale=0.03), "e4m3 output_scale=0.03, read by 2"),
    (lambda: helper.make_node("Relu", ["a_out"], ["y"], name="relu"), "Relu node relu reads it"),
    (lambda: _conv("b", "x", "y", residual=["a_out"]), "adds it as its residual"),
    (lambda: _conv("b", "a_out", "y", input_scale=0.0), "is not FP8"),
])
def test_each_reader_decides_with_its_reason(reader, reason):
    """A producer read by an FP8 conv with input scale 0.03 and a second reader: another FP8 conv with the same
    scale (chained), a standard op, a residual input, a 16-bit conv (each keeps it 16-bit)."""
    rng = np.random.default_rng(3)
    nodes = [_conv("a", "x", "a_out"), _conv("c", "a_out", "z", input_scale=0.03), reader(),
             helper.make_node("Add", ["y", "z"], ["sum"], name="add")]
    model = _fused_graph(nodes, _weights(rng, "abc"), outputs=("sum",))
    details, notes = _chain(model)
    assert reason in details["a"], details
    chained = "e4m3" in details["a"]
    assert (FUSED_CONV.node_attributes(model.graph.node[0])["output_scale"] == np.float32(0.03)) == chained


def test_different_input_scales_and_graph_outputs_keep_16_bit():
    rng = np.random.default_rng(4)
    nodes = [_conv("a", "x", "a_out"), _conv("b", "a_out", "y", input_scale=0.03),
             _conv("c", "a_out", "z", input_scale=0.04)]
    details, _ = _chain(_fused_graph(nodes, _weights(rng, "abc"), outputs=("y", "z")))
    assert details["a"] == "no: its FP8 readers quantize it with different input scales 0.03, 0.04"
    nodes = [_conv("a", "x", "a_out"), _conv("b", "a_out", "y", input_scale=0.03)]
    details, _ = _chain(_fused_graph(nodes, _weights(rng, "ab"), outputs=("y", "a_out")))
    assert details["a"] == "no: a_out is a graph output"


def test_channels_per_group_not_a_multiple_of_16_keeps_16_bit():
    rng = np.random.default_rng(5)
    weights = {**_weights(rng, "a", k=24), **_weights(rng, "b", c=24)}
    nodes = [_conv("a", "x", "a_out"), _conv("b", "a_out", "y", input_scale=0.03)]
    details, _ = _chain(_fused_graph(nodes, weights))
    assert "C/G = 24; e4m3 X needs a multiple of 16" in details["a"]


def test_qdq_chain_takes_the_quantizelinear_scale():
    """A float32 Q/DQ model (its FP8 convs quantize X in the kernel, qdq.absorb): the chain gives each producer
    its reader's QuantizeLinear scale."""
    from trt_fusedattn.qdq import ConvScales, insert_conv_qdq

    rng = np.random.default_rng(6)
    ws = [(rng.standard_normal((32, 32, 3, 3)) * 0.08).astype(np.float32) for _ in range(3)]
    nodes = [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1])
             for i, x in enumerate(["x", "r0", "r1"])]
    nodes = [m for i, n in enumerate(nodes) for m in (n, helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32, 8, 8])],
                              [helper.make_tensor_value_info("r2", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)
    x_scales = (4 / 448, 3 / 448, 2 / 448)
    qdq = insert_conv_qdq(model, {f"conv{i}": ConvScales(s, np.abs(w.astype(np.float64)).reshape(32, -1).max(1) / 448)
                                  for i, (w, s) in enumerate(zip(ws, x_scales))})
    chained, report = fuse(qdq)
    convs = [n for n in chained.graph.node if FUSED_CONV.is_node(n)]
    assert [FUSED_CONV.node_attributes(n)["output_scale"] for n in convs] == [np.float32(x_scales[1]),
                                                                              np.float32(x_scales[2]), 0.0]
    assert verify(qdq, chained).passed


def test_model_optimizer_export_producers_replace_their_quantizelinears():
    """Model Optimizer's float16 export: its FP8 convs read QuantizeLinear outputs; a producer whose every reader is
    such a QuantizeLinear writes that e4m3 tensor and the QuantizeLinear goes; outputs stay those of the unchained
    model but for e4m3 ties of y (the QuantizeLinear rounds y to float16 first, the reference does not)."""
    from pathlib import Path

    from trt_fusedattn.ort_session import run_model
    from trt_fusedattn.random_inputs import random_inputs

    original = onnx.load(Path(__file__).parent / "data" / "resnet_bn_modelopt_fp8.onnx")
    chained, report = fuse(original)
    plain, _ = fuse(original, fp8_chains=False)
    quantizers = lambda m: sum(n.op_type == "QuantizeLinear" for n in m.graph.node)  # noqa: E731
    assert quantizers(plain) - quantizers(chained) == 5
    assert any("5 QuantizeLinear" in note for note in report.notes)
    refusals = [s.details["fp8_output"] for s in report.sites if s.details.get("fp8_output", "").startswith("no")]
    assert any("DequantizeLinear node" in r for r in refusals)  # a residual Add's Q/DQ reads those outputs
    feeds = random_inputs(original, seed=9)
    got, want, exact = run_model(chained, feeds), run_model(plain, feeds), run_model(original, feeds)
    for name, y in want.items():
        y = y.astype(np.float64)
        moved = np.linalg.norm(got[name] - y) / np.linalg.norm(y)
        assert moved < 0.5 * np.linalg.norm(exact[name] - y) / np.linalg.norm(y) + 1e-3, (name, moved)
    assert verify(original, chained).passed


def test_unnamed_quantizelinear_goes_and_other_unnamed_nodes_stay():
    """Producer -> QuantizeLinear (no name, as exporters may leave it) -> FP8 reader on e4m3 X, beside an unnamed
    Relu: the producer writes the QuantizeLinear's tensor, only the QuantizeLinear goes."""
    rng = np.random.default_rng(8)
    nodes = [_conv("a", "x", "a_out"),
             helper.make_node("QuantizeLinear", ["a_out", "q_scale", "q_zero"], ["a_q"]),
             _conv("b", "a_q", "b_out", input_scale=0.03), helper.make_node("Relu", ["b_out"], ["y"])]
    model = _fused_graph(nodes, _weights(rng, "ab"))
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.03, np.float32), "q_scale"),
                                    helper.make_tensor("q_zero", TensorProto.FLOAT8E4M3FN, [], [0])])
    details, notes = _chain(model)
    assert details["a"].startswith("e4m3 output_scale=0.03") and "1 QuantizeLinear" in notes[0]
    assert [n.op_type for n in model.graph.node] == ["FusedConv", "FusedConv", "Relu"]
    assert model.graph.node[0].output[0] == model.graph.node[1].input[0] == "a_q"
    left = {t.name for t in model.graph.initializer} | {v.name for v in model.graph.value_info}
    assert not {"q_scale", "q_zero", "a_out"} & left
