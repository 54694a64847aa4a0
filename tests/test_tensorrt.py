"""The TensorRT layer: what can be checked without TensorRT (availability, clear errors, the ONNX handed to the
parser, symbolic dimensions), and engines built and run where TensorRT's builder exists (``tensorrt`` marker)."""
from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trt_fusedattn import tensorrt as trt_layer
from trt_fusedattn.errors import FuseError, TensorRTUnavailable
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.tensorrt import plugins, prepare
from trt_fusedattn.tensorrt.symbolic import SymbolicDim, plan_dim, trt_value


@pytest.fixture
def no_tensorrt(monkeypatch):
    """Make ``import tensorrt`` / ``import tensorrt_lean`` fail, as on a machine without TensorRT."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt_lean", None)
    trt_layer.available.cache_clear()
    yield
    trt_layer.available.cache_clear()


def test_available_reason_names_what_is_missing_and_how_to_install(no_tensorrt):
    ok, reason = trt_layer.available()
    assert not ok
    assert reason.startswith("TensorRT is not installed") and "pip install 'tensorrt" in reason
    assert "\n" not in reason


def test_available_is_consistent_here():
    ok, reason = trt_layer.available()
    assert isinstance(ok, bool) and reason and "\n" not in reason
    assert reason.startswith("TensorRT ") if ok else "pip install" in reason


def test_build_engine_without_tensorrt_raises_one_clear_line(no_tensorrt, tmp_path):
    with pytest.raises(TensorRTUnavailable) as info:
        trt_layer.build_engine(tmp_path / "model.onnx", tmp_path / "model.engine", precision="fp16")
    assert isinstance(info.value, FuseError) and info.value.exit_code == 3
    assert "TensorRT is not installed" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "model.engine").exists()
    with pytest.raises(TensorRTUnavailable, match="no TensorRT runtime is installed"):
        trt_layer.Engine(tmp_path / "model.engine")
    with pytest.raises(TensorRTUnavailable):
        trt_layer.register_plugins()


def _attention_model(with_lengths_only: bool):
    inputs = ["q", "k", "v", "", "lengths"] if with_lengths_only else ["q", "k", "v"]
    node = FUSED_ATTENTION.make_node(inputs, ["o"], name="attn", causal=1)
    relu = helper.make_node("Relu", ["o"], ["y"])
    value = lambda n, dt, shape: helper.make_tensor_value_info(n, dt, shape)  # noqa: E731
    graph_inputs = [value(n, TensorProto.FLOAT16, ["b", "s", 2, 64]) for n in ("q", "k", "v")]
    if with_lengths_only:
        graph_inputs.append(value("lengths", TensorProto.INT32, ["b"]))
    graph = helper.make_graph([node, relu], "g", graph_inputs, [value("y", TensorProto.FLOAT16, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), FUSED_ATTENTION.opset()])


def test_prepare_model_drops_empty_inputs_and_records_which_are_present():
    model = _attention_model(with_lengths_only=True)
    prepared = prepare.prepare_model(model)
    attn, relu = prepared.graph.node
    assert list(attn.input) == ["q", "k", "v", "lengths"]
    attrs = {a.name: helper.get_attribute_value(a) for a in attn.attribute}
    assert attrs[prepare.PRESENT_INPUTS] == 0b10111
    assert attrs["plugin_namespace"] == b"trt_fusedattn" and attrs["causal"] == 1
    assert list(relu.input) == ["o"] and not relu.attribute
    assert list(model.graph.node[0].input) == ["q", "k", "v", "", "lengths"]  # the caller's model is untouched
    again = prepare.prepare_model(prepared)  # idempotent: no duplicated attributes
    assert sorted(a.name for a in again.graph.node[0].attribute) == sorted(a.name for a in attn.attribute)


def test_present_inputs_map_tensors_to_contract_names():
    attention = next(op for op in plugins.ops() if op.contract is FUSED_ATTENTION)
    conv = next(op for op in plugins.ops() if op.contract is FUSED_CONV)
    assert plugins._input_names(attention, 3, None) == ["Q", "K", "V"]
    assert plugins._input_names(attention, 4, 0b10111) == ["Q", "K", "V", "key_lengths"]
    assert plugins._input_names(conv, 3, 0b00111) == ["X", "W", "shift"]
    assert plugins._input_names(conv, 3, 0b10011) == ["X", "W", "residual"]
    with pytest.raises(ValueError, match="4 inputs given but present_inputs"):
        plugins._input_names(conv, 4, 0b00111)


def test_plugin_fields_become_contract_attributes():
    """The ONNX parser passes INT as one int32, FLOAT as one float32, INTS as int32s, STRING with a NUL."""
    assert plugins._canonical_attr("bottom_right\0", "string") == "bottom_right"
    assert plugins._canonical_attr(np.array([2, 2], np.int32), "ints") == (2, 2)
    group = plugins._canonical_attr(np.array([4], np.int32), "int")
    assert group == 4 and type(group) is int
    scale = plugins._canonical_attr(np.array([0.125], np.float32), "float")
    assert scale == 0.125 and type(scale) is float
    with pytest.raises(ValueError, match="int attribute arrived as 2 values"):
        plugins._canonical_attr(np.array([1, 2], np.int32), "int")
    fields = {"strides": np.array([2, 2], np.int32), "activation": "relu\0", "group": np.array([1], np.int32)}
    kinds = {a.name: a.kind for a in FUSED_CONV.attributes}
    resolved = FUSED_CONV.resolve({k: plugins._canonical_attr(v, kinds[k]) for k, v in fields.items()})
    assert resolved["strides"] == (2, 2) and resolved["activation"] == "relu" and resolved["group"] == 1


class LeftOnlyExpr:
    """Arithmetic the way TensorRT's ShapeExpr allows it (expression on the left only), recording the formula."""

    is_fake = False
    is_constant = False

    def __init__(self, text):
        self.text = str(text)

    def _op(self, op, other):
        if not isinstance(other, (int, LeftOnlyExpr)):
            return NotImplemented
        return LeftOnlyExpr(f"({self.text}{op}{getattr(other, 'text', other)})")

    def __add__(self, o):
        return self._op("+", o)

    def __sub__(self, o):
        return self._op("-", o)

    def __mul__(self, o):
        return self._op("*", o)

    def __floordiv__(self, o):
        return self._op("//", o)


