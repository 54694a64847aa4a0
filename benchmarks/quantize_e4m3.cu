// A standalone QuantizeLinear to e4m3 (what an FP8 deployment runs between two layers when the producer writes
// float16): y = e4m3(x * SCALE_INV), saturating, round-to-nearest-even, 8 float16 in (16 bytes) -> 8 bytes out per
// thread. The benchmark's "separate quantize" pass (benchmarks/conv_fp8_chain.py); memory-bound by design.
// Compile-time: SCALE_INV. Arguments: x [n8 * 8] float16, int32 n8, y [n8 * 8] e4m3.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

extern "C" __global__ void __launch_bounds__(256) quantize_e4m3(const uint4* __restrict__ x, int n8,
                                                                 uint2* __restrict__ y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const uint4 v = __ldg(x + i);
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
  unsigned short pairs[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[j]));
    pairs[j] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * float(SCALE_INV), f.y * float(SCALE_INV)), __NV_SATFINITE,
                                        __NV_E4M3);
  }
  y[i] = make_uint2(pairs[0] | (unsigned(pairs[1]) << 16), pairs[2] | (unsigned(pairs[3]) << 16));
}
