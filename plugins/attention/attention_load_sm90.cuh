// The load warpgroup of the warp-specialized Hopper kernel: cp.async copies of each query tile's Q and of its K/V
// tiles into the 128-byte-swizzled stages the wgmma descriptors read (attention_mainloop_sm90.cuh describes the
// layout), each handed to the MMA warpgroups through the pipeline's "full" mbarriers.
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

constexpr int kVStagingTiles = FP8 ? 2 : 0;  // V tiles as copied, before the FP8 transpose

// The loader's chain of copy groups over a block's query tiles: each thread hands a group over (makes it visible
// to wgmma and arrives on its "full" barrier) once its next group is in flight, so it never waits for its newest
// copies. `step` counts the K/V tile steps of the block on from one query tile to the next.
struct LoadChain {
  enum Group { kNone, kQ, kK, kV, kKV };  // kKV (FP8): K, and V in its staging tile, to transpose when handed over
  int step = 0;
  Group pending = kNone;  // the newest group, not yet handed over: K of the current step, else Q or the previous step's

  __device__ __forceinline__ int pending_step() const { return pending == kK ? step : step - 1; }
};

#if FP8
constexpr int kLoaderBarrier = 3;  // the load warpgroup's own named barrier (1 and 2 are the MMA warpgroups' turns)

// Tile `step`'s copies (and all before) have landed in this thread's part (all but the newest kNewest groups): K is
// handed over; once every loader thread's V copies are in, V^T is written into the stage and handed over.
template <int kNewest>
__device__ __forceinline__ void publish_k_and_transpose_v(const KVPipeline& pipe, const qkv_t* staging, qkv_t* sV,
                                                          int step, int tid) {
  cp_async_wait<kNewest>();
  fence_async_proxy();
  mbarrier_arrive(pipe.full_k(KVPipeline::stage(step)));
  named_barrier_sync<kLoadThreads>(kLoaderBarrier);  // V(step) is in the staging tile, all of it
  pipe.acquire_v(step);
  transpose_v_tile<kLoadThreads>(staging + (step % 2) * kVTileElems, sV + KVPipeline::stage(step) * kVTileElems, tid);
  fence_async_proxy();  // stmatrix writes are generic-proxy; wgmma reads V^T through the async proxy
  mbarrier_arrive(pipe.full_v(KVPipeline::stage(step)));
}
#endif

// Hand over the chain's pending group, whose copies (and all but the kNewest newest groups) have landed.
template <int kNewest>
__device__ __forceinline__ void publish_pending(const KVPipeline& pipe, const LoadChain& chain, qkv_t* sV, int tid) {
#if FP8
  if (chain.pending == LoadChain::kKV) {
    publish_k_and_transpose_v<kNewest>(pipe, sV + kStages * kVTileElems, sV, chain.pending_step(), tid);
    return;
  }
#endif
  if (chain.pending == LoadChain::kNone) return;
  cp_async_wait<kNewest>();
  fence_async_proxy();
  const int stage = KVPipeline::stage(chain.pending_step());
  mbarrier_arrive(chain.pending == LoadChain::kQ ? pipe.full_q()
                  : chain.pending == LoadChain::kK ? pipe.full_k(stage) : pipe.full_v(stage));
}

// Commit the copies issued since the last commit as one group (`what`), then hand over the group before it.
__device__ __forceinline__ void commit_and_publish(const KVPipeline& pipe, LoadChain& chain, LoadChain::Group what,
                                                   qkv_t* sV, int tid) {
  cp_async_commit();
  publish_pending<1>(pipe, chain, sV, tid);
  chain.pending = what;
}

// One query tile's loads: Q once the previous query tile's Q is no longer read (`round`: the query tile's index in
// the block), then K and V of tiles n_tiles - 1 down to 0 (the order the MMA warpgroups visit them). FP8: V goes
// into one of two staging tiles (kVStagingTiles, after the V stages), transposed into its stage when handed over.
__device__ __forceinline__ void load_query_tile(const KVPipeline& pipe, LoadChain& chain, int round, qkv_t* sQ,
                                                qkv_t* sK, qkv_t* sV, const qkv_t* q_base, int q_stride, int m0,
                                                int len_q, const qkv_t* k_base, int k_stride, const qkv_t* v_base,
                                                int v_stride, int len_kv, int n_tiles) {
  const int tid = threadIdx.x;
  if (round > 0) {
    // the previous query tile's newest group first: its last P V (or, without keys, its Q) may be what the MMA
    // warpgroups wait for before they release Q
    publish_pending<0>(pipe, chain, sV, tid);
    chain.pending = LoadChain::kNone;
    pipe.acquire_q(round);
  }
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  commit_and_publish(pipe, chain, LoadChain::kQ, sV, tid);
  for (int t = n_tiles - 1; t >= 0; --t, ++chain.step) {
    const int s = KVPipeline::stage(chain.step);
    pipe.acquire_k(chain.step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sK + s * kKTileElems, k_base, k_stride, t * kBlockN, len_kv, tid);
#if FP8
    // every loader thread is done transposing out of this staging tile (two steps ago)
    named_barrier_sync<kLoadThreads>(kLoaderBarrier);
    load_tile_swizzled<kBlockN, kLoadThreads>(sV + (kStages + chain.step % 2) * kVTileElems, v_base, v_stride,
                                              t * kBlockN, len_kv, tid);
    commit_and_publish(pipe, chain, LoadChain::kKV, sV, tid);
#else
    commit_and_publish(pipe, chain, LoadChain::kK, sV, tid);
    pipe.acquire_v(chain.step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sV + s * kVTileElems, v_base, v_stride, t * kBlockN, len_kv, tid);
    commit_and_publish(pipe, chain, LoadChain::kV, sV, tid);
#endif
  }
}

// After the block's last query tile: hand over the newest group.
__device__ __forceinline__ void finish_loads(const KVPipeline& pipe, const LoadChain& chain, qkv_t* sV) {
  publish_pending<0>(pipe, chain, sV, threadIdx.x);
}
