// The load warpgroup of the warp-specialized Hopper implicit GEMM: the cp.async TileLoader (implicit_gemm_load.cuh:
// im2col rows of X and W rows in 16-byte chunks, zero-filled outside the image) run by 128 threads, each tile handed
// to the MMA warpgroups through the ring's "full" mbarriers.
//
// Why cp.async and not TMA: the AOT plugin ABI passes no host-built tensor map; a device-built one (tensormap.replace)
// needs a global buffer per plugin node that concurrent launches of the same engine would share, and TMA's im2col
// mode needs the padding and the filter offsets in the descriptor. cp.async needs neither. A cp.async copy becomes
// visible to wgmma (async proxy) only after the copying thread has seen it land and run fence.proxy.async, so each
// loader thread publishes tile i once tile i + kPublishLag is issued (cp.async.wait_group kPublishLag): kPublishLag + 1
// tiles of copies stay in flight per thread.
#pragma once
#include "implicit_gemm_load.cuh"
#include "implicit_gemm_pipeline_sm90.cuh"
#include "common/wgmma.cuh"

constexpr int kPublishLag = STAGES >= 4 ? STAGES - 2 : 1;
static_assert(kPublishLag >= 1 && kPublishLag < STAGES, "publishing lag must leave the MMAs a stage");

typedef AsyncTileLoader<kLoadThreads> RingLoader;

// This thread's copies of every tile but the kNewest latest have landed: fence them for wgmma and publish `tile`.
template <int kNewest>
__device__ __forceinline__ void publish_landed(const TileRing& ring, int tile) {
  cp_async_wait<kNewest>();
  fence_async_proxy();
  ring.publish(tile);
}

// The loader's whole job: reduction tiles 0..k_tiles-1 (tile i starts at reduction index k0_of(i)) into the ring.
template <typename K0Of>
__device__ __forceinline__ void load_tiles(const TileRing& ring, unsigned char* stages, RingLoader& loader,
                                           int k_tiles, K0Of k0_of, const x_t* x, const op_t* w, int H, int W,
                                           int x_stride, int Cg, int Kgemm, const FastDivmod& cg_div) {
#pragma unroll 1
  for (int i = 0; i < k_tiles; ++i) {
    ring.acquire(i);
    loader.fetch(stages + TileRing::stage(i) * kStageBytes, k0_of(i), x, w, H, W, x_stride, Cg, Kgemm, cg_div);
    cp_async_commit();
    if (i >= kPublishLag) publish_landed<kPublishLag>(ring, i - kPublishLag);
  }
  cp_async_wait<0>();
  fence_async_proxy();
#pragma unroll 1
  for (int i = k_tiles > kPublishLag ? k_tiles - kPublishLag : 0; i < k_tiles; ++i) ring.publish(i);
}
