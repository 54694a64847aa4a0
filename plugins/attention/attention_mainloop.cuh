// The two matrix products of one K/V tile, S = Q K^T and O += P V, with operands staged in shared memory by
// cp.async (Q once, K and V one tile each, row pitch padded by 16 bytes so ldmatrix hits 32 distinct banks).
#pragma once
#include "attention_config.cuh"
#include "common/cp_async.cuh"
#include "common/ldmatrix.cuh"
#include "common/mma_sync.cuh"
#include "common/smem.cuh"

constexpr int kQTileElems = kBlockM * kRowPitch;   // the Q tile in smem
constexpr int kKTileElems = kBlockN * kRowPitch;   // one K tile in smem
constexpr int kVTileElems = kBlockN * kRowPitchV;  // one V tile in smem
constexpr int kSmemAlign = 16;                     // cp.async / ldmatrix granule
constexpr bool kOverlapPV = false;                 // (the wgmma mainloop's option)
constexpr int kVStages = kStages;                  // V tile buffers
static_assert(WGMMA_OVERLAP == 0, "WGMMA_OVERLAP is an option of the wgmma mainloop (WGMMA=1)");

// cp.async (all but the kNewest most recent groups) has landed in this thread's smem (the caller then syncs).
template <int kNewest = 0>
__device__ __forceinline__ void wait_tiles_landed() { cp_async_wait<kNewest>(); }

// Copy rows [row0, row0 + ROWS) of a [len, DIM] matrix (row stride `stride` elements) into smem rows of DIM padded
// to 16 (pitch + 8); rows >= len and the padding columns are zero-filled, so they add nothing to either product
// and make no NaN. Rows start 16-byte aligned only when DIM % 8 == 0 (the API checks the base): other head dims
// copy 8/4/2 bytes at a time with ordinary loads and stores (visible after the caller's barrier like cp.async).
// kPackedRows (the Q tile under PACK_GQA): row r is at packed_row_offset(r, stride, head_stride), not r * stride.
// THREADS threads copy: the whole block, or with WARP_SPLIT the warps of one key group (`group_tid` is this thread's
// index among them).
template <int ROWS, int DIM, bool kPackedRows = false, int THREADS = kThreads>
__device__ __forceinline__ void load_tile_async(elem_t* smem, const elem_t* base, int64_t stride, int row0, int len,
                                                int64_t head_stride = 0, int group_tid = 0) {
  const int tid = THREADS == kThreads ? static_cast<int>(threadIdx.x) : group_tid;
  const auto row_start = [&](int r) {
    return base + (kPackedRows ? packed_row_offset(r, stride, head_stride) : static_cast<int64_t>(r) * stride);
  };
  constexpr int kPad = (DIM + 15) / 16 * 16;
  constexpr int kPitch = kPad + 8;
  constexpr int kChunks = kPad / 8;  // 16-byte chunks of a padded row
  if constexpr (DIM == kPad && THREADS % kChunks == 0 && ROWS % (THREADS / kChunks) == 0) {
    constexpr int kRowsPerStep = THREADS / kChunks;  // each step copies whole rows
    const int row = tid / kChunks, chunk = tid % kChunks;
    // one running pointer (not one per step) keeps the registers live across the main loop few
    const elem_t* src = base + (row0 + row) * stride + chunk * 8;
    const int64_t step = kRowsPerStep * stride;
    const uint32_t dst = smem_addr(smem + row * kPitch + chunk * 8);
#pragma unroll
    for (int i = 0; i < ROWS / kRowsPerStep; ++i) {
      const bool valid = row0 + row + i * kRowsPerStep < len;
      if (kPackedRows) src = row_start(row0 + row + i * kRowsPerStep) + chunk * 8;
      cp_async_16(dst + i * kRowsPerStep * kPitch * sizeof(elem_t), valid ? src : base, valid ? 16 : 0);
      src += step;
    }
  } else if constexpr (DIM % 8 == 0) {  // 96 (12 chunks a row), and padded dims such as 40, 80, 160
    constexpr int kItems = ROWS * kChunks;
#pragma unroll
    for (int i = 0; i < (kItems + THREADS - 1) / THREADS; ++i) {
      const int idx = tid + i * THREADS;
      const int row = idx / kChunks, chunk = idx % kChunks;
      const bool valid = row0 + row < len && chunk * 8 < DIM;
      if (kItems % THREADS == 0 || idx < kItems)
        cp_async_16(smem_addr(smem + row * kPitch + chunk * 8), valid ? row_start(row0 + row) + chunk * 8 : base,
                    valid ? 16 : 0);
    }
  } else {
    constexpr int kVec = DIM % 4 == 0 ? 4 : DIM % 2 == 0 ? 2 : 1;
    constexpr int kVecs = kPad / kVec;  // accesses per padded row
    constexpr int kItems = ROWS * kVecs;
    typedef typename VecBits<kVec>::type bits_t;
#pragma unroll 4
    for (int i = 0; i < (kItems + THREADS - 1) / THREADS; ++i) {
      const int idx = tid + i * THREADS;
      const int row = idx / kVecs, v = idx % kVecs;
      if (kItems % THREADS == 0 || idx < kItems) {
        bits_t bits{};
        if (row0 + row < len && v * kVec < DIM)
          bits = *reinterpret_cast<const bits_t*>(row_start(row0 + row) + v * kVec);
        *reinterpret_cast<bits_t*>(smem + row * kPitch + v * kVec) = bits;
      }
    }
  }
}

