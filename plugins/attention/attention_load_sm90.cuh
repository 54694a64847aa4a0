// The load warpgroup of the warp-specialized Hopper kernel: cp.async copies of Q once and of K/V tile by tile into
// the 128-byte-swizzled stages the wgmma descriptors read (attention_mainloop_sm90.cuh describes the layout), each
// handed to the MMA warpgroups through the pipeline's "full" mbarriers.
//
// Why cp.async and not TMA: the AOT ABI passes no host-built tensor map, and a device-built one needs a global
// buffer per launch; cp.async needs neither. A copy becomes visible to wgmma (async proxy) only after the copying
// thread has seen it land and run fence.proxy.async, so each loader thread waits for its own copy groups with one
// group of lag (K(i) is signalled once V(i) is in flight, V(i) once K(i + 1) is) and then arrives.
#pragma once
#include "attention_pipeline_sm90.cuh"
#include "attention_mainloop_sm90.cuh"

// This loader thread's copies so far, all but the newest group, have landed: make them visible to wgmma, then
// count this thread's arrival on `full`.
__device__ __forceinline__ void publish_all_but_newest(uint32_t full) {
  cp_async_wait<1>();
  fence_async_proxy();
  mbarrier_arrive(full);
}

// The loader's whole job for one thread block: Q, then K and V of tiles n_tiles - 1 down to 0 (the order the MMA
// warpgroups visit them).
__device__ __forceinline__ void load_q_and_kv(const KVPipeline& pipe, elem_t* sQ, elem_t* sK, elem_t* sV,
                                              const elem_t* q_base, int64_t q_stride, int m0, int len_q,
                                              const elem_t* k_base, int64_t k_stride, const elem_t* v_base,
                                              int64_t v_stride, int len_kv, int n_tiles) {
  const int tid = threadIdx.x;
  load_tile_swizzled<kBlockM, kLoadThreads>(sQ, q_base, q_stride, m0, len_q, tid);
  cp_async_commit();
  for (int step = 0; step < n_tiles; ++step) {
    const int n0 = (n_tiles - 1 - step) * kBlockN;
    const int s = KVPipeline::stage(step);
    pipe.acquire_k(step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sK + s * kKTileElems, k_base, k_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_all_but_newest(step == 0 ? pipe.full_q() : pipe.full_v(KVPipeline::stage(step - 1)));
    pipe.acquire_v(step);
    load_tile_swizzled<kBlockN, kLoadThreads>(sV + s * kVTileElems, v_base, v_stride, n0, len_kv, tid);
    cp_async_commit();
    publish_all_but_newest(pipe.full_k(s));
  }
  cp_async_wait<0>();
  fence_async_proxy();
  mbarrier_arrive(n_tiles == 0 ? pipe.full_q() : pipe.full_v(KVPipeline::stage(n_tiles - 1)));
}
