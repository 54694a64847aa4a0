// The output pass of the implicit-GEMM kernels (implicit_gemm.cu, implicit_gemm_sm90.cu), on the accumulators of one
// BLOCK_M x BLOCK_N tile: scale, shift and activation (epilogue.cuh) rounded into a padded shared-memory tile
// (stage_accumulators), then OUT_VEC-wide residual loads, residual add, post-activation and stores
// (store_staged_tile). Staging makes the residual reads and the output stores OUT_VEC wide whatever the MMA fragment
// layout; the kernels put their own barrier between the two steps.
#pragma once
#include "epilogue.cuh"
#include "implicit_gemm_config.cuh"
#include "implicit_gemm_reduction.cuh"

// A channel's scale and shift read once for all of a thread's accumulators of that channel (ChannelAffine::at) on the
// unspecialized wgmma loop's fragments, where the output pass is a large share of a short CTA's instructions (b32 3x3
// 64 @56: 878 of 1536); the other kernels read them per accumulator as before: the once-read pairs spilled 36-40 bytes
// on the warp-specialized 192x128 / 256x128 tiles at their register caps, 8 on sm_89's mma.sync FP8 producer tiles.
constexpr bool kColumnOnce = WGMMA && !WARP_SPECIALIZED;

// The accumulators of the warp whose fragment rows start at row_base (columns at col_base), activated, into `tile`
// (kCStride elements per row). Columns past Kg hold zeros.
__device__ __forceinline__ void stage_accumulators(const float (&acc)[kMI][kNI][4], elem_t* tile, int row_base,
                                                   int col_base, int lane, int n0, int Kg, int channel0,
                                                   const ChannelAffine& affine) {
#pragma unroll
  for (int ni = 0; ni < kNI; ++ni) {
    const int col = col_base + ni * 8 + (lane & 3) * 2;
    const bool ok0 = n0 + col < Kg, ok1 = n0 + col + 1 < Kg;
    // Columns past Kg read the last channel's pair (loads without a predicate) and are zeroed below.
    const auto column = [&](int c) { return affine.at(channel0 + min(c, Kg - 1 - n0)); };
    const ColumnAffine a0 = column(col), a1 = column(col + 1);
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row_base + mi * kRowsPerMI + (lane >> 2) + half * 8;
        const float x0 = acc[mi][ni][half * 2], x1 = acc[mi][ni][half * 2 + 1];
        const float v0 = ok0 ? (kColumnOnce ? a0.apply(x0) : affine.apply(x0, channel0 + col)) : 0.f;
        const float v1 = ok1 ? (kColumnOnce ? a1.apply(x1) : affine.apply(x1, channel0 + col + 1)) : 0.f;
        *reinterpret_cast<elem2_t*>(tile + row * kCStride + col) = pack2(v0, v1);
      }
  }
}

// Without a residual (nor its post-activation) and with an elem_t output, the staged tile holds the output as stored.
constexpr bool kStagedIsOutput = !HAS_RESIDUAL && !OUTPUT_E4M3;

// The staged tile's rows [rows.begin, rows.end) (at most kRows of them: a cluster rank's share, or the whole tile) to
// y [M, K] (rows m0.., channels channel0 + n0..), by kPassThreads threads (pass_tid: this thread's index among them),
// in batches of kBatch vectors per thread: all residual loads of a batch are in flight at once.
template <int kPassThreads, int kRows>
__device__ __forceinline__ void store_staged_tile(const elem_t* tile, int pass_tid, TileRows rows, int m0, int n0,
                                                  int M, int Kg, int K, int channel0,
                                                  const elem_t* __restrict__ residual, out_t* __restrict__ y) {
  constexpr int kVecsPerRow = BLOCK_N / OUT_VEC;
  constexpr int kPasses = (kRows * kVecsPerRow + kPassThreads - 1) / kPassThreads;
  constexpr int kBatch = kPasses < 8 ? kPasses : 8;
  constexpr int kIters = (kPasses + kBatch - 1) / kBatch * kBatch;
  // Without a cluster every index is a row of the tile: no row test (the unclustered kernels' code as before it).
  constexpr bool kEveryRow = kRows == BLOCK_M && kIters * kPassThreads == kRows * kVecsPerRow;
#pragma unroll 1
  for (int b = 0; b < kIters; b += kBatch) {
    ElemVec<OUT_VEC> res[kBatch];
    long long offset[kBatch];
    bool ok[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int idx = pass_tid + (b + j) * kPassThreads;
      const int row = rows.begin + idx / kVecsPerRow, col = (idx % kVecsPerRow) * OUT_VEC;
      ok[j] = (kEveryRow || row < rows.end) && m0 + row < M && n0 + col < Kg;
      offset[j] = (long long)(m0 + row) * K + channel0 + col;
      if (ok[j]) load_residual<OUT_VEC>(res[j], residual, offset[j]);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!ok[j]) continue;
      const int idx = pass_tid + (b + j) * kPassThreads;
      const int row = rows.begin + idx / kVecsPerRow, col = (idx % kVecsPerRow) * OUT_VEC;
      ElemVec<OUT_VEC> staged;
      staged.bits = *reinterpret_cast<const typename VecBits<OUT_VEC>::type*>(tile + row * kCStride + col);
      if constexpr (kStagedIsOutput) {  // the staged elements are the output's: no float round trip
        *reinterpret_cast<typename VecBits<OUT_VEC>::type*>(y + offset[j]) = staged.bits;
      } else {
        float v[OUT_VEC];
#pragma unroll
        for (int e = 0; e < OUT_VEC; ++e) v[e] = to_float(staged.e[e]);
        store_output<OUT_VEC>(v, res[j], y, offset[j]);
      }
    }
  }
}
