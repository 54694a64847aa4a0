// Decode and short queries (KV_SPLIT > 1 and/or WARP_SPLIT > 1): the keys of one query block are split over the
// KV_SPLIT CTAs of a thread-block cluster and, inside each CTA, over its WARP_SPLIT key groups of warps. Each of the
// KV_SPLIT * WARP_SPLIT parts runs the main loop over its share, then the parts are combined through shared memory
// (distributed shared memory, DSMEM, across the cluster), in one launch with no workspace. Each key group leaves in
// its CTA's shared memory, per row, O unnormalized against its reference (exp2 units), that reference and its row
// sum; after a barrier (the cluster's, or the block's without a cluster) CTA r combines rows [r * R, (r + 1) * R),
// R = BLOCK_M / KV_SPLIT, over every part j:
//   M = max_j m_j,  w_j = 2^(m_j - M) (0 for a part that saw no key of the row),  O = sum_j w_j O_j / sum_j w_j l_j
// and writes them (rows are (query, head) pairs with PACK_GQA: packed_row_offset); with a cluster, a second cluster
// barrier keeps every CTA's shared memory alive until the others have read it. Between the two barriers shared
// memory is only read: each thread computes the weights of its own row in registers (run 4's racecheck paired the
// weights' shared-memory stores of an earlier version with this phase's reads).
// Where a key group's partials go: over that group's own K/V stages when they fit (only the group's own warps ever
// read those buffers, and every warp is past the block barrier after the main loop), else after every group's stages.
// Never over another group's buffers: run 3's racecheck reported partial stores over one group's V tiles against that
// group's ldmatrix.trans reads.
#pragma once
#include "attention_softmax.cuh"
#if KV_SPLIT > 1
#include "common/cluster.cuh"
#endif

constexpr int kCombineRows = kBlockM / kKvSplit;  // rows each CTA of the cluster combines and stores
constexpr int kParts = kKvSplit * kWarpSplit;     // partial results combined per row
// One key group's partials in floats: O [kBlockM][kHeadDimVPad], then per row its reference and its sum.
constexpr int kGroupPartialFloats = kBlockM * kHeadDimVPad + 2 * kBlockM;
constexpr int kGroupStageBytes = (kStages * kKTileElems + kVStages * kVTileElems) * static_cast<int>(sizeof(elem_t));
constexpr bool kPartialsOverStages = kGroupPartialFloats * 4 <= kGroupStageBytes;  // (the plan mirrors this)

// Key group g's partials, given where the key groups' K/V stages start.
__device__ __forceinline__ float* group_partials(elem_t* stages, int g) {
  unsigned char* base = reinterpret_cast<unsigned char*>(stages);
  return kPartialsOverStages ? reinterpret_cast<float*>(base + g * kGroupStageBytes)
                             : reinterpret_cast<float*>(base + kWarpSplit * kGroupStageBytes) + g * kGroupPartialFloats;
}
// The second phase: kCombineThreadsPerRow threads share a row (its 4-column chunks), kCombineRowsPerPass rows a pass.
constexpr int kCombineChunks = (kHeadDimV + 3) / 4;  // 4-float chunks of a partial O row holding output columns
constexpr int kCombineThreadsPerRow = kThreads > kCombineRows ? kThreads / kCombineRows : 1;
constexpr int kCombineRowsPerPass = kThreads / kCombineThreadsPerRow;
static_assert(kHeadDimVPad % 4 == 0, "partial O rows are read 16 bytes at a time");

// A float of part j = (CTA rank) * kWarpSplit + key group, at the address `local` has in this CTA.
__device__ __forceinline__ float load_part(const float* local, int rank) {
#if KV_SPLIT > 1
  return load_cluster(cluster_address(local, rank));
#else
  return *local;
#endif
}

// Four floats of part j at a 16-byte aligned `local` address (as load_part).
__device__ __forceinline__ float4 load_part4(const float* local, int rank) {
#if KV_SPLIT > 1
  return load_cluster4(cluster_address(local, rank));
#else
  return *reinterpret_cast<const float4*>(local);
#endif
}

