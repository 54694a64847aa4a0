// The element type of a specialization (DTYPE_BF16 = 0: float16, 1: bfloat16), its conversions, and VEC elements
// moved as one access.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#if DTYPE_BF16
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ float to_float(elem_t v) { return __bfloat162float(v); }
__device__ __forceinline__ elem_t from_float(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ elem2_t pack2(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
__device__ __forceinline__ float2 elem2_to_float2(unsigned bits) {
  return __bfloat1622float2(*reinterpret_cast<const elem2_t*>(&bits));
}
#else
typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ float to_float(elem_t v) { return __half2float(v); }
__device__ __forceinline__ elem_t from_float(float v) { return __float2half_rn(v); }
__device__ __forceinline__ elem2_t pack2(float lo, float hi) { return __floats2half2_rn(lo, hi); }
__device__ __forceinline__ float2 elem2_to_float2(unsigned bits) {
  return __half22float2(*reinterpret_cast<const elem2_t*>(&bits));
}
#endif

// Two floats rounded to one packed register of the element type (the A operand layout of mma).
__device__ __forceinline__ uint32_t pack_elem2(float lo, float hi) {
  elem2_t v = pack2(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// VEC consecutive elements moved as one 16/8/4/2-byte access.
template <int VEC> struct VecBits;
template <> struct VecBits<8> { typedef uint4 type; };
template <> struct VecBits<4> { typedef uint2 type; };
template <> struct VecBits<2> { typedef unsigned type; };
template <> struct VecBits<1> { typedef unsigned short type; };

template <int VEC>
struct ElemVec {
  union { typename VecBits<VEC>::type bits; elem_t e[VEC]; };
};
