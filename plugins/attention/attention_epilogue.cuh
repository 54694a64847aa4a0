// Normalize O by the softmax row sums and store it: registers -> smem (element type) -> 16-byte coalesced stores.
#pragma once
#include "attention_softmax.cuh"
#include "common/e4m3.cuh"

// Writes this warp's rows of O / rowsum into sO ([kBlockM][kRowPitchV]); rows with an all-masked key set get 0.
__device__ __forceinline__ void stage_output(elem_t* sO, const float (&o)[kMAtoms][kDTiles][4],
                                             const float (&row_sum)[kMAtoms][2], int warp, int lane) {
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = quad_sum(row_sum[mt][half]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = warp * kWarpRows + mt * 16 + half * 8 + lane / 4;
      uint32_t* dst = reinterpret_cast<uint32_t*>(sO + row * kRowPitchV + (lane % 4) * 2);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        dst[dt * 4] = pack_elem2(o[mt][dt][half * 2] * inv, o[mt][dt][half * 2 + 1] * inv);
    }
}

// Copies the staged rows [m0, m0 + kBlockM) that exist (< len_rows) to global memory, kThreads threads (this one is
// `tid`), 16 bytes per access where D_v % 8 == 0 (else 8/4/2: rows are only that aligned). Row r goes to
// packed_row_offset(r, stride, head_stride): with PACK_GQA rows are (query, head) pairs.
__device__ __forceinline__ void store_output(elem_t* out, const elem_t* sO, int64_t stride, int m0, int len_rows,
                                             int tid, int64_t head_stride = 0) {
  constexpr int kVec = kHeadDimV % 8 == 0 ? 8 : kHeadDimV % 4 == 0 ? 4 : kHeadDimV % 2 == 0 ? 2 : 1;
  constexpr int kVecs = kHeadDimV / kVec;  // accesses per output row
  constexpr int kItems = kBlockM * kVecs;
  typedef typename VecBits<kVec>::type bits_t;
#pragma unroll
  for (int i = 0; i < (kItems + kThreads - 1) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int row = idx / kVecs;
    const int v = idx % kVecs;
    if ((kItems % kThreads == 0 || idx < kItems) && m0 + row < len_rows)
      *reinterpret_cast<bits_t*>(out + packed_row_offset(m0 + row, stride, head_stride) + v * kVec) =
          *reinterpret_cast<const bits_t*>(sO + row * kRowPitchV + v * kVec);
  }
}

// The warp-specialized kernel's store: this thread's rows of O / rowsum (rows row0 and row0 + 8 of a 16-row warp
// slice, two adjacent columns per n8 block) straight from registers to global memory, 4 bytes per store; a quad of
// lanes covers 16 contiguous bytes of a row. No shared memory, so no barrier between the two MMA warpgroups or
// against the loads (O is a small share of the bytes next to the products).
// FP8: O is also multiplied by OUTPUT_FACTOR (v_scale, over output_scale for an e4m3 output; attention_softmax.cuh),
// and with OUTPUT_E4M3 rounded to e4m3 (2 bytes per store, a quad covering 8 contiguous bytes).
template <int kM>
__device__ __forceinline__ void store_output_from_registers(out_t* out, const float (&o)[kM][kDTiles][4],
                                                            const float (&row_sum)[kM][2], int64_t stride, int row0,
                                                            int len_q, int lane) {
  static_assert(kM == 1 && kHeadDimV % 8 == 0, "16-row warp slices of a head dim in whole n8 blocks");
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = quad_sum(row_sum[0][half]);
#if FP8
    const float inv = l > 0.f ? OUTPUT_FACTOR / l : 0.f;
#else
    const float inv = l > 0.f ? 1.f / l : 0.f;
#endif
    const int row = row0 + half * 8;
    if (row < len_q) {
#if FP8 && OUTPUT_E4M3
      uint16_t* dst = reinterpret_cast<uint16_t*>(out + row * stride + (lane % 4) * 2);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        dst[dt * 4] = pack_e4m3x2(o[0][dt][half * 2] * inv, o[0][dt][half * 2 + 1] * inv);
#else
      uint32_t* dst = reinterpret_cast<uint32_t*>(out + row * stride + (lane % 4) * 2);
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        dst[dt * 4] = pack_elem2(o[0][dt][half * 2] * inv, o[0][dt][half * 2 + 1] * inv);
#endif
    }
  }
}
