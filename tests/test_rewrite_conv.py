"""Conv rewrite: each pattern is fused (or left, or cut short, with its reason) and the fused model computes what
the original did under onnxruntime, the FusedConv nodes evaluated by the contract's numpy reference."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trt_fusedattn.pipeline import rewrite
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.verification import verify

import _conv_graphs as graphs

SAMPLES = Path(__file__).resolve().parents[1] / "models" / "samples"
CONV_SAMPLES = sorted(p for family in ("resnet", "mobilenetv2", "vit", "levit", "unet", "whisper_encoder")
                      for p in SAMPLES.glob(f"{family}_*.onnx"))


def fuse_conv(model: onnx.ModelProto):
    """The conv family alone through the pipeline's pass: (fused model, conv sites)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fused, sites = rewrite(copy, only=["conv"])
    return fused, [s for s in sites if s.family == "conv"]


def fuse_and_verify(model: onnx.ModelProto):
    fused, sites = fuse_conv(model)
    result = verify(model, fused)
    assert result.passed, result.table()
    return fused, sites


def op_types(model: onnx.ModelProto) -> list[str]:
    return sorted(node.op_type for node in model.graph.node)


def only(items):
    assert len(items) == 1, items
    return items[0]


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if FUSED_CONV.is_node(node)]


def initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


@pytest.mark.parametrize("form", sorted(graphs.ACTIVATION_FORMS))
def test_activation_form_is_absorbed(form):
    model = graphs.activation_case(form)
    fused, sites = fuse_and_verify(model)
    site = only(sites)
    assert site.fused and site.details["activation"] == graphs.ACTIVATION_FORMS[form][1], site
    assert op_types(fused) == ["FusedConv"], "every node of the activation form is absorbed"


def test_x_times_other_hard_sigmoid_is_not_hard_swish():
    """x * HardSigmoid(x) with alpha != 1/6 is no contract activation: the Conv fuses alone."""
    b = graphs.GraphBuilder()
    conv = b.conv("x", 4, 6, (3, 3))
    y = b.op("Mul", [conv, b.op("HardSigmoid", [conv], alpha=0.2, beta=0.5)])
    model = b.model({"x": [2, 4, 6, 6]}, {y: None})
    fused, sites = fuse_and_verify(model)
    assert only(sites).details["activation"] == "none"
    assert op_types(fused) == ["FusedConv", "HardSigmoid", "Mul"]


