"""Small hand-built ONNX graphs around one Conv, for the conv rewrite tests: every activation form exporters
write, auto_pad variants, 1-D, groups, depthwise, dilation, BatchNorm, residual adds, shared intermediates, 3-D."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

RNG_SEED = 1234


class GraphBuilder:
    """Accumulates nodes and initializers with fresh names; ``model`` wraps them into a checked ModelProto."""

    def __init__(self, dtype=np.float32, seed: int = RNG_SEED):
        self.nodes, self.initializers, self.dtype = [], [], np.dtype(dtype)
        self.rng = np.random.default_rng(seed)
        self._count = 0

    def name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def const(self, value, dtype=None) -> str:
        name = self.name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype or self.dtype), name))
        return name

    def random(self, shape, scale: float = 1.0) -> str:
        return self.const(self.rng.standard_normal(shape) * scale)

    def constant_node(self, value) -> str:
        """A scalar as a Constant node (not an initializer), as the TorchScript exporter writes many."""
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, self.dtype)))

    def op(self, op_type: str, inputs, outputs: int = 1, domain: str = "", **attrs):
        names = [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.name(f"{op_type}_node"),
                                           domain=domain, **attrs))
        return names[0] if outputs == 1 else names

    def conv(self, x: str, channels: int, out_channels: int, kernel, *, group: int = 1, bias: bool = True,
             weight: str | None = None, **attrs) -> str:
        kernel = tuple(kernel)
        w = weight or self.random((out_channels, channels // group) + kernel,
                                  1.0 / math.sqrt(channels // group * math.prod(kernel)))
        inputs = [x, w] + ([self.random((out_channels,), 0.5)] if bias else [])
        return self.op("Conv", inputs, group=group, **attrs)

    def batch_norm(self, x: str, channels: int, **attrs) -> str:
        params = [self.const(self.rng.uniform(0.5, 1.5, channels)), self.random((channels,), 0.3),
                  self.random((channels,), 0.3), self.const(self.rng.uniform(0.5, 2.0, channels))]
        return self.op("BatchNormalization", [x] + params, **attrs)

    def model(self, inputs: dict, outputs: dict, opset: int = 17) -> onnx.ModelProto:
        """``inputs``/``outputs``: name -> shape (None for an output to be inferred)."""
        elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        graph = helper.make_graph(
            self.nodes, "conv_case",
            [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, elem, s) for n, s in outputs.items()],
            initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8 if opset <= 18 else 10
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # fills the outputs' shapes
        del model.graph.value_info[:]  # as exporters leave them: the rewrite must infer what it needs
        onnx.checker.check_model(model, full_check=True)
        return model


# ---- activation forms, each f(builder, x) -> y ------------------------------------------------------------------

def _clip_inputs(low, high):
    def build(b, x):
        return b.op("Clip", [x, "" if low is None else b.const(low), "" if high is None else b.const(high)])
    return build


def _x_times(gate, first=True):
    def build(b, x):
        g = gate(b, x)
        return b.op("Mul", [x, g] if first else [g, x])
    return build


def _hard_swish_relu6(variant):
    """x * Relu6(x + 3) / 6 with the division in three places exporters put it."""
    def build(b, x):
        relu6 = b.op("Clip", [b.op("Add", [x, b.const(3.0)]), b.const(0.0), b.const(6.0)])
        if variant == "div_after":
            return b.op("Div", [b.op("Mul", [x, relu6]), b.const(6.0)])
        if variant == "div_gate":
            return b.op("Mul", [x, b.op("Div", [relu6, b.const(6.0)])])
        return b.op("Mul", [b.op("Mul", [relu6, x]), b.const(1 / 6)])
    return build


def _gelu_erf(variant):
    """0.5 * x * (1 + erf(x / sqrt 2)) as the TorchScript exporter writes it and in the Mul-by-0.707 order."""
    def build(b, x):
        if variant == "div":
            erf = b.op("Erf", [b.op("Div", [x, b.const(1.4142135381698608)])])
            return b.op("Mul", [b.op("Mul", [x, b.op("Add", [erf, b.const(1.0)])]), b.const(0.5)])
        erf = b.op("Erf", [b.op("Mul", [b.constant_node(0.7071067690849304), x])])
        return b.op("Mul", [b.op("Mul", [b.const(0.5), x]), b.op("Add", [b.const(1.0), erf])])
    return build


def _gelu_tanh_decomposed(b, x):
    cubic = b.op("Mul", [b.op("Pow", [x, b.const(3.0)]), b.const(0.044715)])
    inner = b.op("Mul", [b.op("Add", [x, cubic]), b.const(math.sqrt(2 / math.pi))])
    one_plus = b.op("Add", [b.op("Tanh", [inner]), b.const(1.0)])
    return b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), one_plus])


def _op(op_type, **attrs):
    return lambda b, x: b.op(op_type, [x], **attrs)


# form name -> (builder, expected contract activation as Site details describe it, minimum opset)
ACTIVATION_FORMS = {
    "relu": (_op("Relu"), "relu", 13),
    "relu6_clip_inputs": (_clip_inputs(0.0, 6.0), "clip(0, 6)", 13),
    "clip_min_only_is_relu": (_clip_inputs(0.0, None), "relu", 13),
    "clip_max_only": (_clip_inputs(None, 1.5), "clip(-inf, 1.5)", 13),
    "clip_attributes_opset10": (_op("Clip", min=-0.5, max=0.75), "clip(-0.5, 0.75)", 10),
    "leaky_relu": (_op("LeakyRelu", alpha=0.1), "leaky_relu(0.1)", 13),
    "leaky_relu_default": (_op("LeakyRelu"), "leaky_relu(0.01)", 13),
    "sigmoid": (_op("Sigmoid"), "sigmoid", 13),
    "silu_x_first": (_x_times(_op("Sigmoid")), "silu", 13),
    "silu_sigmoid_first": (_x_times(_op("Sigmoid"), first=False), "silu", 13),
    "swish_op": (_op("Swish"), "silu", 24),
    "hard_sigmoid": (_op("HardSigmoid", alpha=0.3, beta=0.4), "hard_sigmoid(0.3, 0.4)", 13),
    "hard_swish_op": (_op("HardSwish"), "hard_swish", 14),
    "hard_swish_x_hardsigmoid": (_x_times(_op("HardSigmoid", alpha=1 / 6, beta=0.5), first=False), "hard_swish", 13),
    "hard_swish_relu6_div_after": (_hard_swish_relu6("div_after"), "hard_swish", 13),
    "hard_swish_relu6_div_gate": (_hard_swish_relu6("div_gate"), "hard_swish", 13),
    "hard_swish_relu6_mul_sixth": (_hard_swish_relu6("mul_sixth"), "hard_swish", 13),
    "gelu_op": (_op("Gelu"), "gelu", 20),
    "gelu_op_tanh": (_op("Gelu", approximate="tanh"), "gelu_tanh", 20),
    "gelu_erf_div": (_gelu_erf("div"), "gelu", 13),
    "gelu_erf_mul": (_gelu_erf("mul"), "gelu", 13),
    "gelu_tanh_decomposed": (_gelu_tanh_decomposed, "gelu_tanh", 13),
    "tanh": (_op("Tanh"), "tanh", 13),
}


def activation_case(form: str, dtype=np.float32) -> onnx.ModelProto:
    """Conv(3x3, pads 1) -> activation form -> output."""
    build, _, opset = ACTIVATION_FORMS[form]
    b = GraphBuilder(dtype)
    y = build(b, b.conv("x", 4, 6, (3, 3), pads=[1, 1, 1, 1]))
    return b.model({"x": [2, 4, 7, 7]}, {y: None}, opset=opset)


def conv_case(*, spatial: int = 2, channels: int = 4, out_channels: int = 6, size: int = 9, kernel: int = 3,
              batch: int = 2, dynamic_spatial: bool = False, dtype=np.float32, bias: bool = True,
              **attrs) -> onnx.ModelProto:
    """One Conv with the given attributes (strides, pads, auto_pad, dilations, group) and nothing after it."""
    b = GraphBuilder(dtype)
    y = b.conv("x", channels, out_channels, (kernel,) * spatial, bias=bias, **attrs)
    dims = ["h", "w", "d"][:spatial] if dynamic_spatial else [size - i for i in range(spatial)]
    return b.model({"x": [batch, channels, *dims]}, {y: None})


def residual_case(*, conv_first: bool = True, post: str | None = "relu", pre: str | None = None,
                  bn: bool = False, dims=(2, 6, 6, 6), dtype=np.float32, relu_first: bool = False) -> onnx.ModelProto:
    """[Relu] Conv [BN] [pre activation] + x (the block input) [post activation]: a ResNet identity block's tail."""
    b = GraphBuilder(dtype)
    y = b.conv(b.op("Relu", ["x"]) if relu_first else "x", 6, 6, (3, 3), pads=[1, 1, 1, 1])
    if bn:
        y = b.batch_norm(y, 6)
    if pre:
        y = ACTIVATION_FORMS[pre][0](b, y)
    y = b.op("Add", [y, "x"] if conv_first else ["x", y])
    if post:
        y = ACTIVATION_FORMS[post][0](b, y)
    return b.model({"x": list(dims)}, {y: None})


