// Reductions of the accumulators across warps and CTAs that share one output tile.
//
// SPLIT_K > 1: the CTA holds SPLIT_K groups of WARPS_M x WARPS_N warps on the same output tile, group g taking
// reduction tiles g, g + SPLIT_K, ... through its own pipeline (own stages, own named barrier); the groups'
// accumulators are summed through shared memory before the epilogue. More warps per output tile hide the load latency
// of deep, narrow layers (3x3 over 256+ channels at 7x7/14x14) without a workspace or second kernel.
// CLUSTER_K > 1 (sm_90): the reduction is split over a thread-block cluster of CLUSTER_K CTAs along grid.z (a
// compile-time cluster shape, so the launch itself is plain); CTA rank r takes the r-th contiguous slice of the
// reduction tiles, and the ranks sum their partial tiles through distributed shared memory (DSMEM), each finalizing
// and storing its share of the tile's rows (sum_cluster_partials).
// Deep layers with few output tiles (3x3 over 512 channels at 7x7) fill the GPU without a workspace.
#pragma once
#include "implicit_gemm_config.cuh"
#include "common/cluster.cuh"

// The kernels' compile-time cluster shape: CLUSTER_K CTAs along grid.z.
#if CLUSTER_K > 1
#define CLUSTER_ATTRIBUTE __cluster_dims__(1, 1, CLUSTER_K)
#else
#define CLUSTER_ATTRIBUTE
#endif

// A group's accumulators as one partial tile in shared memory, in fragment order (consecutive threads, consecutive
// words: conflict-free), for the split groups' and the cluster's sums.
constexpr int kAccRegs = kMI * kNI * 4;  // accumulators per thread
__device__ __forceinline__ void clear_accumulators(float (&acc)[kMI][kNI][4]) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) (&acc[0][0][0])[i] = 0.f;
}
__device__ __forceinline__ void store_partial(const float (&acc)[kMI][kNI][4], float* partial, int group_tid) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) partial[i * kGroupThreads + group_tid] = (&acc[0][0][0])[i];
}
__device__ __forceinline__ void add_partial(float (&acc)[kMI][kNI][4], const float* partial, int group_tid) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) (&acc[0][0][0])[i] += partial[i * kGroupThreads + group_tid];
}

// Sum the split groups' partial accumulators into group 0's (SPLIT_K > 1; nothing otherwise).
__device__ __forceinline__ void sum_split_groups(float (&acc)[kMI][kNI][4], unsigned char* smem, int group,
                                                 int group_tid) {
#if SPLIT_K > 1
  float* partial = reinterpret_cast<float*>(smem);
  if (group > 0) store_partial(acc, partial + (group - 1) * kAccRegs * kGroupThreads, group_tid);
  __syncthreads();
  if (group == 0)
#pragma unroll
    for (int s = 0; s < SPLIT_K - 1; ++s)
      add_partial(acc, partial + s * kAccRegs * kGroupThreads, group_tid);
  __syncthreads();
#endif
}

// The rows of the output tile a CTA finalizes and stores: [begin, end).
struct TileRows {
  int begin, end;
};

// CLUSTER_K > 1: every rank finalizes a share of the tile. The tile's 16-row blocks (one accumulator block mi of one
// warp row covers one) go to the ranks in contiguous runs: rank r owns blocks [r * kRowBlocks / CLUSTER_K, (r + 1) *
// kRowBlocks / CLUSTER_K). Each rank pushes its partial sums of the blocks it does not own into their owner's shared
// memory (16-byte DSMEM stores, fire and forget) and adds the pushed ones to the blocks it owns; so each CTA moves
// (CLUSTER_K - 1) / CLUSTER_K of a tile over DSMEM and runs that share of the output pass, where rank 0 alone read
// CLUSTER_K - 1 whole tiles and ran the whole pass before (the cluster's fixed cost on the deep layers at batch 1 and
// 8, NOTES.md).
constexpr int kRowBlocks = BLOCK_M / 16;
constexpr int kOwnedBlocksMax = (kRowBlocks + CLUSTER_K - 1) / CLUSTER_K;
constexpr int kOwnedRowsMax = CLUSTER_K > 1 ? 16 * kOwnedBlocksMax : BLOCK_M;  // the output pass's row count bound
constexpr int kBlockFloats = 16 * BLOCK_N;  // one row block's partial sums
// The pushed partials lie after the staged output tile (implicit_gemm_store.cuh), so that the owner stages its rows
// while others in its CTA still read pushed sums: (CLUSTER_K - 1) senders x kOwnedBlocksMax blocks (the plan's
// gemm_shared_bytes counts them). Where shared memory allows without a shallower ring (and, unspecialized, without
// fewer blocks per SM), the plan puts them past the ring as well (PUSHED_OFFSET, bytes from the ring's start; the
// unspecialized kernel's ring starts at its shared memory's start): no other CTA then writes a byte
// this CTA's loads or MMAs use, so a rank pushes as soon as its own MMAs are done, without the cluster barrier that
// waited for every rank's ring to drain (racecheck reported a 3-CTA cluster's pushes against the ring's cp.async
// writes, ordered by that barrier in the code; session 6 conv-3).
#ifdef PUSHED_OFFSET
constexpr bool kPushedPastRing = true;
constexpr int kPushedOffset = PUSHED_OFFSET;
#else
constexpr bool kPushedPastRing = false;
constexpr int kPushedOffset = BLOCK_M * kCStride * int(sizeof(elem_t));
#endif
static_assert(CLUSTER_K <= kRowBlocks && kPushedOffset % 16 == 0, "each rank owns a 16-row block of the tile");
static_assert(kPushedOffset >= BLOCK_M * kCStride * int(sizeof(elem_t)), "the pushed sums lie past the staged tile");

