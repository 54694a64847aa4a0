// FP8: where the loader stages V as copied, before its transpose into V^T (attention_v_transpose_sm90.cuh).
//
// Two forms (tuning V_BULK_COPY):
// - 0 (default): cp.async, 16 bytes a thread at a time, into K's 128-byte-swizzled layout (swizzled_chunk); every
//   loader thread copies part of every key row, so the loader warps meet at a named barrier before the transpose
//   (all rows landed) and before the next copy into a staging tile (all transposes out of it done).
// - 1: one cp.async.bulk per key row (the TMA unit moves the row; the warp issues one instruction for it where
//   cp.async takes HEAD_DIM / 16 lane-copies with their address and bounds work). A bulk copy cannot swizzle, and
//   rows of HEAD_DIM contiguous bytes would put the 8 keys an ldmatrix.trans matrix reads on one bank group (8-way
//   conflicts). So key k goes to row class k % 8: class c holds keys c, c + 8, c + 16, .. contiguously from
//   c * (kBlockN / 8 * HEAD_DIM + 16): the 16-byte shift a class puts 8 consecutive keys on 8 distinct 16-byte bank
//   groups (kBlockN / 8 * HEAD_DIM is a multiple of 128), at 128 bytes a tile (padding every row by 16 bytes would
//   not fit hd256's two staging tiles). Each loader warp owns kBlockN / 4 consecutive keys: it copies them, counts
//   them on its own "staging full" mbarrier per staging tile, and transposes them, so no loader warp waits for
//   another (no named barriers). Rows past the keys are zero-filled by the warp's lanes (no NaN into P V).
#pragma once
#include "attention_mainloop_sm90.cuh"
#include "common/bulk_copy.cuh"
#include "common/elect.cuh"
#include "common/mbarrier.cuh"

static_assert(FP8, "V staging is for the FP8 V transpose");
#ifndef V_BULK_COPY
#define V_BULK_COPY 0
#endif
constexpr bool kVBulkCopy = V_BULK_COPY;
constexpr int kStagingWarps = 4;                          // the load warpgroup
constexpr int kStagingKeysPerWarp = kBlockN / kStagingWarps;
static_assert(!kVBulkCopy || kStagingKeysPerWarp % 16 == 0, "V_BULK_COPY: whole 16-key groups a loader warp");
constexpr int kStagingClassBytes = kBlockN / 8 * kHeadDim + 16;  // one row class (bulk form)
static_assert(!kVBulkCopy || (kStagingClassBytes - 16) % 128 == 0, "row classes start on 128-byte bank lines");
constexpr int kVStagingTileBytes = kVBulkCopy ? 8 * kStagingClassBytes : kVTileElems;

// Byte offset of head-dim chunk `chunk` (16 bytes) of key `key` in a staging tile (bulk form).
__device__ __forceinline__ int staging_offset(int key, int chunk) {
  return (key % 8) * kStagingClassBytes + (key / 8) * kHeadDim + chunk * 16;
}

// Shared address of head-dim chunk `chunk` of key `key` in a staging tile at shared address `tile`.
__device__ __forceinline__ uint32_t staging_chunk(uint32_t tile, int key, int chunk) {
  if constexpr (kVBulkCopy) return tile + staging_offset(key, chunk);
  else return swizzled_chunk<kBlockN>(tile, key, chunk);
}

// Bulk form: warp `warp` (all its lanes, converged; `warp` warp-uniform to the compiler) copies its keys of the tile
// starting at key n0 into the staging tile `staging`, counted on `bar`; keys >= len are zero-filled instead (generic
// stores, ordered before the bulk copies that later overwrite them by the fence.proxy.async after the warp's
// transpose). The warp's transposes out of this staging tile are done (their values were stored before this call).
__device__ __forceinline__ void stage_v_rows_bulk(qkv_t* staging, const qkv_t* v_base, int64_t v_stride, int n0,
                                                  int len, uint32_t bar, int warp) {
  constexpr int kChunks = kHeadDim / 16;
  const int valid = min(max(len - n0 - warp * kStagingKeysPerWarp, 0), kStagingKeysPerWarp);
  if (valid < kStagingKeysPerWarp) {  // (the tile past the last key only)
    for (int i = valid * kChunks + threadIdx.x % 32; i < kStagingKeysPerWarp * kChunks; i += 32) {
      const int key = warp * kStagingKeysPerWarp + i / kChunks;
      *reinterpret_cast<uint4*>(staging + staging_offset(key, i % kChunks)) = make_uint4(0, 0, 0, 0);
    }
    __syncwarp();  // the zeros before the arrival that releases them to the warp's waiters
  }
  if (elect_one_sync()) {
    // key 8 i + c of the warp (c = key % 8: its row class) at class c's row warp * kStagingKeysPerWarp / 8 + i
    const uint32_t rows = smem_addr(staging) + warp * (kStagingKeysPerWarp / 8) * kHeadDim;
    const qkv_t* src = v_base + static_cast<int64_t>(n0 + warp * kStagingKeysPerWarp) * v_stride;
    auto copy_row = [&](int r) {
      bulk_copy_to_shared(rows + (r % 8) * kStagingClassBytes + (r / 8) * kHeadDim, src, kHeadDim, bar);
      src += v_stride;
    };
    mbarrier_arrive_expect_tx(bar, valid * kHeadDim);
    if (valid == kStagingKeysPerWarp) {  // unrolled: constant destination offsets, no per-row test
#pragma unroll
      for (int r = 0; r < kStagingKeysPerWarp; ++r) copy_row(r);
    } else {
#pragma unroll 1
      for (int r = 0; r < valid; ++r) copy_row(r);
    }
  }
}
