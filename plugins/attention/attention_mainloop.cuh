// The two matrix products of one K/V tile, S = Q K^T and O += P V, with operands staged in shared memory by
// cp.async (Q once, K and V one tile each, row pitch padded by 16 bytes so ldmatrix hits 32 distinct banks).
#pragma once
#include "attention_mma.cuh"

// Copy rows [row0, row0 + ROWS) of a [len, HEAD_DIM] matrix (row stride `stride` elements) into smem;
// rows >= len are zero-filled so they add nothing to P V and make no NaN.
template <int ROWS>
__device__ __forceinline__ void load_tile_async(elem_t* smem, const elem_t* base, int64_t stride, int row0, int len) {
  constexpr int kPerThread = ROWS * kChunksPerRow / kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int row = idx / kChunksPerRow;
    const int chunk = idx % kChunksPerRow;
    const int g = row0 + row;
    const bool valid = g < len;
    const elem_t* src = valid ? base + g * stride + chunk * 8 : base;
    cp_async_16(smem_addr(smem + row * kRowPitch + chunk * 8), src, valid ? 16 : 0);
  }
}

// S[mt][nt] (this warp's kWarpRows x kBlockN scores, raw Q.K) = Q rows of this warp times the K tile.
__device__ __forceinline__ void gemm_qk(float (&s)[kMAtoms][kNTiles][4], const elem_t* sQ, const elem_t* sK,
                                        int warp, int lane) {
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
  // ldmatrix row addresses: A (Q) rows lane%16, column half lane/16; B (K) key lane%8 + 8*(lane/16), half (lane/8)%2.
  const uint32_t q_addr = smem_addr(sQ + (warp * kWarpRows + (lane % 16)) * kRowPitch + (lane / 16) * 8);
  const uint32_t k_addr = smem_addr(sK + ((lane % 8) + (lane / 16) * 8) * kRowPitch + ((lane / 8) % 2) * 8);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    uint32_t a[kMAtoms][4];
#pragma unroll
    for (int mt = 0; mt < kMAtoms; ++mt)
      ldmatrix_x4(a[mt], q_addr + (mt * 16 * kRowPitch + kk * 16) * sizeof(elem_t));
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, k_addr + (np * 16 * kRowPitch + kk * 16) * sizeof(elem_t));
#pragma unroll
      for (int mt = 0; mt < kMAtoms; ++mt) {
        mma_16816(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// O[mt][dt] += P V: P (probabilities in the S registers) is rounded to the element type in registers and used
// as the A operand directly (the m16n8 accumulator layout of two adjacent n8 tiles is the m16k16 A layout).
__device__ __forceinline__ void gemm_pv(float (&o)[kMAtoms][kDTiles][4], const float (&p)[kMAtoms][kNTiles][4],
                                        const elem_t* sV, int lane) {
  // ldmatrix.trans row addresses: key lane%8 + 8*((lane/8)%2), head-dim half lane/16.
  const uint32_t v_addr = smem_addr(sV + ((lane % 8) + ((lane / 8) % 2) * 8) * kRowPitch + (lane / 16) * 8);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    uint32_t a[kMAtoms][4];
#pragma unroll
    for (int mt = 0; mt < kMAtoms; ++mt) {
      a[mt][0] = pack_elem2(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = pack_elem2(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = pack_elem2(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = pack_elem2(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_addr + (kk * 16 * kRowPitch + dp * 16) * sizeof(elem_t));
#pragma unroll
      for (int mt = 0; mt < kMAtoms; ++mt) {
        mma_16816(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16816(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}
