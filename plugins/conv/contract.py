"""``trt_fusedattn::FusedConv``: convolution with its epilogue, its one definition and numpy reference.

Semantics (1-D or 2-D, G = ``group``; X is NC[H]W as in ONNX, W is stored output-channel-first and
input-channel-last, [K, kH, kW, C/G] ("OHWI", what a channels-last implicit GEMM reads), [K, kW, C/G] in 1-D):

    X' = X                                         when input_scale == 0
    X' = input_scale * e4m3(X / input_scale)       otherwise (FP8: saturating round-to-nearest-even, W is e4m3);
    X' = input_scale * X                           when X is already float8e4m3fn (written by an FP8 producer)
    acc[n, k, p, q] = sum over c in k's group, r, s of X'[n, c, p*sh + r*dh - pad_h, q*sw + s*dw - pad_w] * W[k, r, s, c]
                      (out-of-range X reads are 0)
    y = act(acc * scale[k] + shift[k])             scale defaults to 1, shift to 0 (bias, folded BatchNorm, FP8 dequant)
    y = post_act(y + residual)                     only when a residual is given (residual in y's dtype, below)
    Y = y in X's dtype (float16 when X is float8e4m3fn), accumulated in float32 or better, when output_scale == 0
    Y = e4m3(y / output_scale)                     otherwise: float8e4m3fn, saturating round-to-nearest-even (an
                                                   FP8 producer: its FP8 consumers read Y as X with input_scale =
                                                   output_scale, with no separate quantize pass)

Activations (``activation`` and ``post_activation``; alpha/beta as in the ONNX op of the same meaning):
none, relu, clip (alpha = min, beta = max), leaky_relu (alpha), sigmoid, silu (x * sigmoid(x)),
hard_sigmoid (max(0, min(1, alpha * x + beta))), hard_swish (x * max(0, min(1, x / 6 + 1 / 2))),
gelu (erf form), gelu_tanh, tanh.
"""
from __future__ import annotations

import math

import numpy as np

from trt_fusedattn.contract import AttrSpec, OpContract, TensorSpec
from trt_fusedattn.fp8 import quantize_e4m3, to_e4m3


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


# name -> f(x, alpha, beta) in float64. One table: the reference, the kernels' specializations and the
# rewrite's activation matching all key on these names.
ACTIVATIONS = {
    "none": lambda x, a, b: x,
    "relu": lambda x, a, b: np.maximum(x, 0.0),
    "clip": lambda x, a, b: np.clip(x, a, b),
    "leaky_relu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "sigmoid": lambda x, a, b: 1.0 / (1.0 + np.exp(-x)),
    "silu": lambda x, a, b: x / (1.0 + np.exp(-x)),
    "hard_sigmoid": lambda x, a, b: np.clip(a * x + b, 0.0, 1.0),
    "hard_swish": lambda x, a, b: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "gelu": lambda x, a, b: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x, a, b: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "tanh": lambda x, a, b: np.tanh(x),
}


