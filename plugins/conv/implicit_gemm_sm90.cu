// FusedConv as a warp-specialized implicit GEMM for Hopper (sm_90a): the GEMM view, tile layout, loads, MMAs, cluster
// split and epilogue of implicit_gemm.cu, with the loads taken off the MMA warps. One thread block computes one
// BLOCK_M x BLOCK_N output tile with two to four warpgroups:
// - warpgroup 0 loads (implicit_gemm_load_sm90.cuh): im2col rows of X and rows of W by cp.async into a STAGES-deep
//   ring of swizzled stages, handed over through mbarriers (implicit_gemm_pipeline_sm90.cuh); it gives most of its
//   registers away (setmaxnreg; not on one MMA warpgroup);
// - warpgroups 1 and 2 (BLOCK_M 192: 1 to 3; BLOCK_M 64: 1 alone) multiply (implicit_gemm_mainloop_sm90.cuh,
//   mma_ring_tiles), their share of the BLOCK_M rows each, with wgmma straight from the stages, one tile's MMAs in
//   flight while the next is waited for;
// SHARE_W = 1 pairs adjacent M tiles in a 2-CTA cluster that share the W tile: each CTA loads half of it and pushes
// that half into the other's ring (DSMEM), so W moves from L2 once per pair (a 128x128 tile: 24 KB per reduction tile
// instead of 32, where the loop is bounded by operand bytes from L2);
// then CLUSTER_K > 1 sums the cluster's partial tiles through DSMEM, each rank finalizing its share of the rows
// (implicit_gemm_reduction.cuh), and the MMA warpgroups run the shared output pass (implicit_gemm_store.cuh: scale, shift, activation, residual,
// post-activation). Arguments, defines and the launch grid are implicit_gemm.cu's (WGMMA = 1, WARP_SPECIALIZED = 1,
// 4, 8 or 12 MMA warps as WARPS_M x WARPS_N, SPLIT_K 1, 16-byte loads, float16/bfloat16, or FP8 with X_E4M3: e4m3 X
// and W land as bytes in the same swizzled rows, wgmma m64nNk32 e4m3, INPUT_SCALE in the epilogue); the block has 256,
// 384 or 512 threads. BLOCK_M 192 exists for grids that 128- and 256-row tiles leave part-filled (N*P*Q = 25088 rows:
// 131 tiles of 192 on 132 SMs, where 128 rows make 196 and 256 rows 98); BLOCK_M 64 (one MMA warpgroup) for grids
// that 128-row tiles leave short: twice the CTAs, each with the whole reduction, where 128-row tiles split it over a
// cluster (cuDNN's b8 1x1 1024>256 @14 runs 64-row tiles, the whole reduction per CTA).
#include "epilogue.cuh"
#include "implicit_gemm_config.cuh"
#include "implicit_gemm_load_sm90.cuh"
#include "implicit_gemm_mainloop_sm90.cuh"
#include "implicit_gemm_reduction.cuh"
#include "implicit_gemm_store.cuh"
#include "common/named_barrier.cuh"
#include "common/warpgroup.cuh"

static_assert(WARP_SPECIALIZED && WGMMA && IN_VEC == 8 && (!FP8 || X_E4M3), "the warp-specialized kernel: wgmma, "
              "16-byte loads, float16/bfloat16 or FP8 with e4m3 X (nothing to quantize: A and W land as operand bytes)");
#ifndef WS_CTAS
#define WS_CTAS 1  // thread blocks per SM: 2 overlaps one block's ring fill and epilogue with the other's MMAs
#endif
// One block per SM with two MMA warpgroups: 128 * 128 + 184 * 256 = 63488 of the SM's 65536 registers: the loader
// keeps each of its rows' im2col origin and W offset in registers (16 A + 8 W rows at BLOCK_M 256: 120 spilled), the
// MMA warps 128 accumulators at most. Three (BLOCK_M 192, 64 rows and 64 accumulators each): the 512 threads start
// with 128 registers each, which both roles keep (12 A + 8 W rows for the loader). Two blocks per SM: every role
// keeps the 80 registers per thread each block starts with (ptxas compiles the whole kernel within that cap and
// cannot use a setmaxnreg.inc above it), so 32 accumulators at most. One MMA warpgroup (BLOCK_M 64): the 256 threads
// start with 255 registers at one block per SM, 128 at two (64 accumulators at most), and keep them.
constexpr bool kMoveRegisters = WS_CTAS == 1 && kMmaThreads == 256;
// The loader's registers are its own (setmaxnreg, or one MMA warpgroup at up to 255 a thread): it builds its FastDivmods
// once a warp (WarpDivmods). Where every role shares one cap (128: 192-row tiles; 80: two blocks per SM) the shuffled
// build spilled (84 and 12 bytes) and every thread builds its own.
constexpr bool kLoaderOwnsRegisters = kMoveRegisters || (WS_CTAS == 1 && kMmaThreads == 128);
constexpr int kLoadRegisters = 128;
constexpr int kMmaRegisters = 184;
static_assert(WS_CTAS == 1 || (WS_CTAS == 2 && kMI * kNI * 4 <= (kMmaThreads == 128 ? 64 : 32)),
              "two blocks per SM: 32 accumulators at most (64 on one MMA warpgroup)");
