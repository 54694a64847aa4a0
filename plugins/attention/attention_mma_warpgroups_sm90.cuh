// The MMA warpgroups of the warp-specialized Hopper kernel (FlashAttention-3's consumer design): each owns 64
// query rows and runs, per K/V tile, S = Q K^T(t) and the previous tile's O += P V(t+1) as two wgmma groups, then
// its softmax of S while P V still runs on the tensor cores (intra-warpgroup overlap). Ping-pong: the warpgroups
// (two, or three with 192-row tiles) take turns in a ring to issue their products (named barriers 1..kMmaWarpgroups),
// so one's softmax runs under the others' wgmmas. The loads come from the load warpgroup through KVPipeline; nothing here touches global memory but the mask.
#pragma once
#include <type_traits>
#include "common/compiler_fences.cuh"
#include "common/named_barrier.cuh"
#include "attention_pipeline_sm90.cuh"
#include "attention_mainloop_sm90.cuh"
#include "attention_softmax.cuh"

// Tuning PV_OVERLAP (16-bit and FP8): 1 (default) issues P V(t+1) beside Q K^T(t) and runs the softmax of S(t)
// under it, so P of the previous tile is live beside S; 0 runs the products of a turn one after the other (P V(t+1),
// then Q K^T(t) into the registers P leaves) and the softmax under the other warpgroups' turns only: P and S are never
// live together, which lets head dim 256 hold O (128 registers) and a 128-key S (64) in the MMA warpgroups' 240.
#ifndef PV_OVERLAP
#define PV_OVERLAP 1
#endif
constexpr bool kPVOverlap = PV_OVERLAP;
// Tuning SERIAL_PV_IN_TURN (with PV_OVERLAP=0): the turn issues the pending P V(t+1), then Q K^T(t); 1 (default)
// awaits P V between them, so S is written over P's registers; 2 issues them back to back and awaits both after the
// turn (no drain between them, so S is live beside P: fits where the tile's S + P + O do, e.g. head dim 256 on 64-key
// tiles, hd128 on 128). (P V after the softmax, outside the turn, lost at 16 bits and FP8 alike: removed.)
#ifndef SERIAL_PV_IN_TURN
#define SERIAL_PV_IN_TURN 1
#endif
static_assert(SERIAL_PV_IN_TURN == 1 || SERIAL_PV_IN_TURN == 2, "SERIAL_PV_IN_TURN: 1 or 2");
constexpr bool kSerialDrainPV = SERIAL_PV_IN_TURN == 1;  // P V awaited before Q K^T(t) writes over P's registers

// Q as the MMA warpgroups read it: a persistent CTA pins every k-step's descriptor (attention_mainloop_sm90.cuh)
using MmaQ = std::conditional_t<kPersistent, QFromSmemPinned, QFromSmem>;

template <bool kPinned = kPersistent>
__device__ __forceinline__ MmaQ mma_q_operand(const qkv_t* sQ, int warp, int lane) {
  if constexpr (kPinned) return QFromSmemPinned(smem_addr(sQ) + (warp / 4) * 64 * kSwizzleRowBytes);
  else return QFromSmem(sQ, warp, lane);
}

// The K/V stages as the MMA warpgroups address them: generic pointers (one tile a CTA: v12's code), or a persistent
// CTA's shared addresses taken once per query tile through opaque values, so that no step rebuilds them from the
// CTA's shared window: with the tile loop around the main loop ptxas re-read SR_CgaCtaId in every step and built V's
// descriptor after the turn barrier, a chain of ~8 uniform instructions in front of the turn's first wgmma (H100 job
// attn-ws-2: 3-4% of all stall samples on it, the tensor pipe 70% active vs 83%).
struct KVTilePointers {
  const qkv_t *k, *v;
  __device__ __forceinline__ const qkv_t* k_tile(int stage) const { return k + stage * kKTileElems; }
  __device__ __forceinline__ const qkv_t* v_tile(int stage) const { return v + stage * kVTileElems; }
};
struct KVTileAddresses {
  uint32_t k, v;
  __device__ __forceinline__ KVTileAddresses(const qkv_t* sK, const qkv_t* sV)
      : k(opaque_u32(smem_addr(sK))), v(opaque_u32(smem_addr(sV))) {}
  __device__ __forceinline__ uint32_t k_tile(int stage) const { return k + stage * kKTileElems * sizeof(qkv_t); }
  __device__ __forceinline__ uint32_t v_tile(int stage) const { return v + stage * kVTileElems * sizeof(qkv_t); }
};
using MmaKV = std::conditional_t<kPersistent, KVTileAddresses, KVTilePointers>;

