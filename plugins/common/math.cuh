// Approximate transcendental PTX the kernels use in their inner loops.
#pragma once

// 2^x, flushing subnormals (ex2.approx.ftz: one MUFU op; softmax runs on exp2 with log2(e) folded into the scale).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
