// Approximate transcendental PTX the kernels use in their inner loops.
#pragma once

// 2^x, flushing subnormals (ex2.approx.ftz: one MUFU op; softmax runs on exp2 with log2(e) folded into the scale).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FP32 pipe instead of MUFU (FlashAttention-4's trick; MUFU.EX2 does 16 a clock per SM, the FP32 pipe 128
// lanes): x = j + f with j = round(x) (adding 1.5 * 2^23 leaves j in the low mantissa bits), 2^f on [-0.5, 0.5] by a
// degree-3 polynomial (relative error <= 1.02e-4), j added to the exponent field. x < -125 (and -inf) gives 0.
__device__ __forceinline__ float exp2_fma(float x) {
  const float r = fmaxf(x, -125.f) + 12582912.f;
  const float f = fmaxf(x, -125.f) - (r - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.055008893f, f, 0.242210996f), f, 0.693282938f), f, 1.f);
  const float y = __int_as_float(__float_as_int(p) + (__float_as_int(r) << 23));
  return x < -125.f ? 0.f : y;
}
