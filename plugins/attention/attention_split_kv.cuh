// Decode and short queries (KV_SPLIT > 1): the KV_SPLIT CTAs of one thread-block cluster each run the main loop over
// their share of one query block's keys, then combine their partial softmax results through distributed shared
// memory (DSMEM), in one launch with no workspace. Each CTA leaves in its own shared memory, per row, O unnormalized
// against its reference (exp2 units), that reference and its row sum; after a cluster barrier CTA r combines rows
// [r * R, (r + 1) * R), R = BLOCK_M / KV_SPLIT:
//   M = max_j m_j,  w_j = 2^(m_j - M) (0 for a CTA that saw no key of the row),  O = sum_j w_j O_j / sum_j w_j l_j
// and writes them (rows are (query, head) pairs with PACK_GQA: packed_row_offset); a second cluster barrier keeps
// every CTA's shared memory alive until the others have read it.
#pragma once
#include "attention_softmax.cuh"
#include "common/cluster.cuh"

constexpr int kCombineRows = kBlockM / kKvSplit;  // rows each CTA of the cluster combines and stores
// floats of shared memory the combine uses (the plan sizes shared memory for it): partial O, reference, row sum,
// then this CTA's per-row weights and 1 / total
constexpr int kCombineFloats = kBlockM * kHeadDimVPad + 2 * kBlockM + kCombineRows * (kKvSplit + 1);

__device__ __forceinline__ void combine_split_kv(float* smem, const float (&o)[kMAtoms][kDTiles][4],
                                                 const float (&row_max)[kMAtoms][2],
                                                 const float (&row_sum)[kMAtoms][2], int warp, int lane, int rank,
                                                 elem_t* out, int64_t stride, int64_t head_stride, int m0,
                                                 int len_rows) {
  float* s_o = smem;                                  // [kBlockM][kHeadDimVPad]
  float* s_ref = s_o + kBlockM * kHeadDimVPad;        // [kBlockM] reference, exp2 units (-inf: no key seen)
  float* s_sum = s_ref + kBlockM;                     // [kBlockM]
  float* s_weight = s_sum + kBlockM;                  // [kCombineRows][kKvSplit]
  float* s_inv_total = s_weight + kCombineRows * kKvSplit;  // [kCombineRows]
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp * kWarpRows + mt * 16 + half * 8 + lane / 4;
      const float l = quad_sum(row_sum[mt][half]);
      if (lane % 4 == 0) {
        const float m = row_max[mt][half];
        s_ref[row] = m == -INFINITY ? -INFINITY : m * kSoftmaxScale;
        s_sum[row] = l;
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 2; ++e) s_o[row * kHeadDimVPad + dt * 8 + (lane % 4) * 2 + e] = o[mt][dt][half * 2 + e];
    }
  cluster_sync();  // every CTA's partials are written and visible across the cluster

  const int row_begin = rank * kCombineRows;
  for (int r = threadIdx.x; r < kCombineRows; r += kThreads) {
    float ref[kKvSplit], top = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKvSplit; ++j) {
      ref[j] = load_cluster(cluster_address(s_ref + row_begin + r, j));
      top = fmaxf(top, ref[j]);
    }
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < kKvSplit; ++j) {
      const float w = ref[j] == -INFINITY ? 0.f : exp2_approx(ref[j] - top);
      s_weight[r * kKvSplit + j] = w;
      total += w * load_cluster(cluster_address(s_sum + row_begin + r, j));
    }
    s_inv_total[r] = total > 0.f ? 1.f / total : 0.f;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kCombineRows * kHeadDimV; idx += kThreads) {
    const int r = idx / kHeadDimV, col = idx % kHeadDimV;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kKvSplit; ++j)
      acc += s_weight[r * kKvSplit + j] *
             load_cluster(cluster_address(s_o + (row_begin + r) * kHeadDimVPad + col, j));
    if (m0 + row_begin + r < len_rows)
      out[packed_row_offset(m0 + row_begin + r, stride, head_stride) + col] = from_float(acc * s_inv_total[r]);
  }
  cluster_sync();  // no CTA leaves (freeing its shared memory) while another still reads it
}