def test_symbolic_dims_take_ints_on_either_side():
    seq = SymbolicDim(LeftOnlyExpr("L"))
    assert (4 * seq).expr.text == "(L*4)" and (seq * 4).expr.text == "(L*4)"
    assert (1 + seq).expr.text == "(L+1)"
    assert ((seq + 63) // 64).expr.text == "((L+63)//64)"
    assert (100 - seq).expr.text == "(100-L)" and (256 // seq).expr.text == "(256//L)"
    assert (seq * SymbolicDim(LeftOnlyExpr("B"))).expr.text == "(L*B)"
    for needs_value in (lambda: bool(seq), lambda: seq == 64, lambda: seq < 2, lambda: seq % 8, lambda: int(seq)):
        with pytest.raises(ValueError, match="only known at run time"):
            needs_value()
    assert trt_value(7) == 7 and trt_value(seq).text == "L"
    with pytest.raises(TypeError):
        trt_value(2.5)


def test_constant_dimensions_reach_plans_as_ints():
    class Constant(LeftOnlyExpr):
        is_constant = True

        def constant_value(self):
            return int(self.text)

    assert plan_dim(Constant(64)) == 64 and isinstance(plan_dim(Constant(64)), int)
    assert isinstance(plan_dim(LeftOnlyExpr("L")), SymbolicDim)


def test_shape_specs_give_optimization_profiles():
    shapes = trt_layer.parse_shapes(["input_ids:1x8/4x128/8x512", "pixels:2x3x224x224"])
    assert shapes == {"input_ids": ((1, 8), (4, 128), (8, 512)), "pixels": ((2, 3, 224, 224),) * 3}
    assert trt_layer.parse_shapes("a:1/2/3,b:5") == {"a": ((1,), (2,), (3,)), "b": ((5,),) * 3}
    for bad in ("input_ids", "ids:1x8/4x128", "ids:1x8/4x128/8", "ids:1xA", ":1x2"):
        with pytest.raises(ValueError, match="NAME:MIN/OPT/MAX") as info:
            trt_layer.parse_shapes([bad])
        assert "\n" not in str(info.value)


def test_cli_without_engine_says_nothing_about_tensorrt_and_checks_engine_flags(tmp_path, capsys):
    from pathlib import Path

    from trt_fusedattn.cli import main
    sample = Path(__file__).resolve().parents[1] / "models" / "samples" / "bert_sdpa_fp16_dynamo.onnx"
    report = tmp_path / "report.json"
    assert main([str(sample), "-o", str(tmp_path / "out.onnx"), "--report", str(report)]) == 0
    assert "TensorRT" not in capsys.readouterr().err and "TensorRT" not in report.read_text()
    for flags, message in ((["--shapes", "input_ids:1x8"], "--shapes is an engine-build option"),
                           (["--timing-cache", str(tmp_path / "t.cache")], "--timing-cache is an engine-build"),
                           (["--engine", str(tmp_path / "m.engine"), "--shapes", "input_ids:1x8/4"],
                            "--shapes: shape spec 'input_ids:1x8/4' is not NAME:MIN/OPT/MAX")):
        assert main([str(sample), "-o", str(tmp_path / "out2.onnx"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fuse-onnx: error: {message}") and err.count("\n") == 1
        assert not (tmp_path / "out2.onnx").exists()


# ---------------------------------------------------------------- with TensorRT's builder

@pytest.mark.tensorrt
def test_register_plugins_registers_both_ops():
    names = trt_layer.register_plugins()
    assert names == ["trt_fusedattn::FusedAttention", "trt_fusedattn::FusedConv"]
    assert trt_layer.register_plugins() == names  # idempotent


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_attention_engine_matches_the_reference(tmp_path):
    torch = pytest.importorskip("torch")
    model = _attention_model(with_lengths_only=True)
    path = tmp_path / "attention.onnx"
    onnx.save(model, path)
    engine_path = trt_layer.build_engine(path, tmp_path / "attention.engine", precision="fp16",
                                         shapes={"q": ((1, 1, 2, 64), (2, 77, 2, 64), (2, 300, 2, 64)),
                                                 "k": ((1, 1, 2, 64), (2, 77, 2, 64), (2, 300, 2, 64)),
                                                 "v": ((1, 1, 2, 64), (2, 77, 2, 64), (2, 300, 2, 64)),
                                                 "lengths": ((1,), (2,), (2,))})
    engine = trt_layer.Engine(engine_path)
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 77, 2, 64)).astype(np.float16) for _ in range(3))
    lengths = np.array([77, 31], np.int32)
    expected = np.maximum(FUSED_ATTENTION.reference(q, k, v, None, lengths, causal=1), 0)
    feeds = {"q": q, "k": k, "v": v, "lengths": lengths}
    got = engine(feeds)["y"]  # numpy path
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=2e-2, atol=2e-2)
    device = {n: torch.from_numpy(a).cuda() for n, a in feeds.items()}
    out = torch.full((2, 77, 2, 64), float("nan"), dtype=torch.float16, device="cuda")  # poisoned
    engine(device, outputs={"y": out})
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.float().cpu().numpy(), expected.astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_conv_engine_matches_the_reference(tmp_path):
    pytest.importorskip("trt_fusedattn.plugins.conv.plan", reason="plugins/conv/plan.py (plan_conv) not written")
    rng = np.random.default_rng()
    w = (rng.standard_normal((16, 3, 3, 8)) * 0.2).astype(np.float16)  # OHWI
    shift = rng.standard_normal(16).astype(np.float32)
    node = FUSED_CONV.make_node(["x", "w", "shift"], ["y"], pads=[1, 1, 1, 1], activation="relu")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8, 10, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        initializer=[onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(shift, "shift")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), FUSED_CONV.opset()])
    onnx.save(model, tmp_path / "conv.onnx")
    engine = trt_layer.Engine(trt_layer.build_engine(tmp_path / "conv.onnx", tmp_path / "conv.engine",
                                                     precision="fp16"))
    x = rng.standard_normal((1, 8, 10, 12)).astype(np.float16)
    expected = FUSED_CONV.reference(x, w, shift, pads=(1, 1, 1, 1), activation="relu")
    got = engine({"x": x})["y"]
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_version_compatible_engine_runs_on_the_lean_runtime(tmp_path, monkeypatch):
    """Open question 3 (NOTES.md): an engine built version-compatible carries our AOT kernels to the lean runtime."""
    pytest.importorskip("tensorrt_lean", reason="the lean runtime (tensorrt_lean) is not installed")
    model = _attention_model(with_lengths_only=False)
    onnx.save(model, tmp_path / "attention.onnx")
    shape = (2, 33, 2, 64)
    path = trt_layer.build_engine(tmp_path / "attention.onnx", tmp_path / "attention.engine", version_compatible=True,
                                  shapes={n: shape for n in ("q", "k", "v")})
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # Engine falls back to tensorrt_lean
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal(shape).astype(np.float16) for _ in range(3))
    got = trt_layer.Engine(path)({"q": q, "k": k, "v": v})["y"]
    expected = np.maximum(FUSED_ATTENTION.reference(q, k, v, causal=1), 0)
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", plugins.ops(), ids=lambda op: op.name)
def test_each_op_gives_the_tensorrt_layer_what_it_needs(op):
    """plan_<op>(input_shapes, input_dtypes, attrs, arch[, formats=]) and an output shape; an op read channels-last
    (HWC8 in TensorRT) must take ``formats`` so that its plan sees the layout TensorRT chose."""
    import inspect

    params = list(inspect.signature(op.plan).parameters)
    assert params[:4] == ["input_shapes", "input_dtypes", "attrs", "arch"]
    shapes = [(2, 5, 4, 64), (2, 5, 4, 64), (2, 5, 4, 64), None, None] if op.name == "attention" else \
        [(2, 8, 10, 12), (16, 3, 3, 8), (16,), None, None]
    attrs = op.contract.resolve({"pads": [1, 1, 1, 1]} if op.name == "conv" else {})
    expected = (2, 5, 4, 64) if op.name == "attention" else (2, 16, 10, 12)
    assert tuple(op.output_shape(shapes, attrs)) == expected
    if op.channels_last:
        assert "formats" in params, f"plan_{op.name} must take formats= (TensorRT gives {op.channels_last} " \
                                    "as HWC8: channels padded to 8)"