constexpr int kMmaBarrier = 1;  // named barrier of the MMA warpgroups (0 is __syncthreads')
#if SHARE_W
#define WS_CLUSTER_ATTRIBUTE __cluster_dims__(2, 1, 1)  // the two M tiles sharing a W tile (grid.x is even)
#else
#define WS_CLUSTER_ATTRIBUTE CLUSTER_ATTRIBUTE
#endif

extern "C" __global__ void __launch_bounds__(kBlockThreads, WS_CTAS) WS_CLUSTER_ATTRIBUTE
fused_conv_implicit_gemm_sm90(const x_t* __restrict__ x, const op_t* __restrict__ w SHIFT_PARAM SCALE_PARAM
                              RESIDUAL_PARAM, int N, int H, int W, int C, int K, int P, int Q, int pad_h, int pad_w,
                              int x_stride, out_t* __restrict__ y) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma's swizzle atoms: 512/1024-byte aligned
  unsigned char* stages = smem_raw + kRingOffset;  // the ring; after the main loop the partial / staged output tile
  const int w_part = SHARE_W ? blockIdx.x & 1 : 0;  // SHARE_W: rank in the (2, 1, 1) cluster = the W half it loads
  const TileRing ring{smem_addr(smem_raw), SHARE_W ? cluster_address(smem_raw, w_part ^ 1) : 0u};

  const int Cg = C / GROUPS, Kg = K / GROUPS;
  const int M = N * P * Q, Kgemm = KH * KW * Cg;
  const int m0 = blockIdx.x * BLOCK_M, n0 = blockIdx.y * BLOCK_N;
  const int g = blockIdx.z / CLUSTER_K, rank = blockIdx.z % CLUSTER_K;  // conv group; CTA rank in the cluster
  // This CTA's contiguous slice of the reduction tiles.
  const int tiles = reduction_tiles(Kgemm);
  const int t_begin = rank * tiles / CLUSTER_K, k_tiles = (rank + 1) * tiles / CLUSTER_K - t_begin;

  if (threadIdx.x == 0) ring.init();
  if constexpr (SHARE_W) {
    cluster_sync();  // the other CTA arrives on and pushes into this one's barriers
  } else {
    __syncthreads();
  }
  arrive_cluster_started();

  // Each role is one branch (setmaxnreg: the load warpgroup never runs code that holds the accumulators).
  if (threadIdx.x < kLoadThreads) {
    if constexpr (kMoveRegisters) warpgroup_registers_decrease<kLoadRegisters>();
    const WarpDivmods<3, kLoaderOwnsRegisters> divisors({P * Q, Q, Cg});
    const FastDivmod &pq_div = divisors.at[0], &q_div = divisors.at[1], &cg_div = divisors.at[2];
    RingLoader loader(threadIdx.x, m0, n0, g, M, Kg, Kgemm, H, W, x_stride, Cg, pad_h, pad_w, pq_div, q_div, w_part);
    load_tiles(ring, stages, loader, k_tiles, [&](int i) { return tile_k0(t_begin + i, Cg); }, x, w, H, W, x_stride,
               Cg, Kgemm, cg_div, SHARE_W ? cluster_address(stages, w_part ^ 1) : 0u);
    join_cluster_sum();
    if constexpr (SHARE_W) cluster_sync();  // see the MMA warps' last barrier
  } else {
    if constexpr (kMoveRegisters) warpgroup_registers_increase<kMmaRegisters>();
    const int mma_tid = threadIdx.x - kLoadThreads, lane = threadIdx.x & 31;
    float acc[kMI][kNI][4];
    clear_accumulators(acc);
    mma_ring_tiles(acc, ring, stages, k_tiles, mma_tid / 128, lane);
    // Both warpgroups' MMAs have finished reading the ring before it holds partial or output tiles.
    named_barrier_sync<kMmaThreads>(kMmaBarrier);
    const int warp = mma_tid >> 5, channel0 = g * Kg + n0;
    const int row_base = (warp >> 2) * kWgRows + (warp & 3) * 16;  // this warp's accumulator rows
    const TileRows rows = sum_cluster_partials(acc, stages, rank, true, row_base, 0, lane);  // this CTA's share

    // Epilogue: scale, shift, activation on the accumulators, staged through shared memory so that the residual
    // read and the output store are OUT_VEC wide.
    elem_t* tile = reinterpret_cast<elem_t*>(stages);
    stage_accumulators(acc, tile, row_base, 0, lane, n0, Kg, channel0, ChannelAffine{SCALE_ARG, SHIFT_ARG});
    named_barrier_sync<kMmaThreads>(kMmaBarrier);
    store_staged_tile<kMmaThreads, kOwnedRowsMax>(tile, mma_tid, rows, m0, n0, M, Kg, K, channel0, RESIDUAL_ARG, y);
    // SHARE_W: neither CTA leaves while the other may still arrive on its empty barriers.
    if constexpr (SHARE_W) cluster_sync();
  }
}
