// The tensor-core products of one reduction tile with Hopper's asynchronous warpgroup MMAs (WGMMA = 1: sm_90a,
// 16-byte loads, whole warpgroups), read straight from the swizzled tiles through matrix descriptors (the kernel's
// XOR swizzle is wgmma's 64/128-byte swizzle: K-major rows of kRowBytes, 8-row groups 8 * kRowBytes apart). Warpgroup
// w of a group owns rows w * BLOCK_M / warpgroups.. of the tile and every column. One tile's MMAs stay in flight while
// the next tile is waited for and issued (wait_group 1), so loads run STAGES - 2 tiles ahead. The accumulators keep
// the m16n8 fragment layout per warp, so split groups and the epilogue are shared with the mma.sync path.
// WARP_SPECIALIZED = 1 (implicit_gemm_sm90.cu): the MMA warpgroups take their tiles from the load warpgroup's ring
// (mma_ring_tiles) instead of loading them themselves.
#pragma once
#include "common/cp_async.cuh"
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

// The interface both main loops give the kernel (as implicit_gemm_mainloop.cuh's).
// All but the kNewest most recent tile loads have landed in this thread's stages, and this thread's tile writes are
// visible to wgmma (async proxy); the caller then syncs the group.
template <int kNewest>
__device__ __forceinline__ void wait_tiles_landed() {
  cp_async_wait<kNewest>();
  fence_async_proxy();
}

// A tile's MMAs in two steps around the FP8 quantize of the next tile: issue them; then wait for the previous tile's
// (one tile stays in flight; its stage may be loaded after the next barrier).
__device__ __forceinline__ void mma_tile_begin(float (&acc)[kMI][kNI][4], const unsigned char* a_tile,
                                               const unsigned char* b_tile, int warp) {
  wgmma_tile_issue(acc, a_tile, b_tile, warp >> 2);
}
__device__ __forceinline__ void mma_tile_end(float (&acc)[kMI][kNI][4], const unsigned char*, const unsigned char*,
                                             int, int, int) {
  wgmma_tile_wait<1>(acc);
}
// Every MMA has finished (the accumulators are final).
__device__ __forceinline__ void mma_drain(float (&acc)[kMI][kNI][4]) { wgmma_tile_wait<0>(acc); }

#if WARP_SPECIALIZED
#include "implicit_gemm_pipeline_sm90.cuh"

// The MMA warpgroups' main loop of the warp-specialized kernel: for each of k_tiles ring tiles, wait until it has
// landed (and fence it for the async proxy), issue its MMAs on this warpgroup's rows, wait for the previous tile's (one tile stays in flight) and hand
// that tile's stage back to the loader. Returns with the accumulators final.
__device__ __forceinline__ void mma_ring_tiles(float (&acc)[kMI][kNI][4], const TileRing& ring,
                                               const unsigned char* stages, int k_tiles, int warpgroup, int lane) {
  RingSlot slot, previous;
#pragma unroll 1
  for (int i = 0; i < k_tiles; ++i) {
    ring.wait(slot);
    fence_async_proxy();  // the loader's cp.async writes (generic proxy), now visible here, ordered before wgmma's reads
    const unsigned char* stage = stages + slot.stage * kStageBytes;
    wgmma_tile_issue(acc, stage, stage + kAStageBytes, warpgroup);
    wgmma_tile_wait<1>(acc);
    if (i > 0 && lane == 0) ring.release(previous);
    previous = slot;
    slot.next();
  }
  wgmma_tile_wait<0>(acc);
}
#endif