constexpr int kTurnBarrier = 1;  // id 1 + w: warpgroup w's turn, handed over by warpgroup w - 1 (mod the count)
constexpr int kTurnThreads = 2 * 128;

// The warpgroup whose turn follows warpgroup wg's.
__device__ __forceinline__ int next_turn(int wg) { return kMmaWarpgroups == 2 ? wg ^ 1 : (wg + 1) % kMmaWarpgroups; }

// Everything one MMA thread needs to mask its scores (as the single-role kernel computes it).
struct ScoreLimits {
  int kv_end, causal_offset, len_q, m0;
  const mask_t* mask_base;
  int mask_stride_q, mask_stride_k;
};

// True when tile t (keys [t * kBlockN, (t + 1) * kBlockN)) has keys past kv_end or above the causal diagonal of
// some row of the block: its scores need the bounds check.
__device__ __forceinline__ bool tile_crosses_limits(int t, const ScoreLimits& lim) {
  const int n0 = t * kBlockN;
  return n0 + kBlockN > lim.kv_end || (CAUSAL && n0 + kBlockN - 1 > lim.m0 + lim.causal_offset);
}

// The online-softmax state of one MMA thread: O (unnormalized), P of the previous tile (pending its P V), the
// running row maxima and sums, and where its scores sit.
struct MmaThreadState {
  float (&o)[1][kDTiles][4];
  float (&row_sum)[1][2];
  float row_max[1][2];
  uint32_t p[kPVSteps][4];
  FragmentCoords coords;
};

// Masks S(t) where needed (kCheckBounds: keys past the end or above the diagonal; a mask; prescaled scores) and runs
// the online softmax on it: S becomes P (unnormalized), o_scale the factor O's two rows of this thread take.
template <bool kCheckBounds>
__device__ __forceinline__ void mask_and_softmax(float (&s)[1][kNTiles][4], int t, const ScoreLimits& lim, int lane,
                                                 MmaThreadState& st, float (&o_scale)[2]) {
  if constexpr (kCheckBounds || MASK_KIND != MASK_NONE || kPrescale) {
    st.coords.col0 = t * kBlockN + (lane % 4) * 2;
    mask_scores(s, st.coords, kCheckBounds, lim.kv_end, lim.causal_offset, lim.len_q, lim.mask_base,
                lim.mask_stride_q, lim.mask_stride_k);
  }
  online_softmax<true>(s, st.row_max, st.row_sum, [&](int, int half, float alpha) { o_scale[half] = alpha; });
}

