// The shared-memory ring between the load warpgroup and the MMA warpgroups of the warp-specialized Hopper
// implicit GEMM (implicit_gemm_sm90.cu): STAGES stages of one reduction tile each (A rows then W rows, the swizzled
// layout of implicit_gemm_config.cuh), each with a "full" mbarrier (every loader thread's arrival, made by the
// hardware once that thread's copies into the stage have landed) and an "empty" one (every MMA warp's arrival: its wgmmas no longer
// read the stage). Tile i sits in stage i % STAGES, round i / STAGES; a waiter names the round's phase by its parity.
// Both roles step a RingSlot tile by tile instead of dividing the tile index (at 6 stages the division costs each
// role's per-tile path about 6 instructions, a path the 64-row tiles' time follows: NOTES, session 10).
// SHARE_W = 1: the two CTAs of a cluster (adjacent M tiles, same W tile) each load half of W and push it into the
// other's stage (st.async): a full barrier also waits for the other half's bytes, and an empty barrier for both CTAs'
// MMA warps (a stage is written from both sides).
#pragma once
#include "common/cluster.cuh"
#include "common/cp_async.cuh"
#include "common/mbarrier.cuh"
#include "implicit_gemm_config.cuh"

#ifndef SHARE_W
#define SHARE_W 0
#endif
constexpr int kWShare = SHARE_W ? 2 : 1;  // CTAs sharing one W tile

constexpr int kLoadThreads = 128;                    // the load warpgroup (warps 0-3)
constexpr int kMmaThreads = kGroupThreads;           // the MMA warpgroups (WARPS_M x WARPS_N warps from warp 4 on)
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kBlockThreads = kLoadThreads + kMmaThreads;
constexpr int kRingOffset = 1024;                    // barriers in the first 1 KB; stages on 1024-byte boundaries
static_assert((kMmaThreads == 128 || kMmaThreads == 256 || kMmaThreads == 384) && SPLIT_K == 1, "one to three MMA "
              "warpgroups, one reduction group");
static_assert(!SHARE_W || CLUSTER_K == 1, "SHARE_W's cluster pairs M tiles: no cluster split of the reduction");
static_assert(2 * STAGES * 8 <= kRingOffset && kStageBytes % 1024 == 0, "ring layout");

// A tile's place in the ring: its stage and its round's parity, stepped from tile 0 (next(): the following tile).
struct RingSlot {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1;
    }
  }
};

struct TileRing {
  uint32_t base;  // shared address of 2 * STAGES 8-byte mbarriers: full[s], then empty[s]
  uint32_t peer;  // SHARE_W: the same barriers in the other CTA of the cluster (shared::cluster address)

  __device__ __forceinline__ uint32_t full(int s) const { return base + 8 * s; }
  __device__ __forceinline__ uint32_t empty(int s) const { return base + 8 * (STAGES + s); }

  // One thread initializes; the block (SHARE_W: the cluster) syncs before anyone uses the barriers.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(full(s), kLoadThreads);
      mbarrier_init(empty(s), kMmaWarps * kWShare);
    }
    if (SHARE_W) fence_mbarrier_init_cluster();
  }
  // Loader: wait until the slot's stage is free (the first round passes at once).
  __device__ __forceinline__ void acquire(const RingSlot& t) const { mbarrier_wait(empty(t.stage), t.phase ^ 1); }
  // Loader thread, after issuing its copies of the slot's tile: arrive on its full barrier once they have landed.
  __device__ __forceinline__ void publish_when_landed(const RingSlot& t) const { cp_async_arrive_on(full(t.stage)); }
  // MMA threads: wait until the slot's tile has landed.
  __device__ __forceinline__ void wait(const RingSlot& t) const { mbarrier_wait(full(t.stage), t.phase); }
  // One lane per MMA warp: the warp's wgmmas on the slot's tile have finished (SHARE_W: the other CTA may write the
  // stage too).
  __device__ __forceinline__ void release(const RingSlot& t) const {
    mbarrier_arrive(empty(t.stage));
    if (SHARE_W) mbarrier_arrive_cluster(peer + 8 * (STAGES + t.stage));
  }
#if SHARE_W
  // One loader thread, before its own arrival on the slot's tile: the tile's phase also waits for the other CTA's W
  // half.
  __device__ __forceinline__ void expect_peer_w(const RingSlot& t, uint32_t bytes) const {
    mbarrier_expect_tx(full(t.stage), bytes);
  }
  // SHARE_W's pushes run kPushLag tiles behind the loader's slot: the stage of a tile by its index.
  static __device__ __forceinline__ int stage(int tile) { return tile % STAGES; }
  // The other CTA's full barrier of `tile` (its W-half pushes count there).
  __device__ __forceinline__ uint32_t peer_full(int tile) const { return peer + 8 * stage(tile); }
#endif
};
