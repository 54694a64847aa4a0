// The load warpgroup of the warp-specialized Hopper kernel: cp.async copies of Q once and of K/V tile by tile into
// the 128-byte-swizzled stages the wgmma descriptors read (attention_mainloop_sm90.cuh describes the layout), each
// handed to the MMA warpgroups through the pipeline's "full" mbarriers.
//
// Why cp.async and not TMA: the AOT ABI passes no host-built tensor map, and a device-built one needs a global
// buffer per launch; cp.async needs neither. A copy becomes visible to wgmma (async proxy) only after the copying
// thread has seen it land and run fence.proxy.async, so each loader thread waits for its own copy groups with one
// group of lag (K(i) is signalled once V(i) is in flight, V(i) once K(i + 1) is) and then arrives.
//
// FP8: V is copied the same way into a staging tile (kVStagingTiles, laid out after the V stages) and the load
// warpgroup writes its V^T tile into the stage (attention_v_transpose_sm90.cuh), then signals it: every loader warp
// copies K and V and transposes V, or (FP8_SPLIT_LOADER) warps 0-1 copy K, warps 2-3 copy and transpose V.
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

#if FP8
// the load warpgroup's own named barrier (1..kMmaWarpgroups are the MMA warpgroups' turns)
constexpr int kLoaderBarrier = 1 + kMmaWarpgroups;

// Tuning FP8_EARLY_K (without FP8_SPLIT_LOADER): 1 hands K(t) over at the top of the loader's iteration t + kLoadLag,
// once tile t has landed, before the loader waits for K(t + kLoadLag)'s stage (which the MMA warpgroups free only
// after Q K^T of an earlier tile completes) and issues its copies; 0 (default) hands it over at the end of that
// iteration, beside V^T(t). Deadlock-free as the default: K(t) still needs only copies, and K(t) is published before
// K(t + kStages) is awaited (kLoadLag < kStages). The split loader's K warps always hand K over this early.
#ifndef FP8_EARLY_K
#define FP8_EARLY_K 0
#endif
constexpr bool kEarlyK = FP8_EARLY_K;
static_assert(!(kEarlyK && kSplitLoader), "FP8_EARLY_K is a variant of the loader without FP8_SPLIT_LOADER");

// Tile `step`'s copies (and all before) have landed in this thread's part (all but the newest kNewest groups): hand
// K(step) over to wgmma.
template <int kNewest>
__device__ __forceinline__ void publish_k(const KVPipeline& pipe, int step) {
  wait_tiles_landed<kNewest>();
  mbarrier_arrive(pipe.full_k(KVPipeline::stage(step)));
}

// Copy group g (0: Q, 1 + i: tile i's V, and its K where kWithK) has landed, all but the newest kNewest groups: hand
// it over (K unless kEarlyK handed it over already), V^T once the kThreadsV threads that copy V have all seen theirs.
template <int kThreadsV, bool kWithK, int kNewest>
__device__ __forceinline__ void publish_group(const KVPipeline& pipe, const qkv_t* staging, qkv_t* sV, int g,
                                              int tid) {
  if (g == 0) {
    wait_tiles_landed<kNewest>();
    mbarrier_arrive(pipe.full_q());
    return;
  }
  const int step = g - 1;
  if constexpr (kWithK) publish_k<kNewest>(pipe, step);
  else wait_tiles_landed<kNewest>();
  named_barrier_sync<kThreadsV>(kLoaderBarrier);  // V(step) is in the staging tile, all of it
  pipe.acquire_v(step);
  transpose_v_tile<kThreadsV>(staging + (step % kVStagingTiles) * kVTileElems,
                              sV + KVPipeline::stage(step) * kVTileElems, tid);
  fence_async_proxy();  // stmatrix writes are generic-proxy; wgmma reads V^T through the async proxy
  mbarrier_arrive(pipe.full_v(KVPipeline::stage(step)));
}

