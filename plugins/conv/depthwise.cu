// FusedConv for depthwise convolution (GROUPS == C, one input channel per group, CH_MULT = K / C outputs each):
// a direct kernel, since an implicit GEMM with a reduction of KH*KW would leave the tensor cores idle.
//
// A block covers CHUNKS channel chunks of DW_VEC channels times DW_PIX * (256 / CHUNKS) output pixels; one thread
// computes DW_PIX pixels' DW_VEC channels (pixels 256 / CHUNKS apart, so that each load instruction stays coalesced
// along channels over consecutive pixels) with DW_VEC-wide NHWC loads, its block's filter taps held in shared memory
// as float [KH*KW][CHUNKS*DW_VEC] and read once per tap for all its pixels. More pixels per block re-read fewer
// halo rows of X from L2 (a block of 32 pixels at 28x28 reads ~3 input rows per output row; L2 was the busiest unit,
// 66%, in the ncu of dw 144 @56 b32). The epilogue is epilogue.cuh's, as in the implicit GEMM.
//
// Compile-time: DTYPE_BF16, KH, KW, STRIDE_H, STRIDE_W, DIL_H, DIL_W, CH_MULT, DW_VEC (DW_VEC > 1 needs
// CH_MULT == 1), CHUNKS, DW_PIX, and the epilogue's defines (OUTPUT_E4M3: y in e4m3 for an FP8 consumer).
// Arguments (AOT plugin ABI): x [N,H,W,C], w [K,KH,KW,1], shift?, scale?, residual? [N,P,Q,K];
// int32 N, H, W, C, K, P, Q, pad_h, pad_w, x_stride (X's pixel stride: C, or C padded to 8 in TensorRT's HWC8);
// y [N,P,Q,K] (OUTPUT_E4M3: e4m3).
#include "common/element.cuh"
#include "fast_divmod.cuh"
#include "epilogue.cuh"

constexpr int kThreads = 256;
constexpr int kTaps = KH * KW;
constexpr int kChannels = CHUNKS * DW_VEC;     // channels per block
constexpr int kPassPixels = kThreads / CHUNKS;  // output pixels the block's threads cover at once (CHUNKS not
                                                // dividing 256: the last kThreads % CHUNKS threads only load taps)
constexpr int kPixels = kPassPixels * DW_PIX;  // output pixels per block
static_assert(CHUNKS <= kThreads, "a block covers at least one pixel");
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
  const int k = k_block + chunk * DW_VEC;
  const int M = N * P * Q, m_first = blockIdx.x * kPixels + tid / CHUNKS;
  const WarpDivmods<2> divisors({P * Q, Q});  // by the whole warp, before any lane leaves
  const FastDivmod &pq_div = divisors.at[0], &q_div = divisors.at[1];
  if (tid >= kPassPixels * CHUNKS || m_first >= M || k >= K) return;
  const int channel = CH_MULT == 1 ? k : k / CH_MULT;
  // Pixel j: m_first + j * kPassPixels; one past M computes pixel M - 1 again and stores nothing.
  int x_image[DW_PIX], h0[DW_PIX], w0[DW_PIX];
#pragma unroll
  for (int j = 0; j < DW_PIX; ++j) {
    int pq, q;
    const int n = pq_div.divmod(min(m_first + j * kPassPixels, M - 1), &pq);
    const int p = q_div.divmod(pq, &q);
    h0[j] = p * STRIDE_H - pad_h;
    w0[j] = q * STRIDE_W - pad_w;
    x_image[j] = n * H * W * x_stride + channel;  // tensors hold < 2^31 elements
  }

  float acc[DW_PIX][DW_VEC];
#pragma unroll
  for (int j = 0; j < DW_PIX; ++j)
#pragma unroll
    for (int e = 0; e < DW_VEC; ++e) acc[j][e] = 0.f;
#pragma unroll
  for (int r = 0; r < KH; ++r)
#pragma unroll
    for (int s = 0; s < KW; ++s) {
      float tap[DW_VEC];
#pragma unroll
      for (int e = 0; e < DW_VEC; ++e) tap[e] = taps[(r * KW + s) * kChannels + chunk * DW_VEC + e];
#pragma unroll
      for (int j = 0; j < DW_PIX; ++j) {
        const int h = h0[j] + r * DIL_H, wi = w0[j] + s * DIL_W;
        if (unsigned(h) >= unsigned(H) || unsigned(wi) >= unsigned(W)) continue;
        ElemVec<DW_VEC> in;
        in.bits = __ldg(reinterpret_cast<const typename VecBits<DW_VEC>::type*>(x + x_image[j] + (h * W + wi) * x_stride));
#pragma unroll
        for (int e = 0; e < DW_VEC; ++e) acc[j][e] = fmaf(to_float(in.e[e]), tap[e], acc[j][e]);
      }
    }

  const ChannelAffine affine{SCALE_ARG, SHIFT_ARG};
#pragma unroll
  for (int j = 0; j < DW_PIX; ++j) {
    const int m = m_first + j * kPassPixels;
    if (m >= M) continue;
    float v[DW_VEC];
#pragma unroll
    for (int e = 0; e < DW_VEC; ++e) v[e] = affine.apply(acc[j][e], k + e);
    const long long offset = (long long)m * K + k;
    ElemVec<DW_VEC> res;
#if HAS_RESIDUAL
    res = load_vec<DW_VEC>(residual, offset);
#endif
    store_output<DW_VEC>(v, res, y, offset);
  }
}
