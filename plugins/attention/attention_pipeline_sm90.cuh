// The shared-memory pipeline between the load warpgroup and the two MMA warpgroups of the warp-specialized Hopper
// kernel (attention_sm90.cu): one "full" mbarrier per Q buffer and per K/V stage (the loader's arrivals: its copies
// have landed and are visible to wgmma) and one "empty" mbarrier per Q buffer and per K/V stage (the MMA threads'
// arrivals: their wgmmas no longer read it). A persistent CTA computes several query tiles, so the K/V steps are
// counted on across its tiles and its j-th tile's Q goes into buffer j % kQStages. Stage s of step i is i % kStages,
// its round i / kStages; a waiter names the round's phase by its parity.
#pragma once
#include "common/mbarrier.cuh"
#include "attention_config.cuh"

constexpr int kLoadThreads = 128;          // the load warpgroup (warps 0-3)
constexpr int kMmaThreads = kThreads;      // the MMA warpgroups (NUM_WARPS warps from warp 4 on)
// Q buffers: with two, the next tile's Q loads while the current tile still reads its own (the plan gives two where
// shared memory allows); with one, the next Q loads once both MMA warpgroups have issued their last Q K^T.
constexpr int kQStages = Q_STAGES;
static_assert(kQStages == 1 || kQStages == 2, "Q_STAGES: 1 or 2 Q buffers");
constexpr int kPipelineBarriers = 2 * kQStages + 4 * kStages;
constexpr int kPipelineBytes = kPipelineBarriers * 8;

struct KVPipeline {
  uint32_t base;  // shared address of kPipelineBarriers 8-byte mbarriers: full K[s], full V[s], empty K[s],
                  // empty V[s], full Q[j], empty Q[j]

  __device__ __forceinline__ uint32_t full_k(int s) const { return base + 8 * s; }
  __device__ __forceinline__ uint32_t full_v(int s) const { return base + 8 * (kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return base + 8 * (2 * kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return base + 8 * (3 * kStages + s); }
  // the Q buffer of the CTA's `round`-th query tile
  __device__ __forceinline__ uint32_t full_q(int round) const { return base + 8 * (4 * kStages + round % kQStages); }
  __device__ __forceinline__ uint32_t empty_q(int round) const {
    return base + 8 * (4 * kStages + kQStages + round % kQStages);
  }

  // One thread initializes; the block syncs before anyone uses the barriers.
  __device__ __forceinline__ void init() const {
    for (int j = 0; j < kQStages; ++j) {
      mbarrier_init(full_q(j), kLoadThreads);
      mbarrier_init(empty_q(j), kMmaThreads);
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
  // MMA threads: wait until Q of query tile `round` has landed; release it once their last Q K^T has completed.
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
