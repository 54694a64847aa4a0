// Score masking and the online softmax. Each thread holds, per m16 tile, two rows (lane/4 and lane/4 + 8) and
// two adjacent columns per n8 tile; a row is spread over the 4 lanes of a quad, reduced with shuffles.
#pragma once
#include "attention_config.cuh"
#include "common/math.cuh"

#if FP8
// FP8: P is quantized as e4m3(p / p_scale) with p <= 1, so a row's reference max is its running max (threshold 0)
// and the exponent carries log2(1 / p_scale); O = v_scale * sum(e4m3(p') V) / sum(p') with p' = p / p_scale
// (the epilogue's OUTPUT_FACTOR), the contract's v_scale * p_scale * sum(e4m3(p / p_scale) V) / sum(p).
constexpr float kPScaleLog2 = P_SCALE_LOG2;
static_assert(kRescaleThreshold == 0.f, "FP8 needs RESCALE_THRESHOLD 0 (P <= 1 when quantized)");
#endif

// Where this thread's scores sit: row = row0 + mt*16 + half*8, column = col0 + nt*8 + e.
struct FragmentCoords {
  int row0;  // first query row of the thread (absolute)
  int col0;  // first key of the thread in the tile (absolute)
};

// Gemma-2's logit soft-capping of a raw Q.K score, in log2 units: cap * tanh(scale * s / cap) * log2(e), with
// tanh(y) = 1 - 2 / (1 + e^(2y)) on ex2 (accurate to ~1e-6 absolute, where tanh.approx's 2^-11 relative error times
// the cap would move fp16 outputs past their tolerance); e^(2y) = inf gives 1, 0 gives -1.
__device__ __forceinline__ float softcap_log2(float s) {
  const float e = exp2_approx(s * (2.f * kScaleLog2 / kSoftcap));
  return kSoftcap * kLog2e * (1.f - __fdividef(2.f, 1.f + e));
}

// Turn raw Q.K into softmax inputs: scale (when the mask is additive) or soft-cap, add the bias, and set masked keys to -inf.
// `check_bounds` is false for tiles wholly inside the causal and length limits (only the explicit mask applies).
// Rows are packed (query row / kPackGqa, head row % kPackGqa: mask_stride_group is the mask's head stride) with PACK_GQA.
__device__ __forceinline__ void mask_scores(float (&s)[kMAtoms][kNTiles][4], FragmentCoords c, bool check_bounds,
                                            int kv_end, int causal_offset, int len_q, const mask_t* mask_row_base,
                                            int mask_stride_q, int mask_stride_k, int mask_stride_group = 0) {
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = c.row0 + mt * 16 + half * 8;
      const int query = row / kPackGqa;
#if MASK_KIND != MASK_NONE
      const bool row_valid = query < len_q;
      const mask_t* mrow = mask_row_base + packed_row_offset(row, mask_stride_q, mask_stride_group);
#endif
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = c.col0 + nt * 8 + e;
          float& v = s[mt][nt][half * 2 + e];
          if (kHasSoftcap) v = softcap_log2(v);
          else if (kPrescale) v *= kScaleLog2;
#if MASK_KIND != MASK_NONE
          if (row_valid && col < kv_end) {
            const mask_t m = mrow[static_cast<int64_t>(col) * mask_stride_k];
#if MASK_KIND == MASK_ADDITIVE
            v += static_cast<float>(m) * kLog2e;
#else
            if (!m) v = -INFINITY;
#endif
          }
#endif
          if (check_bounds) {
            bool masked = col >= kv_end;
#if CAUSAL
            masked |= col > query + causal_offset;
#endif
            if (masked) v = -INFINITY;
          }
        }
    }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// One online-softmax step: replace the scores by p = exp2(s * scale - m * scale) for each row's reference max m,
// and keep O and the partial row sums consistent with m. m moves (rescaling O and the sums by exp2(old - new))
// only when the tile's max exceeds it by more than RESCALE_THRESHOLD (log2 units): until then p <= 2^threshold,
// harmless in fp32 sums and fp16/bf16 P, and most tiles skip the O rescale (exact: O / sum does not depend on m).
// A row with no unmasked key so far keeps m = -inf and p = 0. `rescale_o(mt, half, alpha)` is called for each row
// whose m moved: it scales that row of O now (below) or later (the wgmma overlap, while P V is still in flight).
// kBranchFree computes the move with selects (alpha = 1 where m stays): code that runs while a wgmma is in flight
// must not diverge, or ptxas waits for the wgmma before it.
template <bool kBranchFree = false, class RescaleO>
__device__ __forceinline__ void online_softmax(float (&s)[kMAtoms][kNTiles][4], float (&row_max)[kMAtoms][2],
                                               float (&row_sum)[kMAtoms][2], RescaleO&& rescale_o) {
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
        tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][half * 2], s[mt][nt][half * 2 + 1]));
      tile_max = quad_max(tile_max);
      const float old_max = row_max[mt][half];
      // false when both are -inf (NaN difference): nothing unmasked yet, nothing to move
      const bool moved = (tile_max - old_max) * kSoftmaxScale > kRescaleThreshold;
      if constexpr (kBranchFree) {
        const float alpha = exp2_approx(moved ? (old_max - tile_max) * kSoftmaxScale : 0.f);
        row_max[mt][half] = moved ? tile_max : old_max;
        row_sum[mt][half] *= alpha;
        rescale_o(mt, half, alpha);
      } else if (moved) {
        const float alpha = exp2_approx((old_max - tile_max) * kSoftmaxScale);  // 0 when old_max is -inf
        row_max[mt][half] = tile_max;
        row_sum[mt][half] *= alpha;
        rescale_o(mt, half, alpha);
      }
      const float m = row_max[mt][half];
      float base = m == -INFINITY ? 0.f : m * kSoftmaxScale;
#if FP8
      base -= kPScaleLog2;  // p / p_scale, the value P's e4m3 rounding takes (p <= 1 here)
#endif
      float sum = row_sum[mt][half];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
#if FP8
          // every EXP2_FMA_EVERY-th n8 block on the FP32 pipe (exp2_fma), the rest on MUFU: the per-warp softmax
          // latency is MUFU-bound in FP8 (NOTES.md); 0 = all on MUFU
          const float arg = fmaf(s[mt][nt][half * 2 + e], kSoftmaxScale, -base);
          const float p = EXP2_FMA_EVERY > 0 && nt % (EXP2_FMA_EVERY > 0 ? EXP2_FMA_EVERY : 1) == EXP2_FMA_EVERY - 1
                              ? exp2_fma(arg) : exp2_approx(arg);
#else
          const float p = exp2_approx(fmaf(s[mt][nt][half * 2 + e], kSoftmaxScale, -base));
#endif
          s[mt][nt][half * 2 + e] = p;
          sum += p;
        }
      row_sum[mt][half] = sum;
    }
}

// Scales row (mt, half) of this thread's O fragment by alpha.
__device__ __forceinline__ void rescale_output_row(float (&o)[kMAtoms][kDTiles][4], int mt, int half, float alpha) {
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
    o[mt][dt][half * 2] *= alpha;
    o[mt][dt][half * 2 + 1] *= alpha;
  }
}

// The online softmax step with O rescaled at once.
__device__ __forceinline__ void online_softmax(float (&s)[kMAtoms][kNTiles][4], float (&row_max)[kMAtoms][2],
                                               float (&row_sum)[kMAtoms][2], float (&o)[kMAtoms][kDTiles][4]) {
  online_softmax(s, row_max, row_sum, [&](int mt, int half, float alpha) { rescale_output_row(o, mt, half, alpha); });
}