def projection_case(dims=(2, 4, 8, 8)) -> onnx.ModelProto:
    """ResNet bottleneck with a projection shortcut: both operands of the Add are conv chains."""
    b = GraphBuilder()
    shortcut = b.batch_norm(b.conv("x", 4, 8, (1, 1), strides=[2, 2], bias=False), 8)
    main = b.op("Relu", [b.batch_norm(b.conv("x", 4, 3, (1, 1), bias=False), 3)])
    main = b.op("Relu", [b.conv(main, 3, 3, (3, 3), pads=[1, 1, 1, 1], strides=[2, 2])])
    main = b.conv(main, 3, 8, (1, 1))
    y = b.op("Relu", [b.op("Add", [main, shortcut])])
    return b.model({"x": list(dims)}, {y: None})


def batch_norm_case(*, training_output: bool = False, bias: bool = True, constant_add: list | None = None,
                    scale_input: bool = False) -> onnx.ModelProto:
    """Conv -> BatchNormalization [-> Add(per-channel constant)] -> Relu, and the variants that must stop."""
    b = GraphBuilder()
    y = b.conv("x", 4, 6, (3, 3), bias=bias, strides=[2, 2])
    outputs = {}
    if training_output:  # opset 14+ training form: the running statistics are outputs too
        params = [b.const(np.ones(6)), b.const(np.zeros(6)), b.random((6,), 0.3), b.const(np.ones(6))]
        y, mean, var = b.op("BatchNormalization", [y] + params, outputs=3, training_mode=1)
        outputs = {mean: None, var: None}
    elif scale_input:  # the BatchNorm scale is a graph input: nothing to fold
        params = ["gamma", b.random((6,), 0.3), b.random((6,), 0.3), b.const(np.ones(6))]
        y = b.op("BatchNormalization", [y] + params)
    else:
        y = b.batch_norm(y, 6, epsilon=1e-3)
    if constant_add is not None:
        y = b.op("Add", [b.random(constant_add, 0.5), y])
    y = b.op("Relu", [y])
    inputs = {"x": [2, 4, 9, 9], **({"gamma": [6]} if scale_input else {})}
    return b.model(inputs, {y: None, **outputs}, opset=17)


