// trt_fusedattn::FusedAttention forward kernel (FlashAttention-2 algorithm, sm_80+): one thread block computes
// kBlockM query rows of one (batch, head); K/V tiles stream past it through shared memory, S and P live only in
// registers, the softmax is online (running max and sum), accumulation is fp32.
//
// Two mainloops serve this one kernel body: mma.sync (sm_80+, attention_mainloop.cuh) and, with WGMMA=1, Hopper's
// warpgroup MMA (sm_90a, attention_mainloop_sm90.cuh); tile loads, masking, softmax and epilogue are shared.
//
// AOT plugin ABI: input pointers (Q, K, V[, mask][, key_lengths]), int32 scalars, output pointer. Strides are in
// elements; V and O have their own (their head dim D_v may differ from Q/K's). Everything else is a -D constant chosen by plan.py.
#include "attention_tile_scheduler.cuh"
#if WGMMA && (PACK_GQA > 1 || WARP_SPLIT > 1)
#include "attention_decode_sm90.cuh"
#elif WGMMA
#include "attention_mainloop_sm90.cuh"
#else
#include "attention_mainloop.cuh"
#endif
#include "attention_softmax.cuh"
#include "attention_epilogue.cuh"
#if KV_SPLIT > 1 || WARP_SPLIT > 1
#include "attention_split_kv.cuh"
#endif
#if KV_SPLIT > 1
#define KV_SPLIT_CLUSTER __cluster_dims__(KV_SPLIT, 1, 1)
#else
#define KV_SPLIT_CLUSTER
#endif
#include "common/named_barrier.cuh"

// A K/V tile load: by the threads of this thread's key group with WARP_SPLIT (`group_tid`: its index among them),
// else by the whole block (the one form both mainloops have).
template <int DIM>
__device__ __forceinline__ void load_kv_tile(elem_t* smem, const elem_t* base, int64_t stride, int row0, int len,
                                             int group_tid) {
#if WARP_SPLIT > 1
  load_tile_async<kBlockN, DIM, false, kGroupThreads>(smem, base, stride, row0, len, 0, group_tid);
#else
  load_tile_async<kBlockN, DIM>(smem, base, stride, row0, len);
#endif
}

// The barrier of the threads that share K/V tiles: the block, or with WARP_SPLIT one key group (named barrier
// 1 + group, also for one-warp groups: compute-sanitizer's racecheck reported the cp.async writes after a __syncwarp
// against the previous tile's ldmatrix reads; a bar.sync of 32 threads orders both for it and costs no more).
__device__ __forceinline__ void sync_key_group(int group) {
  if constexpr (kWarpSplit == 1) {
    __syncthreads();
  } else {
    named_barrier_sync<kGroupThreads>(1 + group);
  }
}