// One K/V tile step of an MMA warpgroup: wait K(t) and V(t+1) full; take the turn (named barrier 1 or 2); issue
// Q K^T(t) and the pending P V(t+1) as two wgmma groups; hand the turn on; wait for S; release K; mask + online
// softmax while P V still runs; wait; rescale O; release V; pack P. kCheckBounds is a template parameter so the
// code between the two wgmma waits has no branch: a branch around the masking started a block there, and ptxas
// hoisted the P V wait to its top, above the softmax. kFirst: the first tile has no pending P V (nothing is issued
// but Q K^T, and V's first stage is not awaited yet).
template <bool kCheckBounds, bool kFirst>
__device__ __forceinline__ void mma_tile_step(const KVPipeline& pipe, const MmaQ& q, const MmaKV& kv,
                                              int step, int t, const ScoreLimits& lim,
                                              int wg, int lane, MmaThreadState& st) {
  const int v_step = step - 1;  // the pending product's V tile
  pipe.wait_k(step);
  if constexpr (!kFirst) pipe.wait_v(v_step);
  float s[1][kNTiles][4];
  named_barrier_sync<kTurnThreads>(kTurnBarrier + wg);
  gemm_qk_issue(s, q, kv.k_tile(KVPipeline::stage(step)));
  if constexpr (!kFirst) gemm_pv_issue(st.o, st.p, kv.v_tile(KVPipeline::stage(v_step)));
  named_barrier_arrive<kTurnThreads>(kTurnBarrier + next_turn(wg));
  wgmma_wait<kFirst ? 0 : 1>();  // groups complete in order: S is ready, P V may still run
  fence_operands(s[0]);
  pipe.release_k(step);
  // Branch-free up to the wait (ptxas waits for a wgmma before divergent code that reads its accumulators).
  float o_scale[2];
  mask_and_softmax<kCheckBounds>(s, t, lim, lane, st, o_scale);
  // ptxas hoists a wgmma wait (it has no operands) to the top of its basic block: the warp-uniform branch on whether
  // any row of the warp moved its max ends the softmax's block, so the wait for P V starts a block after the
  // softmax (without it the softmax ran after P V). Where no row moved, the O rescale (HEAD_DIM / 4 FMULs a thread)
  // is skipped: after the first tiles maxima rarely move.
  if constexpr (kFirst) {
    // O is still zero: nothing to rescale or wait for
  } else if (__any_sync(0xffffffff, o_scale[0] != 1.f || o_scale[1] != 1.f)) {
    wgmma_wait<0>();
    fence_operands(st.p);
    fence_operands(st.o[0]);
#pragma unroll
    for (int half = 0; half < 2; ++half) rescale_output_row(st.o, 0, half, o_scale[half]);
  } else {
    wgmma_wait<0>();
    fence_operands(st.p);
    fence_operands(st.o[0]);
  }
  if constexpr (!kFirst) pipe.release_v(v_step);
  pack_p(st.p, s);
}

// One K/V tile step without intra-warpgroup overlap (PV_OVERLAP=0): wait V(t+1) full; take the turn; issue the
// pending P V(t+1), wait K(t) full meanwhile, wait for P V (P's registers are then free); release V; issue Q K^T(t);
// hand the turn on; wait for S; release K; mask + online softmax; rescale O (idle: no product pending); pack P.
// K(t) is awaited inside the turn so that P V runs while it lands (with one K/V stage, K(t) is loaded only after
// the other warpgroup's Q K^T(t+1) has ended). SERIAL_PV_IN_TURN=2: Q K^T(t) is issued right after P V(t+1) (no
// wait between), both awaited after the turn; then V and K released.
template <bool kCheckBounds, bool kFirst>
__device__ __forceinline__ void mma_tile_step_serial(const KVPipeline& pipe, const MmaQ& q, const MmaKV& kv,
                                                     int step, int t, const ScoreLimits& lim,
                                                     int wg, int lane, MmaThreadState& st) {
  const int v_step = step - 1;  // the pending product's V tile
  constexpr bool kPending = !kFirst;
  if constexpr (kPending) pipe.wait_v(v_step);
  named_barrier_sync<kTurnThreads>(kTurnBarrier + wg);
  if constexpr (kPending) gemm_pv_issue(st.o, st.p, kv.v_tile(KVPipeline::stage(v_step)));
  pipe.wait_k(step);
  if constexpr (kPending && kSerialDrainPV) {
    wgmma_wait<0>();
    fence_operands(st.p);
    fence_operands(st.o[0]);
  }
  float s[1][kNTiles][4];
  gemm_qk_issue(s, q, kv.k_tile(KVPipeline::stage(step)));
  named_barrier_arrive<kTurnThreads>(kTurnBarrier + next_turn(wg));
  if constexpr (kPending && kSerialDrainPV) pipe.release_v(v_step);
  wgmma_wait<0>();
  fence_operands(s[0]);
  if constexpr (kPending && !kSerialDrainPV) {
    fence_operands(st.p);
    fence_operands(st.o[0]);
    pipe.release_v(v_step);
  }
  pipe.release_k(step);
  float o_scale[2];
  mask_and_softmax<kCheckBounds>(s, t, lim, lane, st, o_scale);
  // O is still zero on the first tile; later, where no row of the warp moved its max, the rescale is skipped
  if (!kFirst && __any_sync(0xffffffff, o_scale[0] != 1.f || o_scale[1] != 1.f)) {
#pragma unroll
    for (int half = 0; half < 2; ++half) rescale_output_row(st.o, 0, half, o_scale[half]);
  }
  pack_p(st.p, s);
}