def pad_case(*, mode: str = "constant", value: float = 0.0, pads=(0, 0, 1, 0, 0, 0, 1, 2)) -> onnx.ModelProto:
    """Pad (pad amounts computed from Constants, as the TorchScript exporter writes them) -> Conv."""
    b = GraphBuilder()
    amounts = b.op("Concat", [b.const(np.asarray(pads[:4]), np.int64), b.const(np.asarray(pads[4:]), np.int64)],
                   axis=0)
    padded = b.op("Pad", ["x", amounts, b.const(value)], mode=mode)
    y = b.op("Relu", [b.conv(padded, 4, 6, (3, 3), strides=[2, 2])])
    return b.model({"x": [2, 4, 8, 8]}, {y: None})


def shared_intermediate_case(where: str) -> onnx.ModelProto:
    """A chain whose intermediate is also read elsewhere: the fusion must stop before it."""
    b = GraphBuilder()
    conv = b.conv("x", 4, 6, (3, 3), pads=[1, 1, 1, 1])
    if where == "conv_output":  # conv output read by the activation and a second branch
        y, extra = b.op("Relu", [conv]), b.op("Sigmoid", [conv])
    elif where == "graph_output":  # conv output is itself a graph output
        y, extra = b.op("Relu", [conv]), conv
    elif where == "gate":  # x*Sigmoid(x) whose Sigmoid is read elsewhere too
        gate = b.op("Sigmoid", [conv])
        y, extra = b.op("Mul", [conv, gate]), b.op("Tanh", [gate])
    elif where == "activation_output":  # Relu output read by the residual Add and another branch
        relu = b.op("Relu", [conv])
        y, extra = b.op("Add", [relu, "x2"]), b.op("Neg", [relu])
    else:
        raise ValueError(where)
    return b.model({"x": [2, 4, 6, 6], **({"x2": [2, 6, 6, 6]} if where == "activation_output" else {})},
                   {y: None, extra: None})