def _float32_attention_model():
    node = FUSED_ATTENTION.make_node(["q", "k", "v"], ["o"], name="attn")
    value = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", 2, 64])  # noqa: E731
    graph = helper.make_graph([node], "g", [value("q"), value("k"), value("v")], [value("o")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), FUSED_ATTENTION.opset()])


def test_a_float32_custom_node_is_refused_in_one_line_or_cast_when_a_precision_is_asked():
    model = _float32_attention_model()
    with pytest.raises(prepare.ModelPrecisionError) as info:
        prepare.prepare_model(model)
    message = str(info.value)
    assert "'attn' takes float32 inputs" in message and "--fp16/--bf16" in message and "\n" not in message
    notes = []
    prepared = prepare.prepare_model(model, "bf16", notes)
    ops = [n.op_type for n in prepared.graph.node]
    assert ops == ["Cast", "Cast", "Cast", "FusedAttention", "Cast"]
    casts = [n for n in prepared.graph.node if n.op_type == "Cast"]
    targets = [helper.get_attribute_value(c.attribute[0]) for c in casts]
    assert targets == [TensorProto.BFLOAT16] * 3 + [TensorProto.FLOAT]
    assert prepared.graph.node[-1].output[0] == "o" and notes and "bfloat16" in notes[0]
    with pytest.raises(prepare.ModelPrecisionError, match="computes in bfloat16 but precision fp16"):
        prepare.prepare_model(prepared, "fp16")


