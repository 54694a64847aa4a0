// FP8 (FP8 = 1, sm_89+) with float16/bfloat16 X: X is quantized to e4m3 on its way into shared memory
// (x * INPUT_SCALE_INV, saturating round-to-nearest-even: the contract's e4m3(X / input_scale)). With 16-byte loads
// (IN_VEC = 8) the A tile lands as elem_t by cp.async in its pipeline stage and is quantized once per CTA into a ring
// of e4m3 A tiles, one tile ahead of the MMAs (quantize_a_tile); with the element gather the registers are quantized
// when stored (a_operand8, implicit_gemm_load.cuh). X_E4M3 = 1 (X already e4m3) needs neither.
#pragma once
#include "implicit_gemm_config.cuh"

#if FP8
// e4m3(x * INPUT_SCALE_INV) of 4 values, packed low byte first (saturating, round-to-nearest-even).
__device__ __forceinline__ unsigned quantize4(float x0, float x1, float x2, float x3) {
  const float inv = float(INPUT_SCALE_INV);
  const unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(x0 * inv, x1 * inv), __NV_SATFINITE, __NV_E4M3);
  const unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(x2 * inv, x3 * inv), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// 4 elements packed in two elem2_t words -> 4 e4m3 bytes.
__device__ __forceinline__ unsigned quantize4(unsigned lo2, unsigned hi2) {
  const float2 a = elem2_to_float2(lo2), b = elem2_to_float2(hi2);
  return quantize4(a.x, a.y, b.x, b.y);
}

// One stage's elem_t A tile (swizzled, 2 * kChunks chunks per row) -> an e4m3 A tile (kChunks per row).
__device__ __forceinline__ void quantize_a_tile(unsigned char* dst, const unsigned char* src, int group_tid) {
  constexpr int kSrcChunks = 2 * kChunks;
  static_assert(BLOCK_M * kChunks % kGroupThreads == 0, "quantize pass must tile evenly");
#pragma unroll
  for (int j = 0; j < BLOCK_M * kChunks / kGroupThreads; ++j) {
    const int i = group_tid + j * kGroupThreads, row = i / kChunks, chunk = i % kChunks;
    const uint4 lo = *reinterpret_cast<const uint4*>(src + smem_offset<kSrcChunks>(row, chunk * 32));
    const uint4 hi = *reinterpret_cast<const uint4*>(src + smem_offset<kSrcChunks>(row, chunk * 32 + 16));
    uint4 q;
    q.x = quantize4(lo.x, lo.y); q.y = quantize4(lo.z, lo.w);
    q.z = quantize4(hi.x, hi.y); q.w = quantize4(hi.z, hi.w);
    *reinterpret_cast<uint4*>(dst + smem_offset<kChunks>(row, chunk * 16)) = q;
  }
}
#endif
