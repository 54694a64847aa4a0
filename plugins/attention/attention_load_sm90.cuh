// The load warpgroup of the warp-specialized Hopper kernel: cp.async copies of Q once and of K/V tile by tile into
// the 128-byte-swizzled stages the wgmma descriptors read (attention_mainloop_sm90.cuh describes the layout), each
// handed to the MMA warpgroups through the pipeline's "full" mbarriers.
//
// Why cp.async and not TMA: the AOT ABI passes no host-built tensor map, and a device-built one needs a global
// buffer per launch; cp.async needs neither. A copy becomes visible to wgmma (async proxy) only after the copying
// thread has seen it land and run fence.proxy.async, so each loader thread waits for its own copy groups with one
// group of lag (K(i) is signalled once V(i) is in flight, V(i) once K(i + 1) is) and then arrives.
//
// FP8: V is copied the same way into one of two staging tiles (kVStagingTiles, laid out after the V stages) and the
// load warpgroup writes its V^T tile into the stage (attention_v_transpose_sm90.cuh), then signals it.
#pragma once
#include "attention_pipeline_sm90.cuh"
#include "attention_mainloop_sm90.cuh"
#include "common/named_barrier.cuh"
#if FP8
#include "attention_v_transpose_sm90.cuh"
#endif

// Copy groups a loader thread keeps in flight before it publishes the oldest (tuning KV_LOAD_LAG). 16-bit: with 1 it
// waits for K(i) right after issuing V(i), so at most about one K/V tile pair is in flight an SM and every tile costs
// the loader one L2 latency; 2 (K(i) published once K(i + 1) is issued) or 3 keep more bytes in flight. The consumer
// never waits on itself: group g - lag is published after group g is issued, whose stage the MMA warpgroups freed
// at least one tile before they need group g - lag (lag 2 needs two stages, 3 three). FP8: a group is one tile's K and V, so
// lag 1 holds two tiles in flight while tile i - 1 is published and transposed, lag 2 three (V needs lag + 1 staging
// tiles; K(i) reuses the stage of K(i - kStages), which is published before, so lag < kStages). 16-bit lag 0 publishes
// each group as soon as it has landed, before the loader waits for the next free stage: one K/V stage needs it (with
// a lag, K(i) would be published only after V(i)'s stage is freed, by the P V(i - 1) that follows Q K^T(i)).
#ifndef KV_LOAD_LAG
#define KV_LOAD_LAG 1
#endif
constexpr int kLoadLag = KV_LOAD_LAG;
static_assert(FP8 ? kLoadLag >= 1 && kLoadLag <= 3 && kLoadLag < kStages
                  : kLoadLag >= 0 && kLoadLag <= 3 && kLoadLag <= kStages && (kLoadLag == 0 || kStages > 1),
              "KV_LOAD_LAG: FP8 1-3, below KV_STAGES; 16-bit 0-3, at most KV_STAGES, 0 with one stage");
constexpr int kVStagingTiles = FP8 ? kLoadLag + 1 : 0;  // V tiles as copied, before the FP8 transpose

// cp.async.wait_group takes its count as an immediate: publish(Newest<n>{}, g) gets it as a type.
template <int kNewest>
struct Newest {
  static constexpr int value = kNewest;
};

// After the last copy group (`last`): publish the kLoadLag - 1 .. 0 newest groups, oldest first, each once all but
// the newer ones have landed (both loaders' tail: publish(Newest<pending>{}, group)).
template <typename Publish>
__device__ __forceinline__ void publish_pending(int last, Publish&& publish) {
#pragma unroll
  for (int pending = kLoadLag - 1; pending >= 0; --pending) {
    const int g = last - pending;
    if (g < 0) continue;
    if (pending == 2) publish(Newest<2>{}, g);
    else if (pending == 1) publish(Newest<1>{}, g);
    else publish(Newest<0>{}, g);
  }
}

// Tuning KV_WHOLE_TILE_COPIES (both loaders): 1 copies a K/V tile that lies wholly inside the keys (all but the
// last) without the per-row bounds test and zero-fill select; 0 tests every row. The loader's copy issue sits on the
// K/V hand-over's critical path (v13c: its per-row address chain alone cost the persistent grid 8-15% a step); FP8's
// loader issue shares the SMSPs with the softmax (attn-fp8-1: ~110 more loader instructions a tile cost 4-13%).
// (FP8: the V tile goes into its staging tile.)
#ifndef KV_WHOLE_TILE_COPIES
#define KV_WHOLE_TILE_COPIES 0
#endif

// The K or V tile of keys [n0, n0 + kBlockN) into its stage.
__device__ __forceinline__ void load_kv_tile(qkv_t* stage, const qkv_t* base, int64_t stride, int n0, int len_kv,
                                             int tid) {
  if (KV_WHOLE_TILE_COPIES && n0 + kBlockN <= len_kv)
    load_tile_swizzled<kBlockN, kLoadThreads, false>(stage, base, stride, n0, len_kv, tid);
  else
    load_tile_swizzled<kBlockN, kLoadThreads>(stage, base, stride, n0, len_kv, tid);
}

#if FP8
// the load warpgroup's own named barrier (1..kMmaWarpgroups are the MMA warpgroups' turns)
constexpr int kLoaderBarrier = 1 + kMmaWarpgroups;