// PUSHED_OFFSET: every thread arrives on a cluster barrier at kernel start; sum_cluster_partials waits on that phase
// before its first push, which proves every CTA of the cluster has started (DSMEM may be written) at no cost.
__device__ __forceinline__ void arrive_cluster_started() {
#if CLUSTER_K > 1
  if constexpr (kPushedPastRing) cluster_arrive_relaxed();
#endif
}
__device__ __forceinline__ int first_row_block(int rank) { return rank * kRowBlocks / CLUSTER_K; }
__device__ __forceinline__ int row_block_owner(int block) { return ((block + 1) * CLUSTER_K - 1) / kRowBlocks; }
// Float index of float4 j of a thread's pushed partial: sender slot, the block's index among the owner's, the
// thread's column part (its warp's column group: mma.sync's warp_n, 0 under wgmma) and lane; consecutive lanes write
// consecutive 16-byte words.
__device__ __forceinline__ int pushed_index(int slot, int owned_block, int part, int j, int lane) {
  return (slot * kOwnedBlocksMax + owned_block) * kBlockFloats + ((part * kNI + j) * 32 + lane) * 4;
}

// Sum the cluster's partial tiles: every thread of every CTA in the cluster calls it (cluster barriers); `holder`
// threads own the tile's accumulators, their fragment rows starting at row_base and columns at col_base. Returns the
// rows whose sums this CTA's holders now have (all rows without a cluster).
__device__ __forceinline__ TileRows sum_cluster_partials(float (&acc)[kMI][kNI][4], unsigned char* smem, int rank,
                                                         bool holder, int row_base, int col_base, int lane) {
#if CLUSTER_K > 1
  float* pushed = reinterpret_cast<float*>(smem + kPushedOffset);
  const int part = col_base / (kNI * 8);
  if constexpr (kPushedPastRing) {
    cluster_wait();  // every CTA has started (arrive_cluster_started); no push lands in a ring
  } else {
    cluster_sync();  // no CTA's ring is still in use: partials may land there
  }
  if (holder)
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi) {
      const int block = (row_base + mi * kRowsPerMI) / 16, owner = row_block_owner(block);
      if (owner == rank) continue;
      const int slot = rank < owner ? rank : rank - 1;
      const uint32_t remote =
          cluster_address(pushed + pushed_index(slot, block - first_row_block(owner), part, 0, lane), owner);
#pragma unroll
      for (int j = 0; j < kNI; ++j)
        store_cluster4(remote + 16 * 32 * j, make_float4(acc[mi][j][0], acc[mi][j][1], acc[mi][j][2], acc[mi][j][3]));
    }
  cluster_sync();  // the pushes have landed (release / acquire); no DSMEM access follows, so any CTA may leave
  if (holder)
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi) {
      const int block = (row_base + mi * kRowsPerMI) / 16;
      if (row_block_owner(block) != rank) continue;
#pragma unroll 1
      for (int slot = 0; slot < CLUSTER_K - 1; ++slot)
#pragma unroll
        for (int j = 0; j < kNI; ++j) {
          const float4 v =
              *reinterpret_cast<const float4*>(pushed + pushed_index(slot, block - first_row_block(rank), part, j, lane));
          acc[mi][j][0] += v.x;
          acc[mi][j][1] += v.y;
          acc[mi][j][2] += v.z;
          acc[mi][j][3] += v.w;
        }
    }
  return {16 * first_row_block(rank), 16 * first_row_block(rank + 1)};
#else
  return {0, BLOCK_M};
#endif
}

// The cluster barriers of sum_cluster_partials, for threads that hold no accumulators (the warp-specialized kernel's
// load warpgroup): every thread of the cluster takes part in both.
__device__ __forceinline__ void join_cluster_sum() {
#if CLUSTER_K > 1
  if constexpr (kPushedPastRing) {
    cluster_wait();
  } else {
    cluster_sync();
  }
  cluster_sync();
#endif
}