// `stages`: where the key groups' K/V stages start (every warp is done with them: the caller's block barrier).
__device__ __forceinline__ void combine_split_kv(elem_t* stages, const float (&o)[kMAtoms][kDTiles][4],
                                                 const float (&row_max)[kMAtoms][2],
                                                 const float (&row_sum)[kMAtoms][2], int row_warp, int group, int lane,
                                                 int rank, elem_t* out, int64_t stride, int64_t head_stride, int m0,
                                                 int len_rows) {
  // part j's O row r, reference and sum (in this CTA; DSMEM maps them to CTA j / kWarpSplit's)
  const auto part_o = [&](int j, int r) { return group_partials(stages, j % kWarpSplit) + r * kHeadDimVPad; };
  const auto part_ref = [&](int j, int r) { return part_o(j, kBlockM) + r; };
  const auto part_sum = [&](int j, int r) { return part_o(j, kBlockM) + kBlockM + r; };
#pragma unroll
  for (int mt = 0; mt < kMAtoms; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_warp * kWarpRows + mt * 16 + half * 8 + lane / 4;
      const float l = quad_sum(row_sum[mt][half]);
      if (lane % 4 == 0) {
        const float m = row_max[mt][half];
        *part_ref(group, row) = m == -INFINITY ? -INFINITY : m * kSoftmaxScale;
        *part_sum(group, row) = l;
      }
      float* dst = part_o(group, row) + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 2; ++e) dst[dt * 8 + e] = o[mt][dt][half * 2 + e];
    }
#if KV_SPLIT > 1
  cluster_sync();  // every CTA's partials are written and visible across the cluster
#else
  __syncthreads();
#endif

  const int row_begin = rank * kCombineRows;
  if (kThreads % kCombineThreadsPerRow == 0 || threadIdx.x < kCombineRowsPerPass * kCombineThreadsPerRow) {
    for (int r = row_begin + threadIdx.x / kCombineThreadsPerRow; r < row_begin + kCombineRows;
         r += kCombineRowsPerPass) {
      if (m0 + r >= len_rows) break;  // (rows only grow within the loop)
      float weight[kParts], top = -INFINITY;
#pragma unroll
      for (int j = 0; j < kParts; ++j) {
        weight[j] = load_part(part_ref(j, r), j / kWarpSplit);
        top = fmaxf(top, weight[j]);
      }
      float total = 0.f;
#pragma unroll
      for (int j = 0; j < kParts; ++j) {
        weight[j] = weight[j] == -INFINITY ? 0.f : exp2_approx(weight[j] - top);
        total += weight[j] * load_part(part_sum(j, r), j / kWarpSplit);
      }
      const float inv_total = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
      for (int j = 0; j < kParts; ++j) weight[j] *= inv_total;
      elem_t* dst = out + packed_row_offset(m0 + r, stride, head_stride);
      for (int c = threadIdx.x % kCombineThreadsPerRow; c < kCombineChunks; c += kCombineThreadsPerRow) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < kParts; ++j) {
          const float4 p = load_part4(part_o(j, r) + c * 4, j / kWarpSplit);
          acc.x += weight[j] * p.x;
          acc.y += weight[j] * p.y;
          acc.z += weight[j] * p.z;
          acc.w += weight[j] * p.w;
        }
        if constexpr (kHeadDimV % 4 == 0) {  // rows are 8-byte aligned (store_output's rule)
          *reinterpret_cast<uint2*>(dst + c * 4) = make_uint2(pack_elem2(acc.x, acc.y), pack_elem2(acc.z, acc.w));
        } else {
          const float v[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (c * 4 + e < kHeadDimV) dst[c * 4 + e] = from_float(v[e]);
        }
      }
    }
  }
#if KV_SPLIT > 1
  cluster_sync_relaxed();  // no CTA leaves (freeing its shared memory) while another still reads it
#endif
}