def nonresidual_add_case(kind: str) -> onnx.ModelProto:
    """Conv -> Relu -> Add whose other operand is not a residual of the output's shape."""
    b = GraphBuilder()
    y = b.op("Relu", [b.conv("x", 4, 6, (3, 3), pads=[1, 1, 1, 1])])
    inputs = {"x": [2, 4, 6, 6]}
    if kind == "broadcast":  # per-channel tensor input: broadcasts, so not the output's shape
        inputs["r"] = [1, 6, 1, 1]
        y = b.op("Add", [y, "r"])
    elif kind == "unrelated_dynamic":  # equal at run time, but nothing in the graph proves it
        inputs = {"x": [2, 4, "height", "width"], "r": [2, 6, "height2", "width2"]}
        y = b.op("Add", [y, "r"])
    elif kind == "constant_after_activation":
        y = b.op("Add", [y, b.random((1, 6, 1, 1))])
    else:
        raise ValueError(kind)
    return b.model(inputs, {y: None})


def graph_input_parameter_case(which: str) -> onnx.ModelProto:
    """Conv whose weights or bias are a graph input."""
    b = GraphBuilder()
    if which == "weights":
        y = b.op("Conv", ["x", "w"], pads=[1, 1, 1, 1])
        return b.model({"x": [2, 4, 6, 6], "w": [6, 4, 3, 3]}, {y: None})
    y = b.op("Conv", ["x", b.random((6, 4, 3, 3)), "bias"], pads=[1, 1, 1, 1])
    return b.model({"x": [2, 4, 6, 6], "bias": [6]}, {y: None})


def affine_case() -> onnx.ModelProto:
    """BatchNorm decomposed by hand: Conv -> Sub(mean) -> Div(std) -> Mul(gamma) -> Add(beta) -> Relu, with
    per-channel constants in the shapes exporters use ([1,K,1,1], [K,1,1], scalar)."""
    b = GraphBuilder()
    y = b.conv("x", 4, 6, (3, 3), pads=[1, 1, 1, 1])
    y = b.op("Sub", [y, b.random((1, 6, 1, 1), 0.3)])
    y = b.op("Div", [y, b.const(b.rng.uniform(0.5, 2.0, (6, 1, 1)))])
    y = b.op("Mul", [b.const(b.rng.uniform(-1.5, 1.5, (1, 6, 1, 1))), y])
    y = b.op("Mul", [y, b.const(1.25)])
    y = b.op("Relu", [b.op("Add", [y, b.random((6, 1, 1), 0.3)])])
    return b.model({"x": [2, 4, 6, 6]}, {y: None})


def weight_producer_case(op_type: str) -> onnx.ModelProto:
    """Conv whose weights a node computes from an initializer: Cast (float32 -> float16, in a float16 graph),
    CastLike (as onnxscript writes weights and literals: the weights and the erf GELU's constants cast like the
    input) or DequantizeLinear (int8 Q/DQ, float32 graph)."""
    b = GraphBuilder(np.float16 if op_type == "Cast" else np.float32)
    if op_type == "CastLike":
        w = b.op("CastLike", [b.const(b.rng.standard_normal((6, 4, 3, 3)) / 6, np.float64), "x"])
        conv = b.op("Conv", ["x", w, b.random((6,), 0.5)], pads=[1, 1, 1, 1])
        like = [b.op("CastLike", [b.const(value, np.float64), conv]) for value in (1.4142135, 1.0, 0.5)]
        gate = b.op("Mul", [like[2], b.op("Add", [b.op("Erf", [b.op("Div", [conv, like[0]])]), like[1]])])
        return b.model({"x": [2, 4, 6, 6]}, {b.op("Mul", [conv, gate]): None})
    if op_type == "Cast":
        w = b.op("Cast", [b.const(b.rng.standard_normal((6, 4, 3, 3)) / 6, np.float32)], to=onnx.TensorProto.FLOAT16)
    else:
        w = b.op("DequantizeLinear", [b.const(b.rng.integers(-100, 100, (6, 4, 3, 3)), np.int8),
                                      b.const(0.01), b.const(0, np.int8)])
    y = b.op("Conv", ["x", w, b.random((6,), 0.5)], pads=[1, 1, 1, 1])
    return b.model({"x": [2, 4, 6, 6]}, {y: None})