extern "C" __global__ void KV_SPLIT_CLUSTER __launch_bounds__(kThreads, kMinBlocksPerSm) fused_attention(ATTENTION_KERNEL_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem[];
  // the plan adds kSmemAlign - 16 bytes of slack for this round-up (0 for the mma.sync mainloop)
  elem_t* sQ = reinterpret_cast<elem_t*>(smem + ((kSmemAlign - smem_addr(smem) % kSmemAlign) % kSmemAlign));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // WARP_SPLIT: warps [group * kRowWarps, (group + 1) * kRowWarps) form key group `group`, with their own K/V tiles
  const int group = kWarpSplit > 1 ? warp / kRowWarps : 0, row_warp = kWarpSplit > 1 ? warp % kRowWarps : warp;
  const int group_tid = kWarpSplit > 1 ? threadIdx.x % kGroupThreads : threadIdx.x;
  elem_t* sK = sQ + kQTileElems + group * (kStages * kKTileElems + kVStages * kVTileElems);  // kStages K tiles
  elem_t* sV = sK + kStages * kKTileElems;                                                  // kVStages V tiles

  const AttentionTile tile = schedule_tile();
  // PACK_GQA: the grid's heads are K/V heads and the tile's rows are (query, head of the group) pairs
  const int head_kv = kPackGqa > 1 ? tile.head : tile.head / (heads_q / heads_kv);
  const int head_q = kPackGqa > 1 ? tile.head * kPackGqa : tile.head;  // the tile's (first) query head
  const int len_rows = len_q * kPackGqa;
  const int m0 = tile.m_block * kBlockM;

  const elem_t* q_base = Q + static_cast<int64_t>(tile.batch) * q_stride_b + static_cast<int64_t>(head_q) * q_stride_h;
  const elem_t* k_base = K + static_cast<int64_t>(tile.batch) * kv_stride_b + static_cast<int64_t>(head_kv) * kv_stride_h;
  const elem_t* v_base = V + static_cast<int64_t>(tile.batch) * v_stride_b + static_cast<int64_t>(head_kv) * v_stride_h;

  const int kv_end = attended_key_end(tile, m0, len_q, len_kv, ATTENTION_KEY_LENGTHS);
  const int causal_offset = causal_key_offset(len_q, len_kv);
  const int n_tiles = kv_end > 0 ? (kv_end + kBlockN - 1) / kBlockN : 0;
  // This key group's tiles, visited from t_first down to t_last (all of them unless a cluster or WARP_SPLIT splits
  // the keys: part tile.split * kWarpSplit + group of kKvSplit * kWarpSplit).
  const int tiles_per_split = (n_tiles + kKvSplit * kWarpSplit - 1) / (kKvSplit * kWarpSplit);
  const int t_last = (tile.split * kWarpSplit + group) * tiles_per_split;
  const int t_first = min(n_tiles, t_last + tiles_per_split) - 1;

#if MASK_KIND != MASK_NONE
  const mask_t* mask_base = mask + static_cast<int64_t>(tile.batch) * mask_stride_b +
                            static_cast<int64_t>(head_q) * mask_stride_h;
#else
  const mask_t* mask_base = nullptr;
  const int mask_stride_q = 0, mask_stride_k = 0, mask_stride_h = 0;
#endif

  // KV_STAGES 1: one K and one V buffer, V(t) loads during Q K^T(t), K(t-1) during softmax and P V(t) (two
  // barriers per tile). KV_STAGES 2: two K/V buffer pairs, tile t-1 loads during all of tile t (one barrier).
  // KV_STAGES 3-5 (decode: more bytes in flight per key group): a ring of kStages pairs, tiles t-1 .. t-(kStages-1)
  // load during tile t; every step commits one cp.async group (empty past the last tile), so the loop top waits for
  // all but the kStages - 2 newest.
#if PACK_GQA > 1
  load_tile_async<kBlockM, kHeadDim, true>(sQ, q_base, q_stride_s, m0, len_rows, q_stride_h);
#else
  load_tile_async<kBlockM, kHeadDim>(sQ, q_base, q_stride_s, m0, len_q);
#endif
  if (t_first >= t_last) {
    load_kv_tile<kHeadDim>(sK, k_base, kv_stride_s, t_first * kBlockN, len_kv, group_tid);
    if (kStages >= 2) load_kv_tile<kHeadDimV>(sV, v_base, v_stride_s, t_first * kBlockN, len_kv, group_tid);
  }
  cp_async_commit();
  const auto load_ring_tile = [&](int i) {  // (a ring) tile t_first - i into pair i, its own group
    if (t_first - i >= t_last) {
      load_kv_tile<kHeadDim>(sK + i * kKTileElems, k_base, kv_stride_s, (t_first - i) * kBlockN, len_kv, group_tid);
      load_kv_tile<kHeadDimV>(sV + i * kVTileElems, v_base, v_stride_s, (t_first - i) * kBlockN, len_kv, group_tid);
    }
    cp_async_commit();
  };
  static_assert(kStages <= 5, "the prologue below fills rings of up to five pairs");
  if (kStages >= 3) load_ring_tile(1);
  if (kStages >= 4) load_ring_tile(2);
  if (kStages >= 5) load_ring_tile(3);
  if (kOverlapPV) cp_async_commit();  // an empty group: the loop top leaves the newest group in flight
  if (kWarpSplit > 1) {  // the key groups' barriers do not cover the Q tile, which every thread loaded a part of
    wait_tiles_landed<kRingInFlight>();  // (and, for wgmma, fenced for the async proxy)
    __syncthreads();
  }

  float o[kMAtoms][kDTiles][4];
  float row_max[kMAtoms][2], row_sum[kMAtoms][2];
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

#if Q_IN_REGISTERS
  wait_tiles_landed();
  __syncthreads();
  const QInRegisters q_operand(sQ, row_warp, lane);
#else
  const QFromSmem q_operand(sQ, row_warp, lane);
#endif
  FragmentCoords coords;
  coords.row0 = m0 + row_warp * kWarpRows + lane / 4;
#if WGMMA_OVERLAP
  PendingPV pending(sV);  // slot 0: the first tile's V
#endif
  // Tiles are visited from the last to the first, so the ones needing bounds/causal checks come first.
  for (int t = t_first; t >= t_last; --t) {
    const int n0 = t * kBlockN;
    const unsigned step = t_first - t;  // (unsigned: the ring indices below are plain masks or multiply-shifts)
    // step s's K tile is in K buffer s % kStages, its V tile in V buffer s % kVStages
    const elem_t* sK_t = sK + step % kStages * kKTileElems;
    const elem_t* sV_t = sV + step % kVStages * kVTileElems;
    // KV_STAGES 2-5: tile t - (kStages - 1)'s K and V into the buffers tile t + 1 used (V: tile t + 2's with the
    // overlap)
    constexpr int kAhead = kStages > 1 ? kStages - 1 : 1;  // tiles the prefetch runs ahead
    const auto prefetch_k = [&] {
      load_kv_tile<kHeadDim>(sK + (step + kAhead) % kStages * kKTileElems, k_base, kv_stride_s, n0 - kAhead * kBlockN,
                             len_kv, group_tid);
    };
    const auto prefetch_v = [&] {
      load_kv_tile<kHeadDimV>(sV + (step + kAhead) % kVStages * kVTileElems, v_base, v_stride_s,
                              n0 - kAhead * kBlockN, len_kv, group_tid);
    };
    wait_tiles_landed<kRingInFlight + kOverlapPV>();
    sync_key_group(group);  // tile t's K (and V with 2-3 stages) is in smem; every warp is done with tile t + 1
    if (kStages >= 2 && t - kAhead >= t_last) {
      prefetch_k();
      if (!kOverlapPV) prefetch_v();
      cp_async_commit();
    } else if (kStages >= 3) {
      cp_async_commit();  // an empty group keeps one group a step
    } else if (kStages == 1) {
      load_kv_tile<kHeadDimV>(sV, v_base, v_stride_s, n0, len_kv, group_tid);
      cp_async_commit();
    }

    float s[kMAtoms][kNTiles][4];
#if WGMMA_OVERLAP
    pending.gemm_qk_then_pv(s, q_operand, sK_t, o);
#else
    gemm_qk(s, q_operand, sK_t, lane);
#endif
    // (the block's first row's query, m0 / kPackGqa, sees the fewest keys)
    const bool check_bounds = n0 + kBlockN > kv_end || (CAUSAL && n0 + kBlockN - 1 > m0 / kPackGqa + causal_offset);
    if (check_bounds || MASK_KIND != MASK_NONE || kPrescale) {
      coords.col0 = n0 + (lane % 4) * 2;
      mask_scores(s, coords, check_bounds, kv_end, causal_offset, len_q, mask_base, mask_stride_q, mask_stride_k,
                  mask_stride_h);
    }
    if (kStages == 1) {
      wait_tiles_landed();
      sync_key_group(group);  // V tile t is in smem; every warp is done with K tile t
      if (t > t_last) {
        load_kv_tile<kHeadDim>(sK, k_base, kv_stride_s, n0 - kBlockN, len_kv, group_tid);
        cp_async_commit();
      }
    }
#if WGMMA_OVERLAP
    // Branch-free from here to the wait (ptxas waits for a wgmma before any divergent code that reads its
    // accumulators), so the O rescale is unconditional, by 1 where a row's max did not move.
    float o_scale[kMAtoms][2];
    online_softmax<true>(s, row_max, row_sum, [&](int mt, int half, float alpha) { o_scale[mt][half] = alpha; });
    // V(t - 1) is first read by the P V issued two tiles from now. Issued here, its branch also ends the softmax's
    // basic block: ptxas hoists the wait below (it has no operands) to the top of its block, above the softmax.
    if (t > t_last) {
      prefetch_v();
      cp_async_commit();
    }
    pending.finish(o);  // the previous tile's P V has landed in O: now O may be rescaled
#pragma unroll
    for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) rescale_output_row(o, mt, half, o_scale[mt][half]);
    pending.stage(s, sV_t);
#else
    online_softmax(s, row_max, row_sum, o);
    gemm_pv(o, s, sV_t, lane);
#endif
  }
