// The two MMA warpgroups of the warp-specialized Hopper kernel (FlashAttention-3's consumer design): each owns 64
// query rows and runs, per K/V tile, S = Q K^T(t) and the previous tile's O += P V(t+1) as two wgmma groups, then
// its softmax of S while P V still runs on the tensor cores (intra-warpgroup overlap). Ping-pong: the two
// warpgroups take turns to issue their products (named barriers 1 and 2), so one's softmax runs under the other's
// wgmmas. The loads come from the load warpgroup through KVPipeline; nothing here touches global memory but the mask.
#pragma once
#include "common/named_barrier.cuh"
#include "attention_pipeline_sm90.cuh"
#include "attention_mainloop_sm90.cuh"
#include "attention_softmax.cuh"

constexpr int kTurnBarrier = 1;  // ids 1 (warpgroup 0's turn) and 2 (warpgroup 1's)
constexpr int kTurnThreads = 2 * 128;

// Everything one MMA thread needs to mask its scores (as the single-role kernel computes it).
struct ScoreLimits {
  int kv_end, causal_offset, len_q, m0;
  const mask_t* mask_base;
  int mask_stride_q, mask_stride_k;
};

// Runs the main loop for MMA warp `warp` (0..kWarps-1 counted from the first MMA warp) over tiles n_tiles - 1 .. 0;
// returns with O (unnormalized) and the row sums of this thread's rows.
__device__ __forceinline__ void mma_warpgroup_mainloop(const KVPipeline& pipe, const qkv_t* sQ, const qkv_t* sK,
                                                       const qkv_t* sV, int n_tiles, const ScoreLimits& lim, int warp,
                                                       int lane, float (&o)[1][kDTiles][4], float (&row_sum)[1][2]) {
  const int wg = warp / 4;
  float row_max[1][2] = {{-INFINITY, -INFINITY}};
  row_sum[0][0] = row_sum[0][1] = 0.f;
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
  // P of the previous tile, pending its P V; before the first tile P = 0 times the first V stage (adds nothing, and
  // keeps every issue and wait unconditional: ptxas serializes wgmmas it cannot prove idle where their registers
  // are read).
  uint32_t p[kPVSteps][4];
#pragma unroll
  for (int kk = 0; kk < kPVSteps; ++kk) p[kk][0] = p[kk][1] = p[kk][2] = p[kk][3] = 0u;
  const QFromSmem q(sQ, warp, lane);
  FragmentCoords coords;
  coords.row0 = lim.m0 + warp * kWarpRows + lane / 4;

  mbarrier_wait(pipe.full_q(), 0);
  if (wg == 1 && n_tiles > 0) named_barrier_arrive<kTurnThreads>(kTurnBarrier);  // warpgroup 0 issues first
  for (int step = 0; step < n_tiles; ++step) {
    const int t = n_tiles - 1 - step;
    const int n0 = t * kBlockN;
    const int v_step = step > 0 ? step - 1 : 0;  // the pending product's V tile
    pipe.wait_k(step);
    pipe.wait_v(v_step);
    float s[1][kNTiles][4];
    named_barrier_sync<kTurnThreads>(kTurnBarrier + wg);
    gemm_qk_issue(s, q, sK + KVPipeline::stage(step) * kKTileElems);
    gemm_pv_issue(o, p, sV + KVPipeline::stage(v_step) * kVTileElems);
    named_barrier_arrive<kTurnThreads>(kTurnBarrier + (wg ^ 1));  // the other warpgroup's turn
    wgmma_wait<1>();  // groups complete in order: S is ready, P V may still run
    fence_operands(s[0]);
    pipe.release_k(step);
    const bool check_bounds = n0 + kBlockN > lim.kv_end || (CAUSAL && n0 + kBlockN - 1 > lim.m0 + lim.causal_offset);
    if (check_bounds || MASK_KIND != MASK_NONE || kPrescale) {
      coords.col0 = n0 + (lane % 4) * 2;
      mask_scores(s, coords, check_bounds, lim.kv_end, lim.causal_offset, lim.len_q, lim.mask_base, lim.mask_stride_q,
                  lim.mask_stride_k);
    }
    // Branch-free up to the wait (ptxas waits for a wgmma before divergent code that reads its accumulators).
    float o_scale[2];
    online_softmax<true>(s, row_max, row_sum, [&](int, int half, float alpha) { o_scale[half] = alpha; });
    wgmma_wait<0>();
    fence_operands(p);
    fence_operands(o[0]);
    if (step > 0) pipe.release_v(v_step);
    // FP8 moves a row's max whenever it grows (threshold 0), yet after the first tiles rarely: skip the O rescale
    // (HEAD_DIM / 4 FMULs a thread) when no row of the warp moved. Warp-uniform, and no wgmma is in flight here.
    if (!FP8 || __any_sync(0xffffffff, o_scale[0] != 1.f || o_scale[1] != 1.f)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) rescale_output_row(o, 0, half, o_scale[half]);
    }
    pack_p(p, s);
  }
  if (n_tiles > 0) {
    // the turn barriers: warpgroup 1's last arrival on warpgroup 0's barrier has no partner turn; absorb it
    if (wg == 0) named_barrier_sync<kTurnThreads>(kTurnBarrier);
    pipe.wait_v(n_tiles - 1);
    gemm_pv_issue(o, p, sV + KVPipeline::stage(n_tiles - 1) * kVTileElems);
    wgmma_wait<0>();
    fence_operands(p);
    fence_operands(o[0]);
  }
}