def test_an_rgb_output_conv_computes_eight_channels_and_slices_three():
    """HWC8 pads Y's channels to 8 and the kernels write Y unpadded: K % 8 != 0 runs as K rounded up to 8."""
    rng = np.random.default_rng()
    w = rng.standard_normal((3, 3, 3, 16)).astype(np.float16)
    shift = rng.standard_normal(3).astype(np.float32)
    node = FUSED_CONV.make_node(["x", "w", "shift", "", "r"], ["y"], name="to_rgb", pads=[1, 1, 1, 1])
    value = lambda n, c: helper.make_tensor_value_info(n, TensorProto.FLOAT16, [1, c, 8, 8])  # noqa: E731
    graph = helper.make_graph([node], "g", [value("x", 16), value("r", 3)], [value("y", 3)],
                              initializer=[onnx.numpy_helper.from_array(w, "w"),
                                           onnx.numpy_helper.from_array(shift, "shift")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), FUSED_CONV.opset()])
    notes = []
    prepared = prepare.prepare_model(model, None, notes)
    assert [n.op_type for n in prepared.graph.node] == ["Pad", "FusedConv", "Slice"]
    pad, conv, cut = prepared.graph.node
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in prepared.graph.initializer}
    assert weights[conv.input[1]].shape == (8, 3, 3, 16) and np.array_equal(weights[conv.input[1]][:3], w)
    assert not weights[conv.input[1]][3:].any() and not weights[conv.input[2]][3:].any()
    assert list(weights[pad.input[1]]) == [0, 0, 0, 0, 0, 5, 0, 0] and conv.input[3] == pad.output[0]
    assert list(weights[cut.input[2]]) == [3] and list(weights[cut.input[3]]) == [1] and cut.output[0] == "y"
    assert notes == ["FusedConv node 'to_rgb': 3 output channels computed as 8 (zero weights) and sliced back "
                     "(TensorRT's HWC8 pads channels to 8)"]


