// FusedConv as an implicit GEMM (cuDNN's formulation): NHWC activations, OHWI weights, the epilogue fused.
//
//   GEMM rows    m = (n, p, q)           M = N*P*Q output pixels
//   GEMM columns k_out in the group      Kg = K / GROUPS (grid.z walks the groups)
//   reduction    kg = (r, s, c)          KH*KW*Cg, flattened in OHWI order, so W is a plain [Kg, KH*KW*Cg] matrix
// Reduction tiles stream through a STAGES-deep cp.async pipeline into XOR-swizzled shared memory and are multiplied
// on the tensor cores; the epilogue (epilogue.cuh) runs on the accumulators, stages the tile through shared memory and
// leaves as OUT_VEC-wide stores, with the residual read the same way.
//
// The kernel below is the schedule: a TileLoader fetch()es tiles kAhead ahead of the MMAs and land()s them; each
// tile's MMAs run through the main loop's wait_tiles_landed / mma_tile_begin / mma_tile_end / mma_drain (the mma.sync
// and wgmma main loops give the same interface); FP8 quantizes A one tile ahead between begin and end; then the split
// and cluster sums and the epilogue. Each role has its file:
//   implicit_gemm_config.cuh        defines, operand types, tile geometry, the swizzled tile layout
//   implicit_gemm_load.cuh          global -> shared tile loads (cp.async, or the element gather), TAPS_INNER order
//   implicit_gemm_quantize.cuh      FP8: X quantized to e4m3 on its way to the MMAs
//   implicit_gemm_mainloop.cuh      the MMAs of a tile on mma.sync (sm_80+)
//   implicit_gemm_mainloop_sm90.cuh the MMAs of a tile on wgmma (WGMMA = 1, sm_90a)
//   implicit_gemm_reduction.cuh     sums over split groups (SPLIT_K) and cluster CTAs (CLUSTER_K, DSMEM)
// and the PTX wrappers are plugins/common's.
//
// FP8 (FP8 = 1, sm_89+): W is e4m3 in global memory and X float16/bfloat16 (quantized in the kernel) or, with
// X_E4M3 = 1, already e4m3 (the previous layer wrote e4m3(x / input_scale)): A then moves as bytes like W (C/G % 16
// == 0), half the A traffic and no quantize pass. Operand tiles hold bytes, the MMAs take e4m3 (a 32-byte k-step
// either way), and the epilogue multiplies the fp32 accumulator by INPUT_SCALE (and the per-channel scale).
//
// Compile-time: DTYPE_BF16, FP8 (+ INPUT_SCALE, INPUT_SCALE_INV, X_E4M3), OUTPUT_E4M3 (+ OUTPUT_SCALE_INV), WGMMA, TAPS_INNER, CLUSTER_K, KH, KW,
// STRIDE_H, STRIDE_W, DIL_H, DIL_W, GROUPS, BLOCK_M, BLOCK_N, BLOCK_K (32|64; FP8: 64|128), WARPS_M, WARPS_N, SPLIT_K,
// STAGES (per group), IN_VEC, OUT_VEC, and the epilogue's defines.
// Arguments (AOT plugin ABI): x [N,H,W,C] (X_E4M3: e4m3), w [K,KH,KW,C/G] (FP8: e4m3), shift?, scale?, residual?
// [N,P,Q,K]; int32 N, H, W, C, K, P, Q, pad_h, pad_w, x_stride (X's pixel stride: C, or C padded to 8 / 16 in
// TensorRT's HWC8 / HWC16); y [N,P,Q,K] (OUTPUT_E4M3: e4m3, what an X_E4M3 consumer reads). Tensors must hold
// < 2^31 elements.
#include "epilogue.cuh"
#include "implicit_gemm_config.cuh"
#include "implicit_gemm_load.cuh"
#include "implicit_gemm_reduction.cuh"
#include "implicit_gemm_store.cuh"
#if WGMMA
#include "implicit_gemm_mainloop_sm90.cuh"
#else
#include "implicit_gemm_mainloop.cuh"
#endif
#include "implicit_gemm_quantize.cuh"

// The tap-row gather caps its registers for TAP_ROWS_BLOCKS 128-thread blocks per SM (the plan's; 4: 127 registers), so
// that more loads are in flight per SM; the other specializations have no cap beyond the block size.
#if TAP_ROWS
#define IMPLICIT_GEMM_BOUNDS __launch_bounds__(kThreads, TAP_ROWS_BLOCKS)
#else
#define IMPLICIT_GEMM_BOUNDS __launch_bounds__(kThreads)
#endif

extern "C" __global__ void IMPLICIT_GEMM_BOUNDS CLUSTER_ATTRIBUTE
fused_conv_implicit_gemm(const x_t* __restrict__ x, const op_t* __restrict__ w SHIFT_PARAM SCALE_PARAM
                         RESIDUAL_PARAM, int N, int H, int W, int C, int K, int P, int Q, int pad_h, int pad_w,
                         int x_stride, out_t* __restrict__ y) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma's swizzle atoms: 512/1024-byte aligned

  const int tid = threadIdx.x, lane = tid & 31;
  const int group = tid / kGroupThreads, group_tid = tid % kGroupThreads, warp = group_tid >> 5;
