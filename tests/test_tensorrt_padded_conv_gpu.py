"""FusedConv as a TensorRT engine runs it on an HWC8 input whose channels are padded (a 3-channel stem, any
C % 8 != 0): the plan TensorRT gets (``formats=``) passes the padded pixel stride as a scalar, and the kernel
must read only the C real channels of each pixel. The padding lanes hold NaN here, so any read of them shows;
the output is poisoned with NaN first and compared with the float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.plugins.conv.plan import plan_conv

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

# (name, dtype, N, C, H, W, K, kernel, stride, pad, group, residual)
CASES = [
    ("stem7x7", "float16", 2, 3, 23, 29, 64, 7, 2, 3, 1, False),
    ("stem3x3_bf16", "bfloat16", 3, 3, 17, 16, 32, 3, 1, 1, 1, True),
    ("c12_1x1", "float16", 2, 12, 9, 13, 24, 1, 1, 0, 1, False),
    ("grouped_c20", "float16", 1, 20, 11, 7, 40, 3, 1, 1, 2, False),
    ("depthwise_c12_mult2", "bfloat16", 2, 12, 15, 15, 24, 3, 2, 1, 12, False),  # Y needs K % 8 == 0 under HWC8
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_padded_hwc8_input_reads_only_real_channels(case):
    from trt_fusedattn.launcher.launch import device_arch, launch
    name, dtype, n, c, h, w, k, kernel, stride, pad, group, residual = case
    arch = device_arch(0)
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(hash(name) % 2**31)
    attrs = FUSED_CONV.resolve({"strides": [stride] * 2, "pads": [pad] * 4, "group": group, "activation": "relu",
                                "post_activation": "none"})
    p = (h + 2 * pad - kernel) // stride + 1
    q = (w + 2 * pad - kernel) // stride + 1
    padded = -(-c // 8) * 8
    x = torch.randn(n, h, w, c, device="cuda", generator=gen).to(torch_dtype)
    x_hwc8 = torch.full((n, h, w, padded), float("nan"), device="cuda", dtype=torch_dtype)
    x_hwc8[..., :c] = x
    weights = (torch.randn(k, kernel, kernel, c // group, device="cuda", generator=gen) * 0.2).to(torch_dtype)
    shift = torch.randn(k, device="cuda", generator=gen)
    res = torch.randn(n, p, q, k, device="cuda", generator=gen).to(torch_dtype) if residual else None
    y = torch.full((n, p, q, k), float("nan"), device="cuda", dtype=torch_dtype)
    shapes = [(n, c, h, w), tuple(weights.shape), (k,), None, (n, k, p, q) if residual else None]
    dtypes = [dtype, dtype, "float32", None, dtype if residual else None]
    formats = ("HWC8", "LINEAR", "LINEAR", None, "HWC8" if residual else None, "HWC8")
    plan = plan_conv(shapes, dtypes, attrs, arch, formats=formats)
    inputs = [x_hwc8, weights, shift] + ([res] if residual else [])
    launch(plan, arch, [t.data_ptr() for t in inputs], [y.data_ptr()])
    torch.cuda.synchronize()

    as_numpy = lambda t: t.float().cpu().numpy()  # noqa: E731
    expected = FUSED_CONV.reference(as_numpy(x).transpose(0, 3, 1, 2), as_numpy(weights), as_numpy(shift), None,
                                    None if res is None else as_numpy(res).transpose(0, 3, 1, 2),
                                    **attrs)
    got = as_numpy(y).transpose(0, 3, 1, 2)
    assert np.isfinite(got).all(), "a padding lane (NaN) was read, or an output was not written"
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error < (2e-3 if dtype == "float16" else 1.2e-2), error
