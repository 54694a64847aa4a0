"""FP8 producer cases (FusedConv with ``output_scale``: Y written in e4m3) shared by the compile and GPU tests, so
CI compiles what the GPU runs: every store width (OUT_VEC 8/4/2/1), X quantized in the kernel or already e4m3
(a chain's middle link), float16 and bfloat16 X, residual and post-activation before the quantization, split
groups, a 2-CTA cluster, the element gather, a float16 (not FP8) conv and the depthwise kernel as producers.
The output scales (|y| up to about 5 or 9 before saturating) saturate the largest outputs of these random
inputs, so saturation runs."""
from __future__ import annotations

from dataclasses import dataclass

from _conv_cases import FP8_INPUT_SCALE, ConvCase
from trt_fusedattn.plugins.conv.plan import plan_conv

_FP8 = dict(scale=True, input_scale=FP8_INPUT_SCALE)


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
    (ConvCase("fp8_3x3_c64_k64_17x13", 2, 64, 17, 13, 64, 3, 3, pad=1, **_FP8), 0.012),
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