def conv_reference(x, w, *, strides, pads, dilations, group) -> np.ndarray:
    """Grouped N-D convolution in float64 (X is NC..., W is [K, *kernel, C/G]), no epilogue."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    nd = x.ndim - 2
    batch, channels = x.shape[:2]
    out_channels, kernel, cg = w.shape[0], w.shape[1:-1], w.shape[-1]
    if channels != cg * group or out_channels % group:
        raise ValueError(f"channels {channels} / out {out_channels} do not fit group={group} and W {w.shape}")
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    out_sizes = [(x.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    kg = out_channels // group
    y = np.zeros((batch, out_channels, *out_sizes))
    for offset in np.ndindex(*kernel):
        window = tuple(slice(offset[i] * dilations[i], offset[i] * dilations[i] + (out_sizes[i] - 1) * strides[i] + 1,
                             strides[i]) for i in range(nd))
        patch = x[(slice(None), slice(None)) + window]  # [N, C, *out]
        for g in range(group):
            wg = w[(slice(g * kg, (g + 1) * kg),) + offset]  # [Kg, C/G]
            y[:, g * kg:(g + 1) * kg] += np.einsum("nc...,kc->nk...", patch[:, g * cg:(g + 1) * cg], wg)
    return y


def fused_conv_reference(x, w, shift=None, scale=None, residual=None, *, strides=(), pads=(), dilations=(),
                         group=1, activation="none", activation_alpha=0.0, activation_beta=0.0,
                         post_activation="none", post_activation_alpha=0.0, post_activation_beta=0.0,
                         input_scale=0.0, output_scale=0.0):
    """The contract in numpy, computed in float64 and returned in Y's dtype."""
    import ml_dtypes
    x = np.asarray(x)
    nd = x.ndim - 2
    x_e4m3 = x.dtype == ml_dtypes.float8_e4m3fn
    xs = x.astype(np.float64) * input_scale if x_e4m3 else quantize_e4m3(x, input_scale) if input_scale else x
    y = conv_reference(xs, w, strides=strides or (1,) * nd, pads=pads or (0,) * 2 * nd,
                       dilations=dilations or (1,) * nd, group=group)
    channel = (slice(None),) + (None,) * nd  # [K] -> [K, 1, ...], broadcast over [N, K, ...]
    if scale is not None:
        y = y * np.asarray(scale, np.float64)[channel]
    if shift is not None:
        y = y + np.asarray(shift, np.float64)[channel]
    y = ACTIVATIONS[activation](y, activation_alpha, activation_beta)
    if residual is not None:
        y = ACTIVATIONS[post_activation](y + np.asarray(residual, np.float64), post_activation_alpha,
                                         post_activation_beta)
    if output_scale:
        return to_e4m3(y, output_scale)
    return y.astype(np.float16 if x_e4m3 else x.dtype)


FUSED_CONV = OpContract(
    name="FusedConv",
    version=1,
    doc=__doc__,
    inputs=(
        TensorSpec("X", "input, [N, C, H, W] or [N, C, W]; float16, bfloat16 or float32, or float8e4m3fn "
                        "(already quantized, with input_scale)"),
        TensorSpec("W", "weights, [K, kH, kW, C/G] or [K, kW, C/G]; dtype of X, or float8e4m3fn with input_scale"),
        TensorSpec("shift", "float32 [K], added per output channel (bias, BatchNorm shift)", optional=True),
        TensorSpec("scale", "float32 [K], multiplied per output channel before shift (FP8 weight scale)",
                   optional=True),
        TensorSpec("residual", "added after the activation; shape of the output, dtype of X (float16 for "
                               "float8e4m3fn X)", optional=True),
    ),
    outputs=(TensorSpec("Y", "[N, K, P, Q] or [N, K, Q], dtype of X (float16 for float8e4m3fn X); float8e4m3fn "
                             "with output_scale"),),
    attributes=(
        AttrSpec("strides", "ints", (), "per spatial axis; empty means 1"),
        AttrSpec("pads", "ints", (), "begin pads then end pads per spatial axis, as ONNX Conv; empty means 0"),
        AttrSpec("dilations", "ints", (), "per spatial axis; empty means 1"),
        AttrSpec("group", "int", 1, "channel groups; C for depthwise"),
        AttrSpec("activation", "string", "none", "applied after scale and shift", tuple(ACTIVATIONS)),
        AttrSpec("activation_alpha", "float", 0.0, "first parameter of activation"),
        AttrSpec("activation_beta", "float", 0.0, "second parameter of activation"),
        AttrSpec("post_activation", "string", "none", "applied after the residual add", tuple(ACTIVATIONS)),
        AttrSpec("post_activation_alpha", "float", 0.0, "first parameter of post_activation"),
        AttrSpec("post_activation_beta", "float", 0.0, "second parameter of post_activation"),
        AttrSpec("input_scale", "float", 0.0, "FP8 per-tensor scale of X; 0 means X is not quantized"),
        AttrSpec("output_scale", "float", 0.0, "FP8 per-tensor scale of Y (Y = e4m3(y / output_scale), for FP8 "
                 "consumers); 0 means Y is not quantized"),
    ),
    reference=fused_conv_reference,
)
