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
# A kernel rounds y to its element type in the staged output tile before the residual add and the e4m3 conversion
# (as for a float16 Y); the reference converts the float64 y. Where that first rounding lands y on an e4m3 rounding
# midpoint, the two differ by one e4m3 step: about 1/256 of the elements with float16 staging, 1/32 with bfloat16.
E4M3_STEP_FRACTION = {"float16": 0.02, "bfloat16": 0.08}


def e4m3_steps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the e4m3 spacing at the larger of the two (both in e4m3 units, no scale)."""
    big = np.maximum(np.abs(got), np.abs(want))
    spacing = np.where(big >= 2.0 ** -6, 2.0 ** (np.floor(np.log2(np.maximum(big, 2.0 ** -6))) - 3), 2.0 ** -9)
    return np.abs(got - want) / spacing


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
