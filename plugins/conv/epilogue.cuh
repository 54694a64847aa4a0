// The FusedConv epilogue, shared by the implicit-GEMM and depthwise kernels: per-output-channel scale and shift,
// activation, residual add, activation after the add. The activation structs are named exactly as the contract's
// ACTIVATIONS keys, so the plan passes the attribute string straight through as -DACTIVATION=<name>.
//
// Compile-time inputs: ACTIVATION, ACTIVATION_ALPHA, ACTIVATION_BETA, POST_ACTIVATION, POST_ACTIVATION_ALPHA,
// POST_ACTIVATION_BETA, HAS_SHIFT, HAS_SCALE, HAS_RESIDUAL; INPUT_SCALE (FP8 only); OUTPUT_E4M3 with
// OUTPUT_SCALE_INV (an FP8 producer: Y written as e4m3(y * OUTPUT_SCALE_INV) bytes for FP8 consumers).
#pragma once
#include "common/element.cuh"
#ifndef OUTPUT_E4M3
#define OUTPUT_E4M3 0
#endif
#if OUTPUT_E4M3
#include <cuda_fp8.h>
typedef unsigned char out_t;  // Y in global memory: e4m3 bytes, what an FP8 consumer's X_E4M3 path reads
#else
typedef elem_t out_t;
#endif

namespace act {
struct none { static __device__ __forceinline__ float apply(float x, float, float) { return x; } };
struct relu { static __device__ __forceinline__ float apply(float x, float, float) { return fmaxf(x, 0.f); } };
struct clip {
  static __device__ __forceinline__ float apply(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
};
struct leaky_relu {
  static __device__ __forceinline__ float apply(float x, float a, float) { return x >= 0.f ? x : a * x; }
};
struct sigmoid {
  static __device__ __forceinline__ float apply(float x, float, float) { return 1.f / (1.f + __expf(-x)); }
};
struct silu {
  static __device__ __forceinline__ float apply(float x, float, float) { return x / (1.f + __expf(-x)); }
};
struct hard_sigmoid {
  static __device__ __forceinline__ float apply(float x, float a, float b) {
    return fminf(fmaxf(a * x + b, 0.f), 1.f);
  }
};
struct hard_swish {
  static __device__ __forceinline__ float apply(float x, float, float) {
    return x * fminf(fmaxf(x * (1.f / 6.f) + 0.5f, 0.f), 1.f);
  }
};
struct gelu {
  static __device__ __forceinline__ float apply(float x, float, float) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  }
};
struct gelu_tanh {
  static __device__ __forceinline__ float apply(float x, float, float) {
    return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
};
struct tanh { static __device__ __forceinline__ float apply(float x, float, float) { return tanhf(x); } };
}  // namespace act

// The optional per-channel inputs as kernel parameters, in contract order (shift, scale, residual).
#if HAS_SHIFT
#define SHIFT_PARAM , const float* __restrict__ shift
#define SHIFT_ARG shift
#else
#define SHIFT_PARAM
#define SHIFT_ARG nullptr
#endif
#if HAS_SCALE
#define SCALE_PARAM , const float* __restrict__ scale
#define SCALE_ARG scale
#else
#define SCALE_PARAM
#define SCALE_ARG nullptr
#endif
#if HAS_RESIDUAL
#define RESIDUAL_PARAM , const elem_t* __restrict__ residual
#define RESIDUAL_ARG residual
#else
#define RESIDUAL_PARAM
#define RESIDUAL_ARG nullptr
#endif

// One output channel's affine: y = act(acc * INPUT_SCALE * scale + shift) (FP8 kernels define INPUT_SCALE, the
// per-tensor scale of X; absent inputs are 1 and 0).
struct ColumnAffine {
  float scale, shift;
  __device__ __forceinline__ float apply(float acc) const {
#ifdef INPUT_SCALE
    acc *= float(INPUT_SCALE);
#endif
    return act::ACTIVATION::apply(fmaf(acc, scale, shift), float(ACTIVATION_ALPHA), float(ACTIVATION_BETA));
  }
};

// y = act(acc * scale[ch] + shift[ch]) by channel; absent inputs are compiled out. at() reads a channel's pair once,
// for every accumulator of that channel: a store through a generic pointer between two __ldg of one address keeps the
// compiler from merging them (the implicit-GEMM output pass loaded each pair 4x: 128 loads a thread on 256x64 tiles).
struct ChannelAffine {
  const float* scale_ptr;
  const float* shift_ptr;