// The step of the PV_OVERLAP tuning: K/V pipeline step `step` (counted on across a persistent CTA's query tiles) on
// key tile t.
template <bool kCheckBounds, bool kFirst>
__device__ __forceinline__ void mma_step(const KVPipeline& pipe, const MmaQ& q, const MmaKV& kv,
                                         int step, int t, const ScoreLimits& lim, int wg,
                                         int lane, MmaThreadState& st) {
  if constexpr (kPVOverlap) mma_tile_step<kCheckBounds, kFirst>(pipe, q, kv, step, t, lim, wg, lane, st);
  else mma_tile_step_serial<kCheckBounds, kFirst>(pipe, q, kv, step, t, lim, wg, lane, st);
}

// The turn ring of a persistent CTA runs on across its query tiles: opened once (warpgroup 0 first) before the
// first and closed once after the last (warpgroup 0 absorbs the last warpgroup's final arrival, which has no partner
// turn); a one-tile CTA opens and closes it around its tile (mma_warpgroup_mainloop).
__device__ __forceinline__ void turn_ring_open(int wg) {
  if (wg == kMmaWarpgroups - 1) named_barrier_arrive<kTurnThreads>(kTurnBarrier);
}
__device__ __forceinline__ void turn_ring_close(int wg) {
  if (wg == 0) named_barrier_sync<kTurnThreads>(kTurnBarrier);
}

// Runs the main loop for MMA warp `warp` (0..kWarps-1 counted from the first MMA warp) over tiles n_tiles - 1 .. 0;
// returns with O (unnormalized) and the row sums of this thread's rows. The tiles that cross the key or causal
// limits come first (the highest t) and run the bounds-checking step; the rest run the step without it. The first
// tile always checks bounds (correct for any tile) so that only three copies of the step exist. A persistent CTA's
// tile starts at K/V step step0 with Q in the buffer of its `round` (sQ points at it); it releases Q once every
// Q K^T is done and the last V stage after the last P V, for the next tile's loads.
__device__ __forceinline__ void mma_warpgroup_mainloop(const KVPipeline& pipe, const qkv_t* sQ, const qkv_t* sK,
                                                       const qkv_t* sV, int n_tiles, const ScoreLimits& lim, int warp,
                                                       int lane, float (&o)[1][kDTiles][4], float (&row_sum)[1][2],
                                                       int step0 = 0, int round = 0) {
  const int wg = warp / 4;
  MmaThreadState st{o, row_sum, {{-INFINITY, -INFINITY}}};
  row_sum[0][0] = row_sum[0][1] = 0.f;
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
  const MmaQ q = mma_q_operand(sQ, warp, lane);
  const MmaKV kv{sK, sV};
  st.coords.row0 = lim.m0 + warp * kWarpRows + lane / 4;
  int n_checked = 0;  // leading steps whose tile crosses a limit
  while (n_checked < n_tiles && tile_crosses_limits(n_tiles - 1 - n_checked, lim)) ++n_checked;

  pipe.wait_q(round);
  // (a one-tile CTA's ring: warpgroup 0 first; written as turn_ring_open's test so the SASS stays v12's)
  if (!kPersistent && wg == kMmaWarpgroups - 1 && n_tiles > 0) named_barrier_arrive<kTurnThreads>(kTurnBarrier);
  if (n_tiles > 0) mma_step<true, true>(pipe, q, kv, step0, n_tiles - 1, lim, wg, lane, st);
  for (int step = 1; step < n_checked; ++step)
    mma_step<true, false>(pipe, q, kv, step0 + step, n_tiles - 1 - step, lim, wg, lane, st);
  for (int step = max(n_checked, 1); step < n_tiles; ++step)
    mma_step<false, false>(pipe, q, kv, step0 + step, n_tiles - 1 - step, lim, wg, lane, st);
  if constexpr (kPersistent) pipe.release_q(round);  // every Q K^T of the tile has completed
  if (n_tiles > 0) {
    if (!kPersistent) turn_ring_close(wg);
    const int last = step0 + n_tiles - 1;
    pipe.wait_v(last);
    gemm_pv_issue(o, st.p, kv.v_tile(KVPipeline::stage(last)));
    wgmma_wait<0>();
    fence_operands(st.p);
    fence_operands(o[0]);
    if constexpr (kPersistent) pipe.release_v(last);
  }
}
