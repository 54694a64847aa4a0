// The shared-memory pipeline between the load warpgroup and the MMA warpgroups of the warp-specialized Hopper
// kernel (attention_sm90.cu): one "full" mbarrier per Q tile and per K/V stage (the loader's arrivals: its copies
// have landed and are visible to wgmma) and one "empty" mbarrier per K/V stage (the MMA threads' arrivals: their
// wgmmas no longer read it). Stage s of tile step i is i % kStages, its round i / kStages; a waiter names the
// round's phase by its parity. The FP8 split loader (FP8_COPY_WARPS) adds a "full" and an "empty" mbarrier per V
// staging tile between its copy warps and its transpose warps (attention_load_sm90.cuh).
#pragma once
#include "common/mbarrier.cuh"
#include "attention_config.cuh"

constexpr int kLoadThreads = 128;          // the load warpgroup (warps 0-3)
constexpr int kMmaThreads = kThreads;      // the MMA warpgroups (NUM_WARPS warps from warp 4 on)
constexpr int kMmaWarpgroups = kMmaThreads / 128;  // 2 (128-row tiles) or 3 (192-row tiles)

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

// Tuning FP8_COPY_WARPS: 0 (default) every loader warp copies K and V and transposes V; 1 or 2: that many warps copy
// Q, K and V and hand K over as it lands, the other loader warps transpose V (the split loader: K never waits
// behind a V transpose).
#ifndef FP8_COPY_WARPS
#define FP8_COPY_WARPS 0
#endif
static_assert(FP8_COPY_WARPS >= 0 && FP8_COPY_WARPS <= 2 && (FP8 || FP8_COPY_WARPS == 0),
              "FP8_COPY_WARPS: 0, 1 or 2, FP8 only");
constexpr bool kSplitLoader = FP8_COPY_WARPS > 0;
constexpr int kCopyThreads = kSplitLoader ? 32 * FP8_COPY_WARPS : kLoadThreads;      // arrive on K's full barriers
constexpr int kTransposeThreads = kSplitLoader ? kLoadThreads - kCopyThreads : kLoadThreads;  // on V's
constexpr int kPipelineBarriers = 1 + 4 * kStages + (kSplitLoader ? 2 * kVStagingTiles : 0);
constexpr int kPipelineBytes = kPipelineBarriers * 8;

struct KVPipeline {
  uint32_t base;  // shared address of kPipelineBarriers 8-byte mbarriers: full Q, full K[s], full V[s], empty K[s],
                  // empty V[s]

  __device__ __forceinline__ uint32_t full_q() const { return base; }
  __device__ __forceinline__ uint32_t full_k(int s) const { return base + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t full_v(int s) const { return base + 8 * (1 + kStages + s); }
  __device__ __forceinline__ uint32_t empty_k(int s) const { return base + 8 * (1 + 2 * kStages + s); }
  __device__ __forceinline__ uint32_t empty_v(int s) const { return base + 8 * (1 + 3 * kStages + s); }
  // split loader: V staging tile j landed (the copy warps' arrivals) / read by the transpose (the transpose warps')
  __device__ __forceinline__ uint32_t staging_full(int j) const { return base + 8 * (1 + 4 * kStages + j); }
  __device__ __forceinline__ uint32_t staging_empty(int j) const {
    return base + 8 * (1 + 4 * kStages + kVStagingTiles + j);
  }

  // One thread initializes; the block syncs before anyone uses the barriers.
  __device__ __forceinline__ void init() const {
    mbarrier_init(full_q(), kLoadThreads);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full_k(s), kCopyThreads);
      mbarrier_init(full_v(s), kTransposeThreads);
      mbarrier_init(empty_k(s), kMmaThreads);
      mbarrier_init(empty_v(s), kMmaThreads);
    }
    for (int j = 0; kSplitLoader && j < kVStagingTiles; ++j) {
      mbarrier_init(staging_full(j), kCopyThreads);
      mbarrier_init(staging_empty(j), kTransposeThreads);
    }
  }
  static __device__ __forceinline__ int stage(int step) { return step % kStages; }
  static __device__ __forceinline__ uint32_t parity(int step) { return (step / kStages) & 1; }

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
