// The shared-memory pipeline between the load warpgroup and the two MMA warpgroups of the warp-specialized Hopper
// kernel (attention_sm90.cu): a "full" mbarrier for the Q tile and per K/V stage (the loader's arrivals: its copies
// have landed and are visible to wgmma) and an "empty" one for the Q tile and per K/V stage (the MMA threads'
// arrivals: their wgmmas no longer read it). Stage s of tile step i is i % kStages, its round i / kStages; the steps
// of a block's query tiles are counted on from one tile to the next; the Q tile's round is the query tile's index in
// the block. A waiter names the round's phase by its parity.
#pragma once
#include "common/mbarrier.cuh"
#include "attention_config.cuh"

// Query tiles a block computes (attention_sm90.cu: query_tile_of_block; the plan's QUERY_TILES_PER_BLOCK): two by
// default, one with a mask, whose loads need the MMA warpgroups' 240 registers (the loader's 24 that leaves are too
// few for the chain over two tiles: 8 B of spills).
#ifndef QUERY_TILES_PER_BLOCK
#error "the warp-specialized kernel needs QUERY_TILES_PER_BLOCK (plan_attention sets it)"
#endif
constexpr int kQueryTilesPerBlock = QUERY_TILES_PER_BLOCK;
static_assert(kQueryTilesPerBlock == 1 || (kQueryTilesPerBlock == 2 && MASK_KIND == MASK_NONE),
              "QUERY_TILES_PER_BLOCK: 1, or 2 without a mask");
constexpr int kLoadThreads = 128;          // the load warpgroup (warps 0-3)
constexpr int kMmaThreads = kThreads;      // the MMA warpgroups (NUM_WARPS warps from warp 4 on)
constexpr int kPipelineBarriers = 2 + 4 * kStages;
constexpr int kPipelineBytes = kPipelineBarriers * 8;

struct KVPipeline {
  uint32_t base;  // shared address of kPipelineBarriers 8-byte mbarriers: full Q, full K[s], full V[s], empty K[s],
                  // empty V[s], empty Q

  __device__ __forceinline__ uint32_t full_q() const { return base; }
  __device__ __forceinline__ uint32_t full_k(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t full_v(int s) const { return base + 8 * (1 + kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return base + 8 * (1 + 2 * kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return base + 8 * (1 + 3 * kStages + s); }
  __device__ __forceinline__ uint32_t empty_q() const { return base + 8 * (1 + 4 * kStages); }

  // One thread initializes; the block syncs before anyone uses the barriers.
  __device__ __forceinline__ void init() const {
    mbarrier_init(full_q(), kLoadThreads);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full_k(s), kLoadThreads);
      mbarrier_init(full_v(s), kLoadThreads);
      mbarrier_init(empty_k(s), kMmaThreads);
      mbarrier_init(empty_v(s), kMmaThreads);
    }
    mbarrier_init(empty_q(), kMmaThreads);
  }
  static __device__ __forceinline__ int stage(int step) { return step % kStages; }
  static __device__ __forceinline__ uint32_t parity(int step) { return (step / kStages) & 1; }

  // Loader: wait until the stage tile `step` goes into is free (the first round passes at once).
  __device__ __forceinline__ void acquire_k(int step) const { mbarrier_wait(empty_k(stage(step)), parity(step) ^ 1); }
  __device__ __forceinline__ void acquire_v(int step) const { mbarrier_wait(empty_v(stage(step)), parity(step) ^ 1); }
  // MMA threads: wait until tile `step` has landed.
  __device__ __forceinline__ void wait_k(int step) const { mbarrier_wait(full_k(stage(step)), parity(step)); }
  __device__ __forceinline__ void wait_v(int step) const { mbarrier_wait(full_v(stage(step)), parity(step)); }
  // Q tile `round` of the block (0, 1, ...): the loader waits (round > 0) until the previous one is no longer read;
  // the MMA threads wait until it has landed, and release it after their last Q K^T.
  __device__ __forceinline__ void acquire_q(int round) const { mbarrier_wait(empty_q(), (round - 1) & 1); }
  __device__ __forceinline__ void wait_q(int round) const { mbarrier_wait(full_q(), round & 1); }
  __device__ __forceinline__ void release_q() const {
    if (kQueryTilesPerBlock > 1) mbarrier_arrive(empty_q());  // else no later Q tile waits for it
  }
  // MMA threads: done reading tile `step`'s stage.
  __device__ __forceinline__ void release_k(int step) const { mbarrier_arrive(empty_k(stage(step))); }
  __device__ __forceinline__ void release_v(int step) const { mbarrier_arrive(empty_v(stage(step))); }
};
