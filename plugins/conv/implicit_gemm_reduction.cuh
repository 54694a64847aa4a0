// Reductions of the accumulators across warps and CTAs that share one output tile.
//
// SPLIT_K > 1: the CTA holds SPLIT_K groups of WARPS_M x WARPS_N warps on the same output tile, group g taking
// reduction tiles g, g + SPLIT_K, ... through its own pipeline (own stages, own named barrier); the groups'
// accumulators are summed through shared memory before the epilogue. More warps per output tile hide the load latency
// of deep, narrow layers (3x3 over 256+ channels at 7x7/14x14) without a workspace or second kernel.
// CLUSTER_K > 1 (sm_90): the reduction is split over a thread-block cluster of CLUSTER_K CTAs along grid.z (a
// compile-time cluster shape, so the launch itself is plain); CTA rank r takes the r-th contiguous slice of the
// reduction tiles, and rank 0 sums the others' partial tiles from their shared memory (DSMEM) before the epilogue
// (sum_cluster_partials; the other CTAs return).
// Deep layers with few output tiles (3x3 over 512 channels at 7x7) fill the GPU without a workspace.
#pragma once
#include "implicit_gemm_config.cuh"
#include "common/cluster.cuh"

// The kernels' compile-time cluster shape: CLUSTER_K CTAs along grid.z.
#if CLUSTER_K > 1
#define CLUSTER_ATTRIBUTE __cluster_dims__(1, 1, CLUSTER_K)
#else
#define CLUSTER_ATTRIBUTE
#endif

// A group's accumulators as one partial tile in shared memory, in fragment order (consecutive threads, consecutive
// words: conflict-free), for the split groups' and the cluster's sums.
constexpr int kAccRegs = kMI * kNI * 4;  // accumulators per thread
__device__ __forceinline__ void clear_accumulators(float (&acc)[kMI][kNI][4]) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) (&acc[0][0][0])[i] = 0.f;
}
__device__ __forceinline__ void store_partial(const float (&acc)[kMI][kNI][4], float* partial, int group_tid) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) partial[i * kGroupThreads + group_tid] = (&acc[0][0][0])[i];
}
__device__ __forceinline__ void add_partial(float (&acc)[kMI][kNI][4], const float* partial, int group_tid) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) (&acc[0][0][0])[i] += partial[i * kGroupThreads + group_tid];
}

// Sum the split groups' partial accumulators into group 0's (SPLIT_K > 1; nothing otherwise).
__device__ __forceinline__ void sum_split_groups(float (&acc)[kMI][kNI][4], unsigned char* smem, int group,
                                                 int group_tid) {
#if SPLIT_K > 1
  float* partial = reinterpret_cast<float*>(smem);
  if (group > 0) store_partial(acc, partial + (group - 1) * kAccRegs * kGroupThreads, group_tid);
  __syncthreads();
  if (group == 0)
#pragma unroll
    for (int s = 0; s < SPLIT_K - 1; ++s)
      add_partial(acc, partial + s * kAccRegs * kGroupThreads, group_tid);
  __syncthreads();
#endif
}

// CLUSTER_K > 1: sum the cluster's partial tiles into rank 0's accumulators through distributed shared memory; the
// other CTAs wait until rank 0 has read their shared memory. Every thread of every CTA in the cluster calls it
// (cluster barriers); `holder` threads own the tile's accumulators (holder_tid: index among the kGroupThreads).
// Returns whether this CTA goes on to the epilogue (rank 0; always without a cluster).
__device__ __forceinline__ bool sum_cluster_partials(float (&acc)[kMI][kNI][4], unsigned char* smem, int rank,
                                                     bool holder, int holder_tid) {
#if CLUSTER_K > 1
  float* partial = reinterpret_cast<float*>(smem);
  if (rank > 0 && holder) store_partial(acc, partial, holder_tid);
  cluster_sync();
  if (rank == 0 && holder)
#pragma unroll 1
    for (int r = 1; r < CLUSTER_K; ++r) {
      const unsigned remote = cluster_address(partial, r);
#pragma unroll
      for (int i = 0; i < kAccRegs; ++i)
        (&acc[0][0][0])[i] += load_cluster(remote + 4 * (i * kGroupThreads + holder_tid));
    }
  cluster_sync();
#endif
  return rank == 0;
}

// The cluster barriers of sum_cluster_partials, for threads that hold no accumulators (the warp-specialized kernel's
// load warpgroup): every thread of the cluster takes part in both.
__device__ __forceinline__ void join_cluster_sum() {
#if CLUSTER_K > 1
  cluster_sync();
  cluster_sync();
#endif
}
