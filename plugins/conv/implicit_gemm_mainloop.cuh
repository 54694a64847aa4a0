// The tensor-core products of one reduction tile with warp-level mma.sync (sm_80+): each warp reads its A rows and
// B columns of the swizzled tiles with ldmatrix and issues m16n8k16 (float16/bfloat16) or m16n8k32 (e4m3) MMAs,
// fp32 accumulate.
#pragma once
#include "common/cp_async.cuh"
#include "common/ldmatrix.cuh"
#include "common/mma_sync.cuh"
#include "common/smem.cuh"
#include "implicit_gemm_config.cuh"

// One 32-byte k-step: m16n8k16 f16/bf16 or m16n8k32 e4m3, fp32 accumulate. Both fragments hold, per register,
// 4 consecutive bytes of one row, so ldmatrix (b16) addresses the bytes alike.
__device__ __forceinline__ void mma_k32bytes(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if FP8
  mma_16832_e4m3(d, a, b[0], b[1]);
#else
  mma_16816(d, a, b[0], b[1]);
#endif
}

// One stage's MMAs: the warp's kWarpM x kWarpN accumulators += A[rows, :] * B[cols, :]^T over BLOCK_K.
__device__ __forceinline__ void mma_stage(float (&acc)[kMI][kNI][4], const unsigned char* a_tile,
                                          const unsigned char* b_tile, int row_base, int col_base, int lane) {
  const unsigned a_base = smem_addr(a_tile), b_base = smem_addr(b_tile);
#pragma unroll
  for (int kk = 0; kk < kRowBytes / 32; ++kk) {
    unsigned a[kMI][4], b[kNI][2];
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi) {
      const int row = row_base + mi * 16 + (lane & 15);
      ldmatrix_x4(a[mi], a_base + smem_offset<kChunks>(row, (kk * 2 + (lane >> 4)) * 16));
    }
#pragma unroll
    for (int nj = 0; nj < kNI / 2; ++nj) {
      const int row = col_base + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
      unsigned r[4];
      ldmatrix_x4(r, b_base + smem_offset<kChunks>(row, (kk * 2 + ((lane >> 3) & 1)) * 16));
      b[2 * nj][0] = r[0]; b[2 * nj][1] = r[1]; b[2 * nj + 1][0] = r[2]; b[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) mma_k32bytes(acc[mi][ni], a[mi], b[ni]);
  }
}

// The interface both main loops give the kernel (implicit_gemm_mainloop_sm90.cuh has the wgmma one).
// All but the kNewest most recent tile loads have landed in this thread's stages (the caller then syncs the group).
template <int kNewest>
__device__ __forceinline__ void wait_tiles_landed() { cp_async_wait<kNewest>(); }

// A tile's MMAs in two steps around the FP8 quantize of the next tile: mma.sync runs them all in the second.
__device__ __forceinline__ void mma_tile_begin(float (&)[kMI][kNI][4], const unsigned char*, const unsigned char*,
                                               int) {}
__device__ __forceinline__ void mma_tile_end(float (&acc)[kMI][kNI][4], const unsigned char* a_tile,
                                             const unsigned char* b_tile, int row_base, int col_base, int lane) {
  mma_stage(acc, a_tile, b_tile, row_base, col_base, lane);
}
// Every MMA has finished (the accumulators are final).
__device__ __forceinline__ void mma_drain(float (&)[kMI][kNI][4]) {}
