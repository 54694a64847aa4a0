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
// warpgroup writes its V^T tile into the stage (attention_v_transpose_sm90.cuh), then signals it: every warp copies
// and transposes (FP8_COPY_WARPS=0), or one or two warps copy and hand K over while the others transpose.
#pragma once
#include "attention_pipeline_sm90.cuh"
#include "attention_mainloop_sm90.cuh"
#include "common/named_barrier.cuh"
#if FP8
#include "attention_v_transpose_sm90.cuh"
#endif

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

// Tuning FP8_EARLY_K (with FP8_COPY_WARPS=0): 1 hands K(t) over at the top of the loader's iteration t + kLoadLag,
// once tile t has landed, before the loader waits for K(t + kLoadLag)'s stage (which the MMA warpgroups free only
// after Q K^T of an earlier tile completes) and issues its copies; 0 (default) hands it over at the end of that
// iteration, beside V^T(t). Deadlock-free as the default: K(t) still needs only copies, and K(t) is published before
// K(t + kStages) is awaited (kLoadLag < kStages). The split loader always hands K over this early.
#ifndef FP8_EARLY_K
#define FP8_EARLY_K 0
#endif
constexpr bool kEarlyK = FP8_EARLY_K;
static_assert(!(kEarlyK && kSplitLoader), "FP8_EARLY_K is a variant of the FP8_COPY_WARPS=0 loader");

// Tile `step`'s copies (and all before) have landed in this thread's part (all but the newest kNewest groups): hand
// K(step) over to wgmma.
template <int kNewest>
__device__ __forceinline__ void publish_k(const KVPipeline& pipe, int step) {
  wait_tiles_landed<kNewest>();
  mbarrier_arrive(pipe.full_k(KVPipeline::stage(step)));
}

// V(step) is in its staging tile, all of it: once the MMA warpgroups have freed its stage, the kThreadsT transposing
// threads (this one is `tid` among them) write V^T there and hand it over.
template <int kThreadsT>
__device__ __forceinline__ void transpose_and_publish_v(const KVPipeline& pipe, const qkv_t* staging, qkv_t* sV,
                                                        int step, int tid) {
  pipe.acquire_v(step);
  transpose_v_tile<kThreadsT>(staging + (step % kVStagingTiles) * kVTileElems,
                              sV + KVPipeline::stage(step) * kVTileElems, tid);
  fence_async_proxy();  // stmatrix writes are generic-proxy; wgmma reads V^T through the async proxy
  mbarrier_arrive(pipe.full_v(KVPipeline::stage(step)));
}

// Copy group g (0: Q, 1 + i: tile i's K and V) has landed, all but the newest kNewest groups: hand it over (K too
// unless kEarlyK handed it over already), V^T once every loader thread's V copies are in.
template <int kNewest>
__device__ __forceinline__ void publish_group(const KVPipeline& pipe, const qkv_t* staging, qkv_t* sV, int g, int tid,
                                              bool with_k) {
  if (g == 0) {
    wait_tiles_landed<kNewest>();
    mbarrier_arrive(pipe.full_q());
    return;
  }
  if (with_k) publish_k<kNewest>(pipe, g - 1);
  else wait_tiles_landed<kNewest>();
  named_barrier_sync<kLoadThreads>(kLoaderBarrier);  // V(g - 1) is in the staging tile, all of it
  transpose_and_publish_v<kLoadThreads>(pipe, staging, sV, g - 1, tid);
}

// The FP8 loader without the split: Q, then per tile K into its stage and V into a staging tile; tile t's K and V^T
// are handed over while the copies of tiles t + 1 .. t + kLoadLag are in flight.
__device__ __forceinline__ void load_and_transpose(const KVPipeline& pipe, qkv_t* sK, qkv_t* sV, qkv_t* staging,
                                                   const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                                   int64_t v_stride, int len_kv, int n_tiles, int tid) {
  cp_async_commit();  // group 0: Q
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN;
    if (kEarlyK && step >= kLoadLag) publish_k<kLoadLag - 1>(pipe, step - kLoadLag);
    pipe.acquire_k(step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sK + KVPipeline::stage(step) * kKTileElems, k_base, k_stride, n0,
                                              len_kv, tid);
    named_barrier_sync<kLoadThreads>(kLoaderBarrier);  // every loader thread is done transposing out of this staging tile
    load_tile_swizzled<kBlockN, kLoadThreads>(staging + (step % kVStagingTiles) * kVTileElems, v_base, v_stride, n0,
                                              len_kv, tid);
    cp_async_commit();  // group 1 + step
    if (step + 1 >= kLoadLag) publish_group<kLoadLag>(pipe, staging, sV, step + 1 - kLoadLag, tid, !kEarlyK);
  }
  publish_pending(n_tiles, [&](auto newest, int g) {
    publish_group<decltype(newest)::value>(pipe, staging, sV, g, tid, true);
  });
}