#if WGMMA_OVERLAP
  if (t_first >= t_last) {  // (with no tile, slot 0 holds no V: nothing to add)
    wait_tiles_landed();  // the last tile's V, loaded in the newest group
    __syncthreads();
    pending.flush(o);
  }
#endif
  // Every key group meets its named barrier tiles_per_split times, however many tiles it had (the last groups get
  // fewer): racecheck reported the combine's cross-group reads after the block barrier below against the partial
  // stores before it whenever a group of several warps had met its barrier fewer times than the writer's group
  // (session 4 runs 1-3, NOTES.md); the hardware barriers order them either way.
  for (int pad = max(t_first - t_last + 1, 0); kWarpSplit > 1 && pad < tiles_per_split; ++pad) sync_key_group(group);

  cp_async_wait_all();  // the Q load is still in flight when there was no tile
  __syncthreads();      // every warp is done reading sQ/sV: sQ becomes the output staging buffer
  elem_t* out = O + static_cast<int64_t>(tile.batch) * o_stride_b + static_cast<int64_t>(head_q) * o_stride_h;
#if KV_SPLIT > 1 || WARP_SPLIT > 1
  combine_split_kv(sQ + kQTileElems, o, row_max, row_sum, row_warp, group, lane, tile.split, out, o_stride_s,
                   o_stride_h, m0, len_rows);
#else
  stage_output(sQ, o, row_sum, warp, lane);
  __syncthreads();
  store_output(out, sQ, o_stride_s, m0, len_rows, threadIdx.x, o_stride_h);
#endif
}
