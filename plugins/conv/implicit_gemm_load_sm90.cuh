// The load warpgroup of the warp-specialized Hopper implicit GEMM: the cp.async TileLoader (implicit_gemm_load.cuh:
// im2col rows of X and W rows in 16-byte chunks, zero-filled outside the image) run by 128 threads, each tile handed
// to the MMA warpgroups through the ring's "full" mbarriers.
//
// Why cp.async and not TMA: the AOT plugin ABI passes no host-built tensor map; a device-built one (tensormap.replace)
// needs a global buffer per plugin node that concurrent launches of the same engine would share, and TMA's im2col
// mode needs the padding and the filter offsets in the descriptor. cp.async needs neither. Each loader thread
// follows a tile's copies with cp.async.mbarrier.arrive on the tile's full barrier: the hardware arrives when the
// copies have landed, so a hand-over never waits for the loader to get to a later tile (waiting for its own copies
// would tie it to a stage the MMA warps free later). The MMA warps fence the landed tile for wgmma (async proxy)
// after their wait (mma_ring_tiles).
#pragma once
#include "implicit_gemm_load.cuh"
#include "implicit_gemm_pipeline_sm90.cuh"

typedef AsyncTileLoader<kLoadThreads, kWShare> RingLoader;

#if SHARE_W
// SHARE_W: a thread pushes its W half of tile i to the other CTA once its copies of tile i + kPushLag are issued (it
// then waits for its tile-i copies alone: a cp.async group per tile); the other CTA's MMAs on tile i wait for the push.
// The lag stays below STAGES - 1 so that neither loader waits for a stage the other's MMAs free only after that push.
constexpr int kPushLag = STAGES >= 4 ? 2 : 1;
static_assert(STAGES >= kPushLag + 2, "SHARE_W: the ring must be deeper than the push lag + 1");
#endif

// The loader's whole job: reduction tiles 0..k_tiles-1 (tile i starts at reduction index k0_of(i)) into the ring
// (SHARE_W: this CTA's W half into the other CTA's ring too; `peer_stages` is its ring's shared::cluster address).
template <typename K0Of>
__device__ __forceinline__ void load_tiles(const TileRing& ring, unsigned char* stages, RingLoader& loader,
                                           int k_tiles, K0Of k0_of, const x_t* x, const op_t* w, int H, int W,
                                           int x_stride, int Cg, int Kgemm, const FastDivmod& cg_div,
                                           uint32_t peer_stages = 0) {
#if SHARE_W
  const auto push = [&](int tile) {
    loader.push_w(stages + TileRing::stage(tile) * kStageBytes, peer_stages + TileRing::stage(tile) * kStageBytes,
                  ring.peer_full(tile));
  };
#endif
  RingSlot slot;
#pragma unroll 1
  for (int i = 0; i < k_tiles; ++i, slot.next()) {
    ring.acquire(slot);
#if SHARE_W
    if (threadIdx.x == 0) ring.expect_peer_w(slot, RingLoader::kWPartBytes);
#endif
    loader.fetch(stages + slot.stage * kStageBytes, k0_of(i), x, w, H, W, x_stride, Cg, Kgemm, cg_div);
    ring.publish_when_landed(slot);
#if SHARE_W
    cp_async_commit();
    if (i >= kPushLag) {
      cp_async_wait<kPushLag>();
      push(i - kPushLag);
    }
#endif
  }
  // Copies still in flight when the thread leaves: wait for them (the arrivals are already on their way).
  cp_async_commit();
  cp_async_wait<0>();
#if SHARE_W
#pragma unroll 1
  for (int i = k_tiles > kPushLag ? k_tiles - kPushLag : 0; i < k_tiles; ++i) push(i);
#endif
}