  __device__ __forceinline__ ColumnAffine at(int ch) const {
    ColumnAffine a{1.f, 0.f};
#if HAS_SCALE
    a.scale = __ldg(scale_ptr + ch);
#endif
#if HAS_SHIFT
    a.shift = __ldg(shift_ptr + ch);
#endif
    return a;
  }
  __device__ __forceinline__ float apply(float acc, int ch) const { return at(ch).apply(acc); }
};

// post_act(y + residual): only called when HAS_RESIDUAL.
__device__ __forceinline__ float add_residual(float y, float res) {
  return act::POST_ACTIVATION::apply(y + res, float(POST_ACTIVATION_ALPHA), float(POST_ACTIVATION_BETA));
}

// VEC consecutive elements at element offset `offset` (the residual), read once through the read-only path.
template <int VEC>
__device__ __forceinline__ ElemVec<VEC> load_vec(const elem_t* __restrict__ p, long long offset) {
  ElemVec<VEC> v;
  v.bits = __ldg(reinterpret_cast<const typename VecBits<VEC>::type*>(p + offset));
  return v;
}

// The residual's VEC channels at `offset` into `res` (HAS_RESIDUAL; nothing to read otherwise).
template <int VEC>
__device__ __forceinline__ void load_residual(ElemVec<VEC>& res, const elem_t* __restrict__ residual,
                                              long long offset) {
#if HAS_RESIDUAL
  res = load_vec<VEC>(residual, offset);
#endif
}

#if OUTPUT_E4M3
// VEC e4m3 bytes moved as one access (VEC = 8, 4, 2, 1: 8/4/2/1 bytes).
template <int VEC> struct ByteBits;
template <> struct ByteBits<8> { typedef uint2 type; };
template <> struct ByteBits<4> { typedef unsigned type; };
template <> struct ByteBits<2> { typedef unsigned short type; };
template <> struct ByteBits<1> { typedef unsigned char type; };

// e4m3(v * OUTPUT_SCALE_INV) of VEC values, packed low byte first (saturating, round-to-nearest-even: the
// contract's e4m3(y / output_scale)), stored as one VEC-byte access.
template <int VEC>
__device__ __forceinline__ void store_e4m3(const float (&v)[VEC], unsigned char* __restrict__ y, long long offset) {
  const float inv = float(OUTPUT_SCALE_INV);
  if constexpr (VEC == 1) {
    *(y + offset) = __nv_cvt_float_to_fp8(v[0] * inv, __NV_SATFINITE, __NV_E4M3);
  } else {
    union { typename ByteBits<VEC>::type bits; unsigned short pair[VEC / 2]; } out;
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i)
      out.pair[i] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i] * inv, v[2 * i + 1] * inv), __NV_SATFINITE,
                                             __NV_E4M3);
    *reinterpret_cast<typename ByteBits<VEC>::type*>(y + offset) = out.bits;
  }
}
#endif

// Finish VEC consecutive output channels of one pixel from their activated values: residual add and
// post-activation (when HAS_RESIDUAL; `res` is ignored otherwise), rounding (to elem_t, or to e4m3 with
// OUTPUT_E4M3), one VEC-wide store at `offset`.
template <int VEC>
__device__ __forceinline__ void store_output(const float (&v)[VEC], const ElemVec<VEC>& res, out_t* __restrict__ y,
                                             long long offset) {
  float done[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
#if HAS_RESIDUAL
    done[i] = add_residual(v[i], to_float(res.e[i]));
#else
    done[i] = v[i];
#endif
  }
#if OUTPUT_E4M3
  store_e4m3<VEC>(done, y, offset);
#else
  ElemVec<VEC> out;
#pragma unroll
  for (int i = 0; i < VEC; ++i) out.e[i] = from_float(done[i]);
  *reinterpret_cast<typename VecBits<VEC>::type*>(y + offset) = out.bits;
#endif
}