#if WGMMA
  const int row_base = (warp >> 2) * kWgRows + (warp & 3) * 16, col_base = 0;  // this warp's accumulator rows
#else
  const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
  const int row_base = warp_m * kWarpM, col_base = warp_n * kWarpN;
#endif
  const int Cg = C / GROUPS, Kg = K / GROUPS;
  const int M = N * P * Q, Kgemm = KH * KW * Cg;
  const int m0 = blockIdx.x * BLOCK_M, n0 = blockIdx.y * BLOCK_N;
  const int g = blockIdx.z / CLUSTER_K, rank = blockIdx.z % CLUSTER_K;  // conv group; CTA rank in the cluster
  arrive_cluster_started();  // PUSHED_OFFSET: the other ranks push here once they have seen this CTA start
  const WarpDivmods<3> divisors({P * Q, Q, Cg});
  const FastDivmod &pq_div = divisors.at[0], &q_div = divisors.at[1], &cg_div = divisors.at[2];
  unsigned char* stages = smem_raw + group * kGroupBytes;
#if QUANTIZE_A
  unsigned char* a8 = stages + STAGES * kStageBytes;  // the ring of quantized A tiles
#endif

  TileLoader loader(group_tid, m0, n0, g, M, Kg, Kgemm, H, W, x_stride, Cg, pad_h, pad_w, pq_div, q_div);

  float acc[kMI][kNI][4];
  clear_accumulators(acc);

  // This CTA's contiguous slice of the reduction tiles; group takes the slice's tiles group, group + SPLIT_K, ...
  const int tiles = reduction_tiles(Kgemm);
  const int t_begin = rank * tiles / CLUSTER_K, t_end = (rank + 1) * tiles / CLUSTER_K;
  const int k_tiles = (t_end - t_begin - group + SPLIT_K - 1) / SPLIT_K;
  auto k0_of = [&](int i) { return tile_k0(t_begin + group + i * SPLIT_K, Cg); };
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < k_tiles) {
      loader.fetch(stages + st * kStageBytes, k0_of(st), x, w, H, W, x_stride, Cg, Kgemm, cg_div);
      loader.land(stages + st * kStageBytes);
    }
    cp_async_commit();
  }
#if QUANTIZE_A
  // Tile 0's A quantized before the loop; iteration it quantizes tile it + 1 while the MMAs run on tile it.
  cp_async_wait<kAhead - 1>();
  group_barrier(group);
  if (k_tiles > 0) quantize_a_tile(a8, stages, group_tid);
#endif

  for (int it = 0; it < k_tiles; ++it) {
    wait_tiles_landed<kAhead - 1 - kQuantAhead>();  // tile it (and it + 1 when A is quantized ahead) has landed
    // Everyone's tile data is visible, and every MMA that read the stage loaded next has finished.
    group_barrier(group);
    const int ahead = it + kAhead;
    unsigned char* stage = stages + (it % STAGES) * kStageBytes;
    if (ahead < k_tiles)
      loader.fetch(stages + (ahead % STAGES) * kStageBytes, k0_of(ahead), x, w, H, W, x_stride, Cg, Kgemm, cg_div);
    if (TileLoader::kAsync) cp_async_commit();
#if QUANTIZE_A
    const unsigned char* a_tile = a8 + (it % kA8Tiles) * kA8Bytes;
#else
    const unsigned char* a_tile = stage;
#endif
    mma_tile_begin(acc, a_tile, stage + kAStageBytes, warp);
#if QUANTIZE_A
    if (it + 1 < k_tiles)
      quantize_a_tile(a8 + ((it + 1) % kA8Tiles) * kA8Bytes, stages + ((it + 1) % STAGES) * kStageBytes, group_tid);
#endif
    mma_tile_end(acc, a_tile, stage + kAStageBytes, row_base, col_base, lane);
    if (ahead < k_tiles) loader.land(stages + (ahead % STAGES) * kStageBytes);
  }
  mma_drain(acc);
  cp_async_wait<0>();
  __syncthreads();

  sum_split_groups(acc, smem_raw, group, group_tid);
  const TileRows rows = sum_cluster_partials(acc, smem_raw, rank, group == 0, row_base, col_base, lane);

  // Epilogue: scale, shift, activation on the accumulators; the tile goes through shared memory so that the
  // residual read and the output store are OUT_VEC wide.
  elem_t* tile = reinterpret_cast<elem_t*>(smem_raw);
  const int channel0 = g * Kg + n0;
  if (group == 0)
    stage_accumulators(acc, tile, row_base, col_base, lane, n0, Kg, channel0, ChannelAffine{SCALE_ARG, SHIFT_ARG});
  __syncthreads();
  store_staged_tile<kThreads, kOwnedRowsMax>(tile, tid, rows, m0, n0, M, Kg, K, channel0, RESIDUAL_ARG, y);
}