// Q's share committed as group 0, then per tile (K into its stage where kWithK and) V into a staging tile; tile t's
// (K and) V^T are handed over while the copies of tiles t + 1 .. t + kLoadLag are in flight. By all loader threads
// (kWithK), or by the split loader's V warps (kThreadsV of them, this one is `tid` among them).
template <int kThreadsV, bool kWithK>
__device__ __forceinline__ void load_and_transpose_v(const KVPipeline& pipe, qkv_t* sK, qkv_t* sV, qkv_t* staging,
                                                     const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                                     int64_t v_stride, int len_kv, int n_tiles, int tid) {
  cp_async_commit();
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN;
    if constexpr (kWithK) {
      if (kEarlyK && step >= kLoadLag) publish_k<kLoadLag - 1>(pipe, step - kLoadLag);
      pipe.acquire_k(step);
      load_tile_swizzled<kBlockN, kThreadsV>(sK + KVPipeline::stage(step) * kKTileElems, k_base, k_stride, n0,
                                             len_kv, tid);
    }
    named_barrier_sync<kThreadsV>(kLoaderBarrier);  // every V thread is done transposing out of this staging tile
    load_tile_swizzled<kBlockN, kThreadsV>(staging + (step % kVStagingTiles) * kVTileElems, v_base, v_stride, n0,
                                           len_kv, tid);
    cp_async_commit();  // group 1 + step
    if (step + 1 >= kLoadLag)
      publish_group<kThreadsV, kWithK && !kEarlyK, kLoadLag>(pipe, staging, sV, step + 1 - kLoadLag, tid);
  }
  publish_pending(n_tiles, [&](auto newest, int g) {
    publish_group<kThreadsV, kWithK, decltype(newest)::value>(pipe, staging, sV, g, tid);
  });
}

// The split loader's K warps: K(t) into its stage (their share of Q in tile 0's copy group), handed over at the top
// of iteration t + kLoadLag, before they wait for the next K stage: nothing but K's own copies delays it.
__device__ __forceinline__ void load_k(const KVPipeline& pipe, qkv_t* sK, const qkv_t* k_base, int64_t k_stride,
                                       int len_kv, int n_tiles, int tid) {
  auto publish = [&](auto newest, int t) {
    publish_k<decltype(newest)::value>(pipe, t);
    if (t == 0) mbarrier_arrive(pipe.full_q());
  };
  for (int step = 0; step < n_tiles; ++step) {
    if (step >= kLoadLag) publish(Newest<kLoadLag - 1>{}, step - kLoadLag);
    pipe.acquire_k(step);
    load_tile_swizzled<kBlockN, kKThreads>(sK + KVPipeline::stage(step) * kKTileElems, k_base, k_stride,
                                           (n_tiles - 1 - step) * kBlockN, len_kv, tid);
    cp_async_commit();  // K(step) (step 0: and Q)
  }
  if (n_tiles == 0) {  // Q alone
    cp_async_commit();
    wait_tiles_landed<0>();
    mbarrier_arrive(pipe.full_q());
  }
  publish_pending(n_tiles - 1, publish);
}

// The FP8 loader: Q by every loader warp, then K and V (every warp: copies, then V's transpose) or, split
// (FP8_SPLIT_LOADER), K by warps 0-1 and V (copies and transpose) by warps 2-3.
__device__ __forceinline__ void load_q_and_kv(const KVPipeline& pipe, qkv_t* sQ, qkv_t* sK, qkv_t* sV,
                                              const qkv_t* q_base, int64_t q_stride, int m0, int len_q,
                                              const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                              int64_t v_stride, int len_kv, int n_tiles) {
  const int tid = threadIdx.x;
  qkv_t* staging = sV + kStages * kVTileElems;
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  if constexpr (!kSplitLoader) {
    load_and_transpose_v<kLoadThreads, true>(pipe, sK, sV, staging, k_base, k_stride, v_base, v_stride, len_kv,
                                             n_tiles, tid);
  } else if (tid < kKThreads) {
    load_k(pipe, sK, k_base, k_stride, len_kv, n_tiles, tid);
  } else {
    load_and_transpose_v<kVThreads, false>(pipe, sK, sV, staging, k_base, k_stride, v_base, v_stride, len_kv,
                                           n_tiles, tid - kKThreads);
  }
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
  cp_async_wait<kNewest>();
  fence_async_proxy();
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
    load_tile_swizzled<kBlockN, kLoadThreads>(sK + s * kKTileElems, k_base, k_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_lagging(pipe, 1 + 2 * step, step0, round);
    pipe.acquire_v(step0 + step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sV + s * kVTileElems, v_base, v_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_lagging(pipe, 2 + 2 * step, step0, round);
  }
  publish_pending(2 * n_tiles, [&](auto newest, int h) {
    publish_group<decltype(newest)::value>(pipe, h, step0, round);
  });
}
#endif
