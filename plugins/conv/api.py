"""``trt_fusedattn.conv2d``: FusedConv on the caller's channels-last GPU arrays, on the caller's stream.

Launches exactly the PTX and plan a TensorRT FusedConv node runs (``plan.plan_conv`` + the launcher).

    x = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    w = conv.weight.half().to(memory_format=torch.channels_last)        # [K, C/G, kH, kW], OHWI in memory
    y = trt_fusedattn.conv2d(x, w, bias, padding=1, activation="relu", residual=identity, post_activation="relu")
    # FP8: e4m3 weights with per-channel scales, X quantized in the kernel with a per-tensor scale
    w_scale = w.float().abs().amax(dim=(1, 2, 3)) / 448
    w8 = (w.float() / w_scale[:, None, None, None]).to(torch.float8_e4m3fn)          # keeps channels-last
    y = trt_fusedattn.conv2d(x, w8, bias, scale=w_scale, input_scale=x_amax / 448, padding=1, activation="relu")
    # an FP8 chain: y8 = e4m3(y / y_scale) (float8_e4m3fn), read by the next FP8 layer with input_scale=y_scale
    y8 = trt_fusedattn.conv2d(x, w8, bias, scale=w_scale, input_scale=x_amax / 448, output_scale=y_scale, padding=1)
    z = trt_fusedattn.conv2d(y8, w8_next, scale=w_next_scale, input_scale=y_scale, padding=1)
"""
from __future__ import annotations

from trt_fusedattn.launcher.arrays import (ArrayError, caller_stream, device_array, empty_like_kind, require,
                                           same_device)
from trt_fusedattn.launcher.launch import device_arch, launch
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.plugins.conv.plan import output_dtype_conv, plan_conv

_ALIGNMENT = 16  # bytes: the kernels move 16-byte vectors


def _pair(value, name: str) -> tuple:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2:
        raise ValueError(f"{name}={value!r}: give an int or a pair (h, w)")
    return pair


def _require_channels_last(array, name: str):
    """A 4-D array [A, B, C, D] whose memory is [A, C, D, B] dense (torch channels_last, or its CuPy twin)."""
    if len(array.shape) != 4:
        raise ArrayError(f"{name} has shape {array.shape}; expected 4 dimensions (N, C, H, W)")
    a, b, c, d = array.shape
    expected = (c * d * b, 1, d * b, b)
    if any(extent != 1 and stride != want for extent, stride, want in zip(array.shape, array.strides, expected)):
        raise ArrayError(f"{name} (shape {array.shape}, strides {array.strides}) is not channels-last; "
                         "pass x.to(memory_format=torch.channels_last) (CuPy: an NHWC array transposed to NCHW)")
    if array.ptr % _ALIGNMENT:
        raise ArrayError(f"{name} starts at 0x{array.ptr:x}, not {_ALIGNMENT}-byte aligned; pass a fresh allocation")
    return array


def _channels_first_view(array):
    """The NHWC allocation ``array`` seen as [N, C, H, W] (torch/CuPy/pycuda views, no copy)."""
    obj = array.obj
    return obj.permute(0, 3, 1, 2) if array.kind == "torch" else obj.transpose(0, 3, 1, 2)


def conv2d(x, w, bias=None, *, scale=None, stride=1, padding=0, dilation=1, groups: int = 1,
           activation: str = "none", activation_alpha: float = 0.0, activation_beta: float = 0.0,
           residual=None, post_activation: str = "none", post_activation_alpha: float = 0.0,
           post_activation_beta: float = 0.0, input_scale: float = 0.0, output_scale: float = 0.0, out=None,
           stream=None):
    """``post_act(act(conv(x, w) * scale + bias) + residual)`` in one kernel (the FusedConv contract).

    x [N, C, H, W] and w [K, C/groups, kH, kW] are float16/bfloat16 and channels-last in memory (NHWC, OHWI);
    FP8 (sm_89+): w float8_e4m3fn and ``input_scale`` > 0, x is quantized as e4m3(x / input_scale) and the
    accumulator multiplied by ``input_scale * scale`` (scale: the per-output-channel weight scale); x may also be
    float8_e4m3fn already (e4m3(x / input_scale), as an FP8 producer writes it; C/groups % 16 == 0), and the
    output is then float16. ``output_scale`` > 0 (sm_89+): the output is float8_e4m3fn, e4m3(y / output_scale), what
    the next FP8 layer reads as x with input_scale = output_scale.
    bias and scale float32 [K]; residual [N, K, P, Q] channels-last like the output, in x's dtype (float16 for
    float8_e4m3fn x). ``padding`` is an int, a
    pair, or ONNX's (top, left, bottom, right). Returns ``out`` (or a new array of x's library), [N, K, P, Q]
    channels-last, written asynchronously on ``stream`` (default: the current stream of x's library)."""
    names = ("x", "w", "bias", "scale", "residual")
    arrays = [None if a is None else device_array(a, n) for a, n in zip((x, w, bias, scale, residual), names)]
    xa, wa, shift, sc, res = arrays
    device = same_device(arrays + [None if out is None else device_array(out, "out")],
                         list(names) + ["out"])
    _require_channels_last(xa, "x")
    _require_channels_last(wa, "w")
    for vec, name in ((shift, "bias"), (sc, "scale")):
        if vec is not None:
            require(vec, name, dtypes=("float32",), ndim=1, contiguous=True)
    pads = tuple(padding) if not isinstance(padding, int) and len(padding) == 4 else _pair(padding, "padding") * 2
    attrs = FUSED_CONV.resolve(dict(
        strides=_pair(stride, "stride"), pads=pads, dilations=_pair(dilation, "dilation"), group=groups,
        activation=activation, activation_alpha=activation_alpha, activation_beta=activation_beta,
        post_activation=post_activation, post_activation_alpha=post_activation_alpha,
        post_activation_beta=post_activation_beta, input_scale=float(input_scale), output_scale=float(output_scale)))
    k, cg, kh, kw = wa.shape
    shapes = [xa.shape, (k, kh, kw, cg), None if shift is None else shift.shape, None if sc is None else sc.shape,
              None if res is None else res.shape]
    arch = device_arch(device)
    plan = plan_conv(shapes, [None if a is None else a.dtype for a in arrays], attrs, arch)
    n, _, _, _, _, p, q = plan.scalars[:7]
    out_shape = (n, k, p, q)
    if res is not None:
        _require_channels_last(res, "residual")
        if tuple(res.shape) != out_shape:
            raise ArrayError(f"residual has shape {res.shape}; the output is {out_shape}")
    y_dtype = output_dtype_conv([xa.dtype], attrs)
    if out is None:
        y = empty_like_kind(xa, (n, p, q, k), y_dtype, "out")
        result = _channels_first_view(y)
    else:
        y = _require_channels_last(require(device_array(out, "out"), "out", dtypes=(y_dtype,)), "out")
        if tuple(y.shape) != out_shape:
            raise ArrayError(f"out has shape {y.shape}; the output is {out_shape}")
        result = out
    launch(plan, arch, arrays, [y], stream=caller_stream(xa, stream), device=device)
    return result