// The A operand of S = Q K^T for one k-step: read from the Q tile in smem at every use (fewer registers) ...
struct QFromSmem {
  uint32_t addr;  // this lane's ldmatrix row address in sQ
  __device__ __forceinline__ QFromSmem(const elem_t* sQ, int row_warp, int lane)
      : addr(smem_addr(sQ + (row_warp * kWarpRows + (lane % 16)) * kRowPitch + (lane / 16) * 8)) {}
  __device__ __forceinline__ void get(uint32_t (&a)[4], int mt, int kk) const {
    ldmatrix_x4(a, addr + (mt * 16 * kRowPitch + kk * 16) * sizeof(elem_t));
  }
};

// ... or loaded into registers once per thread block (less shared-memory traffic per K tile).
struct QInRegisters {
  uint32_t frag[kMAtoms][kHeadDimQKPad / 16][4];
  __device__ __forceinline__ QInRegisters(const elem_t* sQ, int row_warp, int lane) {
    const QFromSmem q(sQ, row_warp, lane);
#pragma unroll
    for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
      for (int kk = 0; kk < kHeadDimQKPad / 16; ++kk) q.get(frag[mt][kk], mt, kk);
  }
  __device__ __forceinline__ void get(uint32_t (&a)[4], int mt, int kk) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = frag[mt][kk][i];
  }
};

// S[mt][nt] (this warp's kWarpRows x kBlockN scores, raw Q.K) = Q rows of this warp times the K tile.
template <class QOperand>
__device__ __forceinline__ void gemm_qk(float (&s)[kMAtoms][kNTiles][4], const QOperand& q, const elem_t* sK,
                                        int lane) {
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
  // ldmatrix row addresses of B (K): key lane%8 + 8*(lane/16), head-dim half (lane/8)%2.
  const uint32_t k_addr = smem_addr(sK + ((lane % 8) + (lane / 16) * 8) * kRowPitch + ((lane / 8) % 2) * 8);
#pragma unroll
  for (int kk = 0; kk < kHeadDimQKPad / 16; ++kk) {
    uint32_t a[kMAtoms][4];
#pragma unroll
    for (int mt = 0; mt < kMAtoms; ++mt) q.get(a[mt], mt, kk);
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
  const uint32_t v_addr = smem_addr(sV + ((lane % 8) + ((lane / 8) % 2) * 8) * kRowPitchV + (lane / 16) * 8);
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
      ldmatrix_x4_trans(b, v_addr + (kk * 16 * kRowPitchV + dp * 16) * sizeof(elem_t));
#pragma unroll
      for (int mt = 0; mt < kMAtoms; ++mt) {
        mma_16816(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16816(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}
