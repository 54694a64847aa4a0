// The shared-memory pipeline between the load warpgroup and the MMA warpgroups of the warp-specialized Hopper
// kernel (attention_sm90.cu): one "full" mbarrier per Q buffer and per K/V stage (the loader's arrivals: its copies
// have landed and are visible to wgmma) and one "empty" mbarrier per K/V stage (the MMA threads' arrivals: their
// wgmmas no longer read it). Stage s of tile step i is i % kStages, its round i / kStages; a waiter names the
// round's phase by its parity. A persistent CTA (PERSISTENT_CTAS) counts K/V steps on across its query tiles, puts
// its r-th tile's Q into buffer r % kQStages and has an "empty" mbarrier per Q buffer too (the MMA threads release Q
// after their tile's last Q K^T, so the loader fetches the next tile's Q during that tile's tail).
#pragma once
#include "common/mbarrier.cuh"
#include "attention_config.cuh"

constexpr int kLoadThreads = 128;          // the load warpgroup (warps 0-3)
constexpr int kMmaThreads = kThreads;      // the MMA warpgroups (NUM_WARPS warps from warp 4 on)
constexpr int kMmaWarpgroups = kMmaThreads / 128;  // 2 (128-row tiles) or 3 (192-row tiles)
#ifndef PERSISTENT_CTAS
#define PERSISTENT_CTAS 0  // set by the plan (attention_persistent_scheduler_sm90.cuh): 0 = one CTA a query tile
#endif
constexpr bool kPersistent = PERSISTENT_CTAS > 0;
#ifndef Q_STAGES
#define Q_STAGES 1  // set by the plan for the persistent grid: 2 where a second Q tile fits beside the K/V stages
#endif
constexpr int kQStages = Q_STAGES;
static_assert(kQStages == 1 || (kQStages == 2 && kPersistent), "Q_STAGES: 1, or 2 on the persistent grid");
// full Q(0), full/empty K/V per stage, then (persistent only) empty Q(0), full Q(1), empty Q(1)
constexpr int kPipelineBarriers = 1 + 4 * kStages + (kPersistent ? 2 * kQStages - 1 : 0);
constexpr int kPipelineBytes = kPipelineBarriers * 8;

struct KVPipeline {
  uint32_t base;  // shared address of kPipelineBarriers 8-byte mbarriers: full Q, full K[s], full V[s], empty K[s],
                  // empty V[s] (persistent: empty Q[0], full Q[1], empty Q[1])

  // the Q buffer of the CTA's `round`-th query tile
  __device__ __forceinline__ uint32_t full_q(int round = 0) const {
    return round % kQStages == 0 ? base : base + 8 * (2 + 4 * kStages);
  }
  __device__ __forceinline__ uint32_t empty_q(int round) const {
    return base + 8 * (1 + 4 * kStages + 2 * (round % kQStages));
  }
  __device__ __forceinline__ uint32_t full_k(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t full_v(int s) const { return base + 8 * (1 + kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return base + 8 * (1 + 2 * kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return base + 8 * (1 + 3 * kStages + s); }

  // One thread initializes; the block syncs before anyone uses the barriers.
  __device__ __forceinline__ void init() const {
    mbarrier_init(full_q(), kLoadThreads);
    if constexpr (kPersistent) {
      for (int j = 0; j < kQStages; ++j) {
        if (j > 0) mbarrier_init(full_q(j), kLoadThreads);
        mbarrier_init(empty_q(j), kMmaThreads);
      }
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full_k(s), kLoadThreads);
      mbarrier_init(full_v(s), kLoadThreads);
      mbarrier_init(empty_k(s), kMmaThreads);
      mbarrier_init(empty_v(s), kMmaThreads);
    }
  }
  static __device__ __forceinline__ int stage(int step) { return step % kStages; }
  static __device__ __forceinline__ uint32_t parity(int step) { return (step / kStages) & 1; }

  static __device__ __forceinline__ uint32_t q_parity(int round) { return (round / kQStages) & 1; }
  // Loader: wait until the Q buffer of query tile `round` is free (the first kQStages pass at once).
  __device__ __forceinline__ void acquire_q(int round) const { mbarrier_wait(empty_q(round), q_parity(round) ^ 1); }
  // MMA threads: wait until Q of query tile `round` has landed; release it after the tile's last Q K^T.
  __device__ __forceinline__ void wait_q(int round) const { mbarrier_wait(full_q(round), q_parity(round)); }
  __device__ __forceinline__ void release_q(int round) const { mbarrier_arrive(empty_q(round)); }
  // Loader: wait until the stage tile `step` goes into is free (the first round passes at once).
  __device__ __forceinline__ void acquire_k(int step) const { mbarrier_wait(empty_k(stage(step)), parity(step) ^ 1); }
  __device__ __forceinline__ void acquire_v(int step) const { mbarrier_wait(empty_v(stage(step)), parity(step) ^ 1); }
  // MMA threads: wait until tile `step` has landed.
  __device__ __forceinline__ void wait_k(int step) const { mbarrier_wait(full_k(stage(step)), parity(step)); }
  __device__ __forceinline__ void wait_v(int step) const { mbarrier_wait(full_v(stage(step)), parity(step)); }
  // MMA threads: done reading tile `step`'s stage.
  __device__ __forceinline__ void release_k(int step) const { mbarrier_arrive(empty_k(stage(step))); }
  __device__ __forceinline__ void release_v(int step) const { mbarrier_arrive(empty_v(stage(step))); }
};
