// The tensor-core products of one reduction tile with Hopper's asynchronous warpgroup MMAs (WGMMA = 1: sm_90a,
// 16-byte loads, whole warpgroups), read straight from the swizzled tiles through matrix descriptors (the kernel's
// XOR swizzle is wgmma's 64/128-byte swizzle: K-major rows of kRowBytes, 8-row groups 8 * kRowBytes apart). Warpgroup
// w of a group owns rows w * BLOCK_M / warpgroups.. of the tile and every column. One tile's MMAs stay in flight while
// the next tile is waited for and issued (wait_group 1), so loads run STAGES - 2 tiles ahead. The accumulators keep
// the m16n8 fragment layout per warp, so split groups and the epilogue are shared with the mma.sync path.
#pragma once
#include "common/smem.cuh"
#include "common/wgmma.cuh"
#include "implicit_gemm_config.cuh"

// Issue one tile's warpgroup MMAs (A: this warpgroup's rows of the A tile, B: the W tile) as one commit group; they
// run asynchronously until a later wgmma_wait.
__device__ __forceinline__ void wgmma_tile_issue(float (&acc)[kMI][kNI][4], const unsigned char* a_tile,
                                                 const unsigned char* b_tile, int warpgroup) {
  const uint64_t b_desc = smem_desc<kRowBytes>(smem_addr(b_tile), 16, 8 * kRowBytes);
  const unsigned char* a_rows = a_tile + warpgroup * kWgRows * kRowBytes;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) fence_operands(acc[mi]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kRowBytes / 32; ++kk)  // a 32-byte k-step moves the descriptors' start by 2 (16-byte units)
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
      wgmma_ss<BLOCK_N, 1>(acc[mi], smem_desc<kRowBytes>(smem_addr(a_rows + mi * 64 * kRowBytes), 16, 8 * kRowBytes) +
                                        2 * kk, b_desc + 2 * kk);
  wgmma_commit();
}

// Wait until at most PENDING of this warpgroup's tile MMA groups are still running.
template <int PENDING>
__device__ __forceinline__ void wgmma_tile_wait(float (&acc)[kMI][kNI][4]) {
  wgmma_wait<PENDING>();
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) fence_operands(acc[mi]);
}
