// FusedConv for depthwise convolution (GROUPS == C, one input channel per group, CH_MULT = K / C outputs each):
// a direct kernel, since an implicit GEMM with a reduction of KH*KW would leave the tensor cores idle.
//
// A block covers CHUNKS channel chunks of DW_VEC channels times (256 / CHUNKS) output pixels; one thread computes
// one pixel's DW_VEC channels with DW_VEC-wide NHWC loads (coalesced along channels), its block's filter taps held
// in shared memory as float [KH*KW][CHUNKS*DW_VEC]. The epilogue is epilogue.cuh's, as in the implicit GEMM.
//
// Compile-time: DTYPE_BF16, KH, KW, STRIDE_H, STRIDE_W, DIL_H, DIL_W, CH_MULT, DW_VEC (DW_VEC > 1 needs
// CH_MULT == 1), CHUNKS, and the epilogue's defines (OUTPUT_E4M3: y in e4m3 for an FP8 consumer).
// Arguments (AOT plugin ABI): x [N,H,W,C], w [K,KH,KW,1], shift?, scale?, residual? [N,P,Q,K];
// int32 N, H, W, C, K, P, Q, pad_h, pad_w, x_stride (X's pixel stride: C, or C padded to 8 in TensorRT's HWC8);
// y [N,P,Q,K] (OUTPUT_E4M3: e4m3).
#include "common/element.cuh"
#include "fast_divmod.cuh"
#include "epilogue.cuh"

constexpr int kThreads = 256;
constexpr int kTaps = KH * KW;
constexpr int kChannels = CHUNKS * DW_VEC;     // channels per block
constexpr int kPixels = kThreads / CHUNKS;     // output pixels per block
static_assert(kThreads % CHUNKS == 0, "CHUNKS divides 256");
static_assert(DW_VEC == 1 || CH_MULT == 1, "vector loads need one output channel per input channel");

extern "C" __global__ void __launch_bounds__(kThreads)
fused_conv_depthwise(const elem_t* __restrict__ x, const elem_t* __restrict__ w SHIFT_PARAM SCALE_PARAM
                     RESIDUAL_PARAM, int N, int H, int W, int C, int K, int P, int Q, int pad_h, int pad_w,
                     int x_stride, out_t* __restrict__ y) {
  __shared__ float taps[kTaps * kChannels];
  const int tid = threadIdx.x;
  const int k_block = blockIdx.y * kChannels;
  for (int i = tid; i < kTaps * kChannels; i += kThreads) {
    const int ch = i / kTaps, tap = i - (i / kTaps) * kTaps;
    taps[tap * kChannels + ch] = k_block + ch < K ? to_float(w[(k_block + ch) * kTaps + tap]) : 0.f;
  }
  __syncthreads();

  const int chunk = tid % CHUNKS;
  const int m = blockIdx.x * kPixels + tid / CHUNKS;
  const int k = k_block + chunk * DW_VEC;
  if (m >= N * P * Q || k >= K) return;
  const FastDivmod pq_div(P * Q), q_div(Q);
  int pq, q;
  const int n = pq_div.divmod(m, &pq);
  const int p = q_div.divmod(pq, &q);
  const int h0 = p * STRIDE_H - pad_h, w0 = q * STRIDE_W - pad_w;
  const int channel = CH_MULT == 1 ? k : k / CH_MULT;
  const elem_t* x_pixel = x + (n * H) * W * x_stride + channel;

  float acc[DW_VEC];
#pragma unroll
  for (int e = 0; e < DW_VEC; ++e) acc[e] = 0.f;
#pragma unroll
  for (int r = 0; r < KH; ++r) {
    const int h = h0 + r * DIL_H;
    if (unsigned(h) >= unsigned(H)) continue;
#pragma unroll
    for (int s = 0; s < KW; ++s) {
      const int wi = w0 + s * DIL_W;
      if (unsigned(wi) >= unsigned(W)) continue;
      ElemVec<DW_VEC> in;
      in.bits = __ldg(reinterpret_cast<const typename VecBits<DW_VEC>::type*>(x_pixel + (h * W + wi) * x_stride));
      const float* tap = taps + (r * KW + s) * kChannels + chunk * DW_VEC;
#pragma unroll
      for (int e = 0; e < DW_VEC; ++e) acc[e] = fmaf(to_float(in.e[e]), tap[e], acc[e]);
    }
  }

  const ChannelAffine affine{SCALE_ARG, SHIFT_ARG};
  float v[DW_VEC];
#pragma unroll
  for (int e = 0; e < DW_VEC; ++e) v[e] = affine.apply(acc[e], k + e);
  const long long offset = (long long)m * K + k;
  ElemVec<DW_VEC> res;
#if HAS_RESIDUAL
  res = load_vec<DW_VEC>(residual, offset);
#endif
  store_output<DW_VEC>(v, res, y, offset);
}
