// FP8 E4M3 (float8e4m3fn) conversions the kernels use in their inner loops (sm_89+): floats rounded to nearest even
// and saturated at +-448 (cvt.rn.satfinite, the contracts' e4m3() and ml_dtypes' rounding), packed low byte first.
#pragma once
#include <stdint.h>

// e4m3(lo) in bits 0-7, e4m3(hi) in bits 8-15 (the cvt's second source goes to the low byte).
__device__ __forceinline__ uint16_t pack_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(r) : "f"(lo), "f"(hi));
  return r;
}

// Four floats as four e4m3 bytes, x0 in the lowest.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint32_t r;
  asm("mov.b32 %0, {%1, %2};\n" : "=r"(r) : "h"(pack_e4m3x2(x0, x1)), "h"(pack_e4m3x2(x2, x3)));
  return r;
}