// Tile `step`'s copies (and all before) have landed in this thread's part (all but the newest kNewest groups): K is
// handed over; once every loader thread's V copies are in, V^T is written into the stage and handed over.
template <int kNewest>
__device__ __forceinline__ void publish_k_and_transpose_v(const KVPipeline& pipe, const qkv_t* staging, qkv_t* sV,
                                                          int step, int tid) {
  wait_tiles_landed<kNewest>();
  mbarrier_arrive(pipe.full_k(KVPipeline::stage(step)));
  named_barrier_sync<kLoadThreads>(kLoaderBarrier);  // V(step) is in the staging tile, all of it
  pipe.acquire_v(step);
  transpose_v_tile<kLoadThreads>(staging + (step % kVStagingTiles) * kVTileElems,
                                 sV + KVPipeline::stage(step) * kVTileElems, tid);
  fence_async_proxy();  // stmatrix writes are generic-proxy; wgmma reads V^T through the async proxy
  mbarrier_arrive(pipe.full_v(KVPipeline::stage(step)));
}

// Copy group g (0: Q, 1 + i: tile i's K and V) has landed, all but the newest kNewest groups: hand it over.
template <int kNewest>
__device__ __forceinline__ void publish_group(const KVPipeline& pipe, const qkv_t* staging, qkv_t* sV, int g, int tid) {
  if (g == 0) {
    wait_tiles_landed<kNewest>();
    mbarrier_arrive(pipe.full_q());
  } else {
    publish_k_and_transpose_v<kNewest>(pipe, staging, sV, g - 1, tid);
  }
}

// The FP8 loader: Q, then per tile K into its stage and V into a staging tile; tile t's K and V^T are handed over
// while the copies of tiles t + 1 .. t + kLoadLag are in flight.
__device__ __forceinline__ void load_q_and_kv(const KVPipeline& pipe, qkv_t* sQ, qkv_t* sK, qkv_t* sV,
                                              const qkv_t* q_base, int64_t q_stride, int m0, int len_q,
                                              const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                              int64_t v_stride, int len_kv, int n_tiles) {
  const int tid = threadIdx.x;
  qkv_t* staging = sV + kStages * kVTileElems;
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  cp_async_commit();
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN;
    pipe.acquire_k(step);
    load_kv_tile(sK + KVPipeline::stage(step) * kKTileElems, k_base, k_stride, n0, len_kv, tid);
    named_barrier_sync<kLoadThreads>(kLoaderBarrier);  // every loader thread is done transposing out of this staging tile
    load_kv_tile(staging + (step % kVStagingTiles) * kVTileElems, v_base, v_stride, n0, len_kv, tid);
    cp_async_commit();  // group 1 + step
    if (step + 1 >= kLoadLag) publish_group<kLoadLag>(pipe, staging, sV, step + 1 - kLoadLag, tid);
  }
  publish_pending(n_tiles, [&](auto newest, int g) {
    publish_group<decltype(newest)::value>(pipe, staging, sV, g, tid);
  });
}
#else

// The full barrier of copy group h of a query tile: Q (h = 0), then K(i) (h = 1 + 2i) and V(i) (h = 2 + 2i). A
// persistent CTA's tile starts at K/V step step0 and puts Q into the buffer of its `round`.
__device__ __forceinline__ uint32_t group_full_barrier(const KVPipeline& pipe, int h, int step0, int round) {
  return h == 0 ? pipe.full_q(round)
         : h % 2 ? pipe.full_k(KVPipeline::stage(step0 + h / 2))
                 : pipe.full_v(KVPipeline::stage(step0 + h / 2 - 1));
}

// Copy group h has landed, all but the newest kNewest groups: hand it over.
template <int kNewest>
__device__ __forceinline__ void publish_group(const KVPipeline& pipe, int h, int step0, int round) {
  wait_tiles_landed<kNewest>();
  mbarrier_arrive(group_full_barrier(pipe, h, step0, round));
}

// Group `newest` was just committed: publish group newest - kLoadLag (all but the kLoadLag newest have landed).
__device__ __forceinline__ void publish_lagging(const KVPipeline& pipe, int newest, int step0, int round) {
  if (newest >= kLoadLag) publish_group<kLoadLag>(pipe, newest - kLoadLag, step0, round);
}

// The loader's whole job for one query tile: Q, then K and V of tiles n_tiles - 1 down to 0 (the order the MMA
// warpgroups visit them). A persistent CTA's tile starts at K/V step step0 with Q in the buffer of its `round`
// (sQ points at it); every group is published before the next tile's loads start.
__device__ __forceinline__ void load_q_and_kv(const KVPipeline& pipe, qkv_t* sQ, qkv_t* sK, qkv_t* sV,
                                              const qkv_t* q_base, int64_t q_stride, int m0, int len_q,
                                              const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                              int64_t v_stride, int len_kv, int n_tiles, int step0 = 0,
                                              int round = 0) {
  const int tid = threadIdx.x;
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  cp_async_commit();
  publish_lagging(pipe, 0, step0, round);  // (lag 0 only)
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN;
    const int s = KVPipeline::stage(step0 + step);
    pipe.acquire_k(step0 + step);
    load_kv_tile(sK + s * kKTileElems, k_base, k_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_lagging(pipe, 1 + 2 * step, step0, round);
    pipe.acquire_v(step0 + step);
    load_kv_tile(sV + s * kVTileElems, v_base, v_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_lagging(pipe, 2 + 2 * step, step0, round);
  }
  publish_pending(2 * n_tiles, [&](auto newest, int h) {
    publish_group<decltype(newest)::value>(pipe, h, step0, round);
  });
}
#endif
