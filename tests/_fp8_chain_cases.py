"""FP8 producer cases (FusedConv with ``output_scale``: Y written in e4m3) shared by the compile and GPU tests, so
CI compiles what the GPU runs: every store width (OUT_VEC 8/4/2/1), X quantized in the kernel or already e4m3
(a chain's middle link), float16 and bfloat16 X, residual and post-activation before the quantization, split
groups, a 2-CTA cluster, the element gather, a float16 (not FP8) conv and the depthwise kernel as producers.
The output scales put |y| up to about 5 or 9 before saturation (the largest outputs of these random inputs);
the "saturating" case's 1.8 saturates many."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from _conv_cases import FP8_INPUT_SCALE, ConvCase
from trt_fusedattn.plugins.conv.plan import plan_conv

_FP8 = dict(scale=True, input_scale=FP8_INPUT_SCALE)
# A kernel's e4m3 output against the reference's. The kernel's y differs from the float64 y by what a float16 output
# may differ (test_conv_gpu's bounds: fp32 accumulation, y rounded to the element type before the residual add, an
# X element next to an e4m3 tie of its own quantization) and the e4m3 conversion then rounds each: an element may
# land one e4m3 step from the reference's (about 1/256 of them from float16 staging, 1/32 from bfloat16), and near
# zero, where e4m3 steps are finer than those absolute errors, several steps. So: every element within one step plus
# the float16 worst-element bound (8 x 2e-3 of the largest |y|), few elements off at all (a wrong rounding mode or
# scale puts about half of them off; measured on the H100: up to 2.06%, silu on e4m3 X with a 2-CTA cluster, whose
# many near-zero outputs flip on absolute errors), normwise close: within E4M3_NORMWISE plus what one element one step
# off at the largest |y| adds, which alone exceeds 1e-2 on the few hundred outputs of a small sample's last convs
# (H100, Model Optimizer ResNet export, 4 of 40 seeds: 0.6-1% of 512 elements one step off, normwise 0.011-0.012).
E4M3_OFF_FRACTION = {"float16": 0.05, "bfloat16": 0.12}
E4M3_NORMWISE = {"float16": 1e-2, "bfloat16": 3e-2}


def e4m3_spacing(v: np.ndarray) -> np.ndarray:
    """The e4m3 spacing at |v| (values in e4m3 units: 2^(e - 3) for normals, 2^-9 below 2^-6)."""
    big = np.abs(v)
    return np.where(big >= 2.0 ** -6, 2.0 ** (np.floor(np.log2(np.maximum(big, 2.0 ** -6))) - 3), 2.0 ** -9)


def e4m3_mismatch(got: np.ndarray, want: np.ndarray, dtype: str = "float16") -> str:
    """Why a kernel's e4m3 output (``got``, e4m3 units as float64) is not the reference's ``want`` within the rule
    above; empty when it is."""
    diff = np.abs(got - want)
    allowed = e4m3_spacing(np.maximum(np.abs(got), np.abs(want))) + 8 * 2e-3 * np.abs(want).max()
    norm = max(float(np.linalg.norm(want)), 1e-30)
    off, normwise = float((diff > 0).mean()), float(np.linalg.norm(diff)) / norm
    one_step = float(e4m3_spacing(np.abs(want).max())) / norm
    if np.isnan(got).any():
        return f"{np.isnan(got).sum()} outputs unwritten or NaN"
    if (diff > allowed).any():
        i = int(np.argmax(diff - allowed))
        return f"element {got.flat[i]} vs {want.flat[i]}: beyond one e4m3 step and the float16 bound"
    if off > E4M3_OFF_FRACTION[dtype] or normwise > E4M3_NORMWISE[dtype] + one_step:
        return f"{off:.2%} of elements off, normwise {normwise:.3g}"
    return ""


@dataclass(frozen=True)
class ProducerCase:
    """A ConvCase whose output is e4m3(y / output_scale)."""

    case: ConvCase
    output_scale: float

    @property
    def name(self) -> str:
        return f"y8_{self.case.name}"

    def attrs(self) -> dict:
        return {**self.case.attrs(), "output_scale": self.output_scale}

    def plan(self, arch: str, **overrides):
        return plan_conv(self.case.shapes(), self.case.dtypes(), self.attrs(), arch, **overrides)


PRODUCER_CASES = [ProducerCase(c, s) for c, s in [
    (ConvCase("fp8_3x3_c64_k64_17x13_saturating", 2, 64, 17, 13, 64, 3, 3, pad=1, **_FP8), 0.004),
    (ConvCase("fp8_1x1_c256_k64_residual", 2, 256, 9, 11, 64, 1, 1, residual=True, post_activation="relu", **_FP8),
     0.02),
    (ConvCase("x8_3x3_c256_k256_bk128", 2, 256, 7, 9, 256, 3, 3, pad=1, x_e4m3=True, residual=True,
              post_activation="relu", **_FP8), 0.02),
    (ConvCase("x8_3x3_s2_c512_k512_cluster", 3, 512, 7, 7, 512, 3, 3, stride=2, pad=1, x_e4m3=True,
              activation="silu", **_FP8), 0.012),
    (ConvCase("fp8_3x3_c256_k128_split", 3, 256, 7, 7, 128, 3, 3, pad=1, **_FP8), 0.012),
    (ConvCase("fp8_3x3_c64_k20_vec4", 2, 64, 9, 9, 20, 3, 3, pad=1, activation="none", **_FP8), 0.012),
    (ConvCase("fp8_3x3_c5_k6_gather_vec2", 2, 5, 9, 11, 6, 3, 3, pad=1, **_FP8), 0.012),
    (ConvCase("fp8_1x1_c48_k7_vec1", 1, 48, 9, 11, 7, 1, 1, activation="none", **_FP8), 0.012),
    (ConvCase("fp8_3x3_c64_k96_bf16", 2, 64, 9, 9, 96, 3, 3, pad=1, dtype="bfloat16", **_FP8), 0.012),
    (ConvCase("fp16_3x3_c32_k64", 2, 32, 9, 9, 64, 3, 3, pad=1), 0.012),
    (ConvCase("dw3x3_c96_clip", 2, 96, 15, 15, 96, 3, 3, pad=1, groups=96, activation="clip"), 0.012),
    (ConvCase("dw3x3_mult2_c8_k16_residual", 2, 8, 8, 8, 16, 3, 3, pad=1, groups=8, residual=True), 0.02),
]]