def test_emitted_weights_are_ohwi_and_attributes_explicit():
    model = graphs.conv_case(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2])
    fused, sites = fuse_and_verify(model)
    node = only(fused_nodes(fused))
    attrs = FUSED_CONV.node_attributes(node)
    assert (attrs["strides"], attrs["pads"], attrs["dilations"]) == ((2, 1), (1, 0, 2, 1), (1, 2))
    original = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(initializer(fused, node.input[1]), original.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(initializer(fused, node.input[2]),
                                  numpy_helper.to_array(model.graph.initializer[1]))
    assert len(node.input) == 3, "no scale, no residual"
    assert only(sites).shapes == {"X": [2, 4, 9, 8], "W": [6, 3, 3, 4], "Y": [2, 6, 5, 5]}


@pytest.mark.parametrize("case, pads", [
    (dict(auto_pad="SAME_UPPER", strides=[2, 2], size=8), (0, 1, 1, 1)),
    (dict(auto_pad="SAME_LOWER", strides=[2, 2], size=8), (1, 1, 0, 1)),
    (dict(auto_pad="SAME_UPPER", kernel=4, size=9), (1, 1, 2, 2)),
    (dict(auto_pad="VALID", strides=[2, 2]), (0, 0, 0, 0)),
    (dict(group=2), (0, 0, 0, 0)),
    (dict(channels=4, out_channels=4, group=4, pads=[1, 1, 1, 1]), (1, 1, 1, 1)),        # depthwise
    (dict(channels=4, out_channels=8, group=4, strides=[2, 2]), (0, 0, 0, 0)),           # depthwise x2
    (dict(bias=False, kernel=1), (0, 0, 0, 0)),
    (dict(spatial=1, pads=[2, 1], strides=[2], dilations=[2]), (2, 1)),
    (dict(spatial=1, auto_pad="SAME_LOWER", size=11, strides=[3]), (1, 0)),
    (dict(spatial=1, channels=6, out_channels=6, group=6, kernel=5, pads=[2, 2]), (2, 2)),
    (dict(dtype=np.float16, pads=[1, 1, 1, 1]), (1, 1, 1, 1)),
], ids=["same_upper_stride", "same_lower_stride", "same_upper_even_kernel", "valid", "group2", "depthwise",
        "depthwise_multiplier", "no_bias_1x1", "1d", "1d_same_lower", "1d_depthwise", "float16"])
def test_conv_attributes(case, pads):
    model = graphs.conv_case(**case)
    fused, sites = fuse_and_verify(model)
    site, node = only(sites), only(fused_nodes(fused))
    assert site.fused and FUSED_CONV.node_attributes(node)["pads"] == pads
    assert FUSED_CONV.node_attributes(node)["group"] == case.get("group", 1)
    weight = initializer(fused, node.input[1])
    assert weight.dtype == np.dtype(case.get("dtype", np.float32)) and weight.ndim == case.get("spatial", 2) + 2
    assert ("bias" not in case) == (len(node.input) > 2)


@pytest.mark.parametrize("model, reason", [
    (graphs.conv_case(spatial=3, size=5), "3-D convolution is not supported (FusedConv is 1-D or 2-D)"),
    (graphs.graph_input_parameter_case("weights"), "weights are not constant (W comes from a graph input)"),
    (graphs.graph_input_parameter_case("bias"), "bias is not constant"),
    (graphs.conv_case(auto_pad="SAME_UPPER", dynamic_spatial=True),
     "auto_pad SAME_UPPER needs static spatial input dims, X is [2, 4, 'h', 'w']"),
], ids=["3d", "dynamic_weights", "dynamic_bias", "same_dynamic_spatial"])
def test_left_alone_with_reason(model, reason):
    fused, sites = fuse_conv(model)
    site = only(sites)
    assert not site.fused and site.reason == reason
    assert op_types(fused) == ["Conv"]


def test_batch_norm_folded_with_bias_and_per_channel_constant_adds():
    for constant in ([1, 6, 1, 1], [6, 1, 1], [1]):
        fused, sites = fuse_and_verify(graphs.batch_norm_case(constant_add=constant))
        details = only(sites).details
        assert (details["bn_folded"], details["bias"], details["activation"]) == (1, True, "relu"), constant
        assert op_types(fused) == ["FusedConv"]
    fused, sites = fuse_and_verify(graphs.batch_norm_case(bias=False))
    assert only(sites).details["bn_folded"] == 1 and op_types(fused) == ["FusedConv"]


def test_constant_add_per_width_is_not_a_bias():
    """A [W]-shaped constant broadcasts along the last axis, not per channel: it stays an Add."""
    b = graphs.GraphBuilder()
    y = b.op("Add", [b.conv("x", 4, 6, (3, 3)), b.random((4,))])
    fused, sites = fuse_and_verify(b.model({"x": [2, 4, 6, 6]}, {y: None}))
    assert op_types(fused) == ["Add", "FusedConv"]


@pytest.mark.parametrize("case, ending", [
    (dict(scale_input=True), "has non-constant parameters"),
], ids=["bn_scale_is_input"])
def test_batch_norm_not_foldable_ends_chain(case, ending):
    fused, sites = fuse_and_verify(graphs.batch_norm_case(**case))
    site = only(sites)
    assert site.fused and site.details["bn_folded"] == 0 and site.details["chain_end"].endswith(ending)
    assert op_types(fused) == ["BatchNormalization", "FusedConv", "Relu"]


def test_training_form_batch_norm_is_kept():
    fused, sites = fuse_and_verify(graphs.batch_norm_case(training_output=True))
    site = only(sites)
    assert site.fused and "training form" in site.details["chain_end"]
    assert "BatchNormalization" in op_types(fused)


@pytest.mark.parametrize("case, expected", [
    (dict(), ("none", "relu")),
    (dict(conv_first=False), ("none", "relu")),
    (dict(post=None), ("none", "none")),
    (dict(pre="relu", post="silu_x_first", bn=True), ("relu", "silu")),
    (dict(pre="leaky_relu", post="relu6_clip_inputs"), ("leaky_relu(0.1)", "clip(0, 6)")),
    (dict(dims=("n", 6, "h", "w")), ("none", "relu")),
    (dict(pre="relu", post="gelu_erf_div", bn=True, dtype=np.float16, relu_first=True), ("relu", "gelu")),
], ids=["conv_first", "residual_first", "no_post", "bn_pre_post_silu", "leaky_then_relu6", "dynamic_hw", "float16"])
def test_residual_add_and_post_activation(case, expected):
    fused, sites = fuse_and_verify(graphs.residual_case(**case))
    details = only(sites).details
    assert (details["activation"], details["post_activation"], details["residual"]) == (*expected, "x")
    node = only(fused_nodes(fused))
    assert node.input[4] == "x" and node.input[3] == ""
    assert op_types(fused) == ["FusedConv"] + (["Relu"] if case.get("relu_first") else [])


@pytest.mark.parametrize("dims", [(2, 4, 8, 8), ("n", 4, "h", "w")], ids=["static", "dynamic_hw"])
def test_projection_shortcut_later_conv_takes_the_add(dims):
    """Also with dynamic height and width: both branches are floor((h + 1) / 2), proved symbolically."""
    model = graphs.projection_case(dims)
    fused, sites = fuse_and_verify(model)
    assert op_types(fused) == ["FusedConv"] * 4
    with_residual = only([s for s in sites if s.details["residual"]])
    shortcut_output = model.graph.node[1].output[0]  # the shortcut's BatchNormalization
    assert with_residual.details["residual"] == shortcut_output
    last_conv = [n for n in model.graph.node if n.op_type == "Conv"][-1]
    assert with_residual.anchor == last_conv.name and with_residual.details["post_activation"] == "relu"
    shortcut = next(s for s in sites if s.anchor == model.graph.node[0].name)
    assert shortcut.details["bn_folded"] == 1 and "is taken by" in shortcut.details["chain_end"]


def test_pad_absorbed_into_conv_pads():
    model = graphs.pad_case()
    fused, sites = fuse_and_verify(model)
    assert op_types(fused) == ["FusedConv"] and only(sites).details["pad_folded"]
    assert FUSED_CONV.node_attributes(only(fused_nodes(fused)))["pads"] == (1, 0, 1, 2)


@pytest.mark.parametrize("case, why", [
    (dict(mode="reflect"), "mode reflect is not zero padding"),
    (dict(value=0.5), "its pad value is not the constant 0"),
    (dict(pads=(0, 1, 0, 0, 0, 0, 0, 0)), "pads [0, 1, 0, 0, 0, 0, 0, 0] are not non-negative pads of the spatial "
                                          "axes only"),
], ids=["reflect", "nonzero_value", "channel_pad"])
def test_pad_kept_when_not_a_zero_spatial_pad(case, why):
    model = graphs.pad_case(**case)
    if case.get("pads"):  # a channel pad changes the Conv's input channels: build its Conv to match
        b = graphs.GraphBuilder()
        padded = b.op("Pad", ["x", b.const(np.asarray(case["pads"]), np.int64)])
        y = b.conv(padded, 5, 6, (3, 3))
        model = b.model({"x": [2, 4, 8, 8]}, {y: None})
    fused, sites = fuse_and_verify(model)
    details = only(sites).details
    assert not details["pad_folded"] and details["pad_kept"] == why and "Pad" in op_types(fused)


@pytest.mark.parametrize("where, activation, remaining, ending", [
    ("conv_output", "none", ["FusedConv", "Relu", "Sigmoid"], "is read by 2 nodes"),
    ("graph_output", "none", ["FusedConv", "Relu"], "is a graph output"),
    ("gate", "none", ["FusedConv", "Mul", "Sigmoid", "Tanh"], "is read by 2 nodes"),
    ("activation_output", "relu", ["Add", "FusedConv", "Neg"], "is read by 2 nodes"),
])
def test_shared_intermediate_ends_chain(where, activation, remaining, ending):
    fused, sites = fuse_and_verify(graphs.shared_intermediate_case(where))
    site = only(sites)
    assert site.details["activation"] == activation and site.details["chain_end"].endswith(ending)
    assert op_types(fused) == remaining


def test_ops_written_with_the_ai_onnx_domain_fuse_as_the_default_domain():
    """"ai.onnx" names the default domain as "" does: a Conv, BatchNormalization, activation and residual Add
    written with it form the same chain (they were once skipped)."""
    model = graphs.residual_case(bn=True, pre="relu", post="relu")
    for node in model.graph.node:
        node.domain = "ai.onnx"
    model.opset_import.append(onnx.helper.make_opsetid("ai.onnx", model.opset_import[0].version))
    fused, sites = fuse_and_verify(model)
    site = only(sites)
    assert site.fused and site.details["bn_folded"] == 1, site
    assert (site.details["activation"], site.details["residual"], site.details["post_activation"]) == \
        ("relu", "x", "relu"), site
    assert op_types(fused) == ["FusedConv"]



@pytest.mark.parametrize("kind, ending", [
    ("broadcast", "is not provably of the output's shape [2, 6, 6, 6]"),
    ("constant_after_activation", "adds a constant that cannot fold into shift (after the activation, or not "
                                  "per channel)"),
    ("unrelated_dynamic", "is not provably of the output's shape [2, 6, 'height', 'width']"),
])
def test_add_that_is_not_a_residual_ends_chain(kind, ending):
    fused, sites = fuse_and_verify(graphs.nonresidual_add_case(kind))
    site = only(sites)
    assert site.details["activation"] == "relu" and site.details["residual"] == ""
    assert site.details["chain_end"].endswith(ending) and op_types(fused) == ["Add", "FusedConv"]


def test_verification_catches_a_wrong_epilogue():
    """The numeric check these tests rely on is live: a fused node with the wrong activation fails it."""
    model = graphs.activation_case("sigmoid")
    fused, _ = fuse_conv(model)
    node = only(fused_nodes(fused))
    for attribute in node.attribute:
        if attribute.name == "activation":
            attribute.s = b"tanh"
    assert not verify(model, fused).passed


@pytest.mark.parametrize("path", CONV_SAMPLES, ids=[p.stem for p in CONV_SAMPLES])
def test_every_conv_of_the_samples_is_fused(path):
    model = onnx.load(path)
    fused, sites = fuse_and_verify(model)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert convs and len(sites) == len(convs) and all(s.fused for s in sites), [s.reason for s in sites]
    cnn = path.stem.startswith(("resnet", "mobilenetv2"))  # elsewhere Adds and activations are the transformer's
    absorbed = {"Conv", "Pad"} | ({"Add", "Relu", "Clip"} if cnn else set()) | \
        ({"BatchNormalization"} if not path.stem.startswith("levit") else set())  # LeViT's Linear layers have BNs
    assert not absorbed & set(op_types(fused)), op_types(fused)
    if cnn:
        adds = sum(n.op_type == "Add" for n in model.graph.node)
        assert sum(bool(s.details["residual"]) for s in sites) == adds, "every residual Add is absorbed"
    if path.stem.startswith("resnet"):
        assert all(s.details["post_activation"] == "relu" for s in sites if s.details["residual"])
        assert all(s.details["bn_folded"] == ("_bn_" in path.stem) for s in sites)
    if path.stem.startswith("unet"):  # each residual block's Add, proved of the output's shape in both exports
        assert sum(bool(s.details["residual"]) for s in sites) == 3, [s.details.get("chain_end") for s in sites]
    if path.stem.startswith("mobilenetv2"):
        assert sum(s.details["activation"] == "clip(0, 6)" for s in sites) == 35

def test_per_channel_affine_arithmetic_folds_into_weights_and_shift():
    fused, sites = fuse_and_verify(graphs.affine_case())
    assert only(sites).details["activation"] == "relu" and op_types(fused) == ["FusedConv"]


def test_weights_cast_from_float32_are_folded():
    fused, sites = fuse_and_verify(graphs.weight_producer_case("Cast"))
    assert only(sites).fused and initializer(fused, only(fused_nodes(fused)).input[1]).dtype == np.float16


def test_weights_and_literals_cast_like_the_input_are_folded():
    """onnxscript's CastLike(constant, x): the weights fold, and the GELU's constants do not count as readers."""
    fused, sites = fuse_and_verify(graphs.weight_producer_case("CastLike"))
    site = only(sites)
    assert site.fused and site.details["activation"] == "gelu", site
    assert op_types(fused) == ["FusedConv"]


def test_quantized_weights_are_left_alone():
    fused, sites = fuse_conv(graphs.weight_producer_case("DequantizeLinear"))
    site = only(sites)
    assert not site.fused and site.reason.startswith("weights are quantized (DequantizeLinear)")
    assert op_types(fused) == ["Conv", "DequantizeLinear"]



# torch module -> contract activation as Site details describe it
TORCH_ACTIVATIONS = {
    "ReLU": "relu", "ReLU6": "clip(0, 6)", "Hardtanh": "clip(-2, 3)", "LeakyReLU": "leaky_relu(0.2)",
    "Sigmoid": "sigmoid", "SiLU": "silu", "Hardsigmoid": "hard_sigmoid(0.166667, 0.5)", "Hardswish": "hard_swish",
    "GELU": "gelu", "GELU_tanh": "gelu_tanh", "Tanh": "tanh",
}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_activations_as_torch_exports_them(exporter, tmp_path):
    """Conv -> BatchNorm -> each torch activation, and a residual block with it after the add, exported by the
    exporter itself: every branch becomes one FusedConv with its activation."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def activation(name):
        special = {"Hardtanh": lambda: nn.Hardtanh(-2.0, 3.0), "LeakyReLU": lambda: nn.LeakyReLU(0.2),
                   "GELU_tanh": lambda: nn.GELU(approximate="tanh")}
        return special[name]() if name in special else getattr(nn, name)()

    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(4, 4, 3, padding=1) for _ in TORCH_ACTIVATIONS)
            self.norms = nn.ModuleList(nn.BatchNorm2d(4) for _ in TORCH_ACTIVATIONS)
            self.acts = nn.ModuleList(activation(name) for name in TORCH_ACTIVATIONS)
            for norm in self.norms:
                for buffer in (norm.running_mean, norm.bias):
                    nn.init.uniform_(buffer, -0.5, 0.5)
                for buffer in (norm.running_var, norm.weight):
                    nn.init.uniform_(buffer, 0.5, 1.5)

        def forward(self, x):
            return torch.cat([act(act(norm(conv(x))) + x)
                              for conv, norm, act in zip(self.convs, self.norms, self.acts)], 1)

    torch.manual_seed(0)
    path = tmp_path / f"activations_{exporter}.onnx"
    kwargs = dict(dynamo=False, opset_version=17, do_constant_folding=False) if exporter == "torchscript" \
        else dict(dynamo=True, opset_version=23)
    torch.onnx.export(Branches().eval(), (torch.randn(2, 4, 6, 6),), str(path), input_names=["x"], **kwargs)
    model = onnx.load(path)
    fused, sites = fuse_and_verify(model)
    expected = sorted(TORCH_ACTIVATIONS.values())
    assert sorted(s.details["activation"] for s in sites) == expected
    assert sorted(s.details["post_activation"] for s in sites) == expected
    assert all(s.details["residual"] == "x" for s in sites)
    assert op_types(fused) == ["Concat"] + ["FusedConv"] * len(TORCH_ACTIVATIONS)


def test_symbolic_spatial_dims_match_onnxruntime():
    """The floor dims derived through strided, dilated, padded, SAME convolutions and pools are the sizes
    onnxruntime produces, for every input size tried."""
    import onnx_graphsurgeon as gs
    import onnxruntime as ort

    from trt_fusedattn.rewrites._shapes import FloorDim, TensorShapes

    b = graphs.GraphBuilder()
    y = b.conv("x", 3, 4, (7, 7), strides=[2, 2], pads=[3, 3, 3, 3])
    y = b.op("MaxPool", [b.op("Relu", [y])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 2])
    y = b.conv(y, 4, 4, (3, 3), strides=[2, 1], pads=[1, 1, 0, 1], dilations=[2, 2], group=2)
    y = b.op("AveragePool", [b.op("Add", [y, b.random((4, 1, 1))])], kernel_shape=[2, 3], strides=[2, 2])
    y = b.conv(y, 4, 4, (3, 3), strides=[3, 2], auto_pad="SAME_UPPER")
    model = b.model({"x": ["n", 3, "h", "w"]}, {y: None})
    graph = gs.import_onnx(model)
    dims = TensorShapes(graph, []).of(graph.outputs[0])
    assert dims[:2] == [FloorDim("n"), 4] and all(isinstance(d, FloorDim) for d in dims[2:]), dims
    session = ort.InferenceSession(model.SerializeToString())
    for h, w in [(29, 40), (30, 31), (45, 33), (64, 64), (97, 50)]:
        x = np.random.default_rng(h).standard_normal((1, 3, h, w)).astype(np.float32)
        actual = session.run(None, {"x": x})[0].shape[2:]
        assert actual == tuple((v + d.offset) // d.divisor for v, d in zip((h, w), dims[2:])), (h, w)