// The split loader's copy warps (FP8_COPY_WARPS): tile t's K into its stage and V into staging tile t % kVStagingTiles
// (their share of Q in tile 0's copy group). At the top of iteration t + kLoadLag, before they wait for the next K
// stage, tile t (all but the kLoadLag - 1 newest groups) is handed over: K to wgmma, V to the transpose warps.
__device__ __forceinline__ void copy_kv(const KVPipeline& pipe, qkv_t* sK, qkv_t* staging, const qkv_t* k_base,
                                        int64_t k_stride, const qkv_t* v_base, int64_t v_stride, int len_kv,
                                        int n_tiles, int tid) {
  auto publish = [&](auto newest, int t) {
    publish_k<decltype(newest)::value>(pipe, t);
    if (t == 0) mbarrier_arrive(pipe.full_q());
    mbarrier_arrive(pipe.staging_full(t % kVStagingTiles));
  };
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN, j = step % kVStagingTiles;
    if (step >= kLoadLag) publish(Newest<kLoadLag - 1>{}, step - kLoadLag);
    pipe.acquire_k(step);
    load_tile_swizzled<kBlockN, kCopyThreads>(sK + KVPipeline::stage(step) * kKTileElems, k_base, k_stride, n0,
                                              len_kv, tid);
    mbarrier_wait(pipe.staging_empty(j), ((step / kVStagingTiles) & 1) ^ 1);  // V(step - kVStagingTiles) transposed
    load_tile_swizzled<kBlockN, kCopyThreads>(staging + j * kVTileElems, v_base, v_stride, n0, len_kv, tid);
    cp_async_commit();  // tile `step` (tile 0: and Q)
  }
  if (n_tiles == 0) {
    cp_async_commit();
    wait_tiles_landed<0>();
    mbarrier_arrive(pipe.full_q());
  }
  publish_pending(n_tiles - 1, publish);
}

// The split loader's transpose warps: their share of Q handed over, then each V^T as its staging tile fills.
__device__ __forceinline__ void transpose_kv(const KVPipeline& pipe, qkv_t* sV, const qkv_t* staging, int n_tiles,
                                             int tid) {
  cp_async_commit();
  wait_tiles_landed<0>();
  mbarrier_arrive(pipe.full_q());
  for (int step = 0; step < n_tiles; ++step) {
    const int j = step % kVStagingTiles;
    mbarrier_wait(pipe.staging_full(j), (step / kVStagingTiles) & 1);
    transpose_and_publish_v<kTransposeThreads>(pipe, staging, sV, step, tid);
    mbarrier_arrive(pipe.staging_empty(j));
  }
}

// The FP8 loader: Q by all four warps, then K/V by one of the two above (FP8_COPY_WARPS).
__device__ __forceinline__ void load_q_and_kv(const KVPipeline& pipe, qkv_t* sQ, qkv_t* sK, qkv_t* sV,
                                              const qkv_t* q_base, int64_t q_stride, int m0, int len_q,
                                              const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                              int64_t v_stride, int len_kv, int n_tiles) {
  const int tid = threadIdx.x;
  qkv_t* staging = sV + kStages * kVTileElems;
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  if constexpr (!kSplitLoader) {
    load_and_transpose(pipe, sK, sV, staging, k_base, k_stride, v_base, v_stride, len_kv, n_tiles, tid);
  } else if (tid < kCopyThreads) {
    copy_kv(pipe, sK, staging, k_base, k_stride, v_base, v_stride, len_kv, n_tiles, tid);
  } else {
    transpose_kv(pipe, sV, staging, n_tiles, tid - kCopyThreads);
  }
}
#else

// The full barrier of copy group h: Q (h = 0), then K(i) (h = 1 + 2i) and V(i) (h = 2 + 2i).
__device__ __forceinline__ uint32_t group_full_barrier(const KVPipeline& pipe, int h) {
  return h == 0 ? pipe.full_q() : h % 2 ? pipe.full_k(KVPipeline::stage(h / 2)) : pipe.full_v(KVPipeline::stage(h / 2 - 1));
}

// Copy group h has landed, all but the newest kNewest groups: hand it over.
template <int kNewest>
__device__ __forceinline__ void publish_group(const KVPipeline& pipe, int h) {
  cp_async_wait<kNewest>();
  fence_async_proxy();
  mbarrier_arrive(group_full_barrier(pipe, h));
}

// Group `newest` was just committed: publish group newest - kLoadLag (all but the kLoadLag newest have landed).
__device__ __forceinline__ void publish_lagging(const KVPipeline& pipe, int newest) {
  if (newest >= kLoadLag) publish_group<kLoadLag>(pipe, newest - kLoadLag);
}

// The loader's whole job for one thread block: Q, then K and V of tiles n_tiles - 1 down to 0 (the order the MMA
// warpgroups visit them).
__device__ __forceinline__ void load_q_and_kv(const KVPipeline& pipe, qkv_t* sQ, qkv_t* sK, qkv_t* sV,
                                              const qkv_t* q_base, int64_t q_stride, int m0, int len_q,
                                              const qkv_t* k_base, int64_t k_stride, const qkv_t* v_base,
                                              int64_t v_stride, int len_kv, int n_tiles) {
  const int tid = threadIdx.x;
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  cp_async_commit();
  publish_lagging(pipe, 0);  // (lag 0 only)
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN;
    const int s = KVPipeline::stage(step);
    pipe.acquire_k(step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sK + s * kKTileElems, k_base, k_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_lagging(pipe, 1 + 2 * step);
    pipe.acquire_v(step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sV + s * kVTileElems, v_base, v_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_lagging(pipe, 2 + 2 * step);
  }
  publish_pending(2 * n_tiles, [&](auto newest, int h) { publish_group<decltype(newest)::value>(pipe, h); });
}
#endif