def test_fp8_weights_reach_tensorrt_through_quantize_linear_at_opset_19():
    """FP8 is a quantized type in TensorRT: e4m3 weights become an exact float16 copy quantized with scale 1;
    an opset-17 model is declared 19 (QuantizeLinear to FP8), its reductions' axes moved to inputs."""
    import ml_dtypes
    rng = np.random.default_rng()
    w8 = rng.uniform(-2, 2, (16, 3, 3, 16)).astype(ml_dtypes.float8_e4m3fn)
    nodes = [FUSED_CONV.make_node(["x", "w", "", "w_scale"], ["y"], name="conv", pads=[1, 1, 1, 1], input_scale=0.05),
             helper.make_node("ReduceMean", ["y"], ["m"], axes=[2, 3], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("m", TensorProto.FLOAT16, [1, 16])],
                              initializer=[onnx.numpy_helper.from_array(w8, "w"), onnx.numpy_helper.from_array(
                                  rng.uniform(0.5, 1, 16).astype(np.float32), "w_scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), FUSED_CONV.opset()])
    notes = []
    prepared = prepare.prepare_model(model, None, notes)
    assert next(o.version for o in prepared.opset_import if o.domain == "") == 19
    quantize, conv, mean = prepared.graph.node
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in prepared.graph.initializer}
    assert quantize.op_type == "QuantizeLinear" and conv.input[1] == quantize.output[0]
    copy = weights[quantize.input[0]]
    assert copy.dtype == np.float16 and np.array_equal(copy.astype(ml_dtypes.float8_e4m3fn).view(np.uint8),
                                                       w8.view(np.uint8))
    assert float(weights[quantize.input[1]]) == 1.0
    assert mean.op_type == "ReduceMean" and not [a for a in mean.attribute if a.name == "axes"]
    assert list(weights[mean.input[1]]) == [2, 3] and len(notes) == 2

