// Decode on the Hopper wgmma mainloop (WGMMA=1 with PACK_GQA, WARP_SPLIT and/or KV_SPLIT; sm_90a): the tile loads
// that GQA packing and key groups ask of attention.cu, in the swizzled layout of attention_mainloop_sm90.cuh. Why:
// a 16-row mma.sync warp ldmatrix-reads every K/V tile its key group streams, so 64 packed rows (16 queries x a
// GQA group of 4) read ~5 bytes of shared memory per K/V byte and stall there on small grids (NOTES.md, decode run
// 6); a warpgroup's wgmma reads each K and V tile once for its 64 rows (plus Q once per K tile): ~1.5 bytes.
// Each key group is one warpgroup (64 rows) with its own K/V stages; the products, softmax, split combine and
// epilogue are the shared ones (the wgmma accumulator is per warp the mma.sync fragment, attention_mainloop_sm90.cuh).
#pragma once
#include "attention_mainloop_sm90.cuh"

static_assert(!FP8 && !WARP_SPECIALIZED, "the wgmma decode tiles are 16-bit and single-role");
static_assert(kRowWarps == 4, "a wgmma key group is one warpgroup of 64 rows (BLOCK_M 64, NUM_WARPS 4 x WARP_SPLIT)");
static_assert(!kOverlapPV || kWarpSplit == 1, "WGMMA_OVERLAP's last P V waits on the whole block: no key groups");

// The decode form of load_tile_async (attention_mainloop.cuh's signature): rows [row0, row0 + ROWS) of a [len,
// HEAD_DIM] matrix into the swizzled tile, by THREADS threads (this one is `group_tid` when THREADS is a key
// group's). kPackedRows (the Q tile under PACK_GQA): row r is at packed_row_offset(r, stride, head_stride); a
// once-per-block load, so each chunk computes its own addresses. Rows >= len are zero-filled.
template <int ROWS, int DIM, bool kPackedRows, int THREADS = kThreads>
__device__ __forceinline__ void load_tile_async(qkv_t* smem, const qkv_t* base, int64_t stride, int row0, int len,
                                                int64_t head_stride = 0, int group_tid = 0) {
  static_assert(DIM == kHeadDim, "the wgmma tiles have one head dim");
  const int tid = THREADS == kThreads ? static_cast<int>(threadIdx.x) : group_tid;
  if constexpr (!kPackedRows) {
    load_tile_swizzled<ROWS, THREADS>(smem, base, stride, row0, len, tid);
  } else {
    constexpr int kItems = ROWS * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kItems + THREADS - 1) / THREADS; ++i) {
      const int idx = tid + i * THREADS;
      if (kItems % THREADS != 0 && idx >= kItems) break;
      const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
      const bool valid = row0 + row < len;
      cp_async_16(swizzled_chunk<ROWS>(smem_addr(smem), row, chunk),
                  valid ? base + packed_row_offset(row0 + row, stride, head_stride) + chunk * kChunkElems : base,
                  valid ? 16 : 0);
    }
  }
}
