// BULK_A: the A rows of a 1x1 conv's reduction tile by cp.async.bulk (warp-specialized kernel, sm_90a). A 1x1 filter
// without padding reads, for output row m, the kRowBytes of input pixel m's channels at the tile's k0: one contiguous
// run, always inside the image, so one bulk copy moves a row where cp.async takes kRowBytes / 16 copies with their
// address and bounds work (session 8 ncu, b8 1x1 1024>256 @14: our loader's per-tile instruction path, not bytes, set
// the pace). With BULK_A CTAs on a cluster (the grid's N tiles of one M tile, which read the same A tile), each copies
// BLOCK_M / BULK_A of the rows into every CTA of the cluster (.multicast::cluster): L2 sends A once per cluster.
// The rows land unswizzled (kARowBytes apart), which wgmma's shared-memory layouts cannot read: the MMA warps take A
// into registers with ldmatrix (implicit_gemm_mainloop_sm90.cuh, wgmma with A from registers).
#pragma once
#include "common/bulk_copy.cuh"
#include "fast_divmod.cuh"
#include "implicit_gemm_config.cuh"

struct BulkARows {
  static constexpr int kRankRows = BLOCK_M / (BULK_A > 1 ? BULK_A : 1);  // rows this CTA copies for the cluster
  static constexpr int kTileBytes = BLOCK_M * kRowBytes;  // bytes that land in each CTA per reduction tile
  static_assert(!BULK_A || (BLOCK_M % kRankRows == 0 && kRankRows <= 128), "BULK_A: a loader thread per row of this CTA's share");
  int offset;    // element offset of this thread's row's first channel (group g, k = 0)
  uint32_t dst;  // its row's byte offset in a stage
  bool copies;   // whether this thread copies a row

  // Thread `tid` of the load warpgroup copies row rank * kRankRows + j of the tile, j = 4 * lane + warp: a bulk copy
  // takes warp-uniform operands, so a warp issues its lanes' copies one after another (ELECT, R2UR, UBLKCP in SASS),
  // and the four loader warps share them. Rows past M repeat row M - 1 (their products are never stored).
  __device__ __forceinline__ BulkARows(int tid, int rank, int m0, int g, int M, int H, int W, int x_stride, int Cg,
                                       const FastDivmod& pq_div, const FastDivmod& q_div) {
    const int j = tid % 32 * 4 + tid / 32, row = rank * kRankRows + j;
    copies = j < kRankRows;
    int pq, q;
    const int n = pq_div.divmod(min(m0 + row, M - 1), &pq);
    const int p = q_div.divmod(pq, &q);
    offset = ((n * H + p * STRIDE_H) * W + q * STRIDE_W) * x_stride + g * Cg;
    dst = row * kARowBytes;
  }

  // Start this thread's row of the reduction tile at k0 into `stage` (a shared address; every CTA of the cluster at
  // the same offset), counted on the stage's full barrier `full` in each.
  __device__ __forceinline__ void fetch(uint32_t stage, uint32_t full, const x_t* x, int k0) const {
    if (!copies) return;
    if constexpr (BULK_A == 1) {
      bulk_copy_to_shared(stage + dst, x + offset + k0, kRowBytes, full);
    } else {
      bulk_copy_to_cluster(stage + dst, x + offset + k0, kRowBytes, full, (1u << BULK_A) - 1);
    }
  }
};
