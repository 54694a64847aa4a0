// Reductions of the accumulators across warps and CTAs that share one output tile.
//
// SPLIT_K > 1: the CTA holds SPLIT_K groups of WARPS_M x WARPS_N warps on the same output tile, group g taking
// reduction tiles g, g + SPLIT_K, ... through its own pipeline (own stages, own named barrier); the groups'
// accumulators are summed through shared memory before the epilogue. More warps per output tile hide the load latency
// of deep, narrow layers (3x3 over 256+ channels at 7x7/14x14) without a workspace or second kernel.
// CLUSTER_K > 1 (sm_90): the reduction is split over a thread-block cluster of CLUSTER_K CTAs along grid.z (a
// compile-time cluster shape, so the launch itself is plain); CTA rank r takes the r-th contiguous slice of the
// reduction tiles, and rank 0 sums the others' partial tiles from their shared memory (DSMEM) before the epilogue
// (in the kernel body, where the other CTAs return; store_partial lays out their partial tiles).
// Deep layers with few output tiles (3x3 over 512 channels at 7x7) fill the GPU without a workspace.
#pragma once
#include "implicit_gemm_config.cuh"

// A group's accumulators as one partial tile in shared memory, in fragment order (consecutive threads, consecutive
// words: conflict-free), for the split groups' and the cluster's sums.
constexpr int kAccRegs = kMI * kNI * 4;  // accumulators per thread
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
