// Benchmark-only streaming read of K/V-shaped memory through a ring of shared-memory stages, loaded the way the decode
// kernel loads (cp.async 16 bytes a thread, or cp.async.bulk by the TMA unit), consumed from shared memory into a
// checksum. Why: the read ceiling of a 64 MB K/V at the decode grid's CTA count (64 CTAs at batch 1) and at 132 CTAs,
// by bytes in flight a CTA (benchmarks/stream_read.py; NOTES.md, decode session 10).
// Layout: K and V are [keys][HEADS][ROW_BYTES] (BSHD of one batch); CTA c reads head c / SPLIT, keys part c % SPLIT of
// SPLIT equal parts, a K tile and a V tile of BLOCK_N rows a stage; STAGES - 1 stages in flight while one is read.
// HEADS 1 makes each CTA's part one contiguous run of each tensor.
// Compile-time: THREADS, STAGES, BLOCK_N, ROW_BYTES, HEADS, SPLIT, CLUSTER (CTAs of a cluster), BULK (0: cp.async,
// 1: cp.async.bulk of contiguous runs, 2: one 2D tensor copy a tile and tensor, by the tensor maps of K and V that
// `maps` holds, host-encoded: a ceiling measurement, not the plugin ABI), DEVICE_MAP (BULK 2 only; 0: the maps in
// `maps`; 1: written by thread 0 in place in this SM's slot of a module-global array, 2: built in shared memory by
// warp 0 and copied to that slot; both from the k/v pointers alone, as a kernel without a map argument would).
// Arguments: k, v (uint8), maps (two CUtensorMap, read only for BULK 2 with DEVICE_MAP 0), int32 keys, out [grid]
// uint32: the CTA's sum of its 32-bit words.
#include <stdint.h>

#include "common/bulk_copy.cuh"
#include "common/cp_async.cuh"
#include "common/elect.cuh"
#include "common/mbarrier.cuh"
#include "common/smem.cuh"
#include "common/tensormap.cuh"

constexpr int kWarps = THREADS / 32;
constexpr int kTileBytes = BLOCK_N * ROW_BYTES;
constexpr int kStageBytes = 2 * kTileBytes;  // K tile, then V tile
constexpr int64_t kKeyStride = int64_t(HEADS) * ROW_BYTES;
// rows a copy moves in one run: the whole tile where rows are adjacent (one head), else one row
constexpr int kRunRows = HEADS == 1 ? BLOCK_N : 1;
static_assert(ROW_BYTES % 16 == 0 && THREADS % 32 == 0 && STAGES >= 2, "16-byte rows, whole warps, two stages");
// shared bytes where warp 0 builds the two maps (DEVICE_MAP 2), after the stages
constexpr int kMapBuildBytes = DEVICE_MAP == 2 ? 256 : 0;
static_assert(DEVICE_MAP == 0 || BULK == 2, "device-written maps serve the tensor copies only");

#if DEVICE_MAP
// One slot an SM (two maps: K, V), indexed by %smid: the CTA on an SM owns its slot while it runs. Safe only while at
// most one CTA of this module runs on an SM (the host pads the shared memory above half an SM's) and every CTA acquires
// the map it wrote (an earlier launch's CTA on the same SM left its own map, maybe cached, at the same address).
constexpr uint32_t kMapSlots = 256;  // above %nsmid of the H100 / H200 (at most 144 SMs a GH100)
__device__ __align__(128) uint8_t tensor_map_slots[kMapSlots][2][128];

// This SM's slot, holding the maps of K and V (bytes of [keys][HEADS * ROW_BYTES], boxes of one head's ROW_BYTES x
// BLOCK_N) written and released by this CTA and acquired by thread 0, the thread that issues the tensor copies.
__device__ __forceinline__ const uint8_t* write_tensor_maps(uint8_t* smem_build, const uint8_t* k, const uint8_t* v,
                                                            int keys) {
  const uint32_t sm = sm_id();
  if (sm >= kMapSlots) __trap();  // more SMs than slots: raise kMapSlots
  uint8_t* slot = tensor_map_slots[sm][0];
  constexpr uint32_t kRow = HEADS * ROW_BYTES;
  if constexpr (DEVICE_MAP == 1) {
    if (threadIdx.x == 0) {  // (the slot's bits outside the replaced fields: zero from module load, or this same map)
      tensormap_write_2d_global<0, 0>(slot, k, kRow, keys, kRow, ROW_BYTES, BLOCK_N);  // UINT8, no swizzle
      tensormap_write_2d_global<0, 0>(slot + 128, v, kRow, keys, kRow, ROW_BYTES, BLOCK_N);
      tensormap_release_gpu();
    }
  } else {
    if (threadIdx.x < 32) {
      const uint32_t build = smem_addr(smem_build);
      if (threadIdx.x < 16) reinterpret_cast<uint4*>(smem_build)[threadIdx.x] = make_uint4(0, 0, 0, 0);
      __syncwarp();
      if (threadIdx.x == 0) {
        tensormap_write_2d_shared<0, 0>(build, k, kRow, keys, kRow, ROW_BYTES, BLOCK_N);
        tensormap_write_2d_shared<0, 0>(build + 128, v, kRow, keys, kRow, ROW_BYTES, BLOCK_N);
      }
      __syncwarp();
      tensormap_copy_release_gpu(slot, build);
      tensormap_copy_release_gpu(slot + 128, build + 128);
    }
  }
  if (threadIdx.x == 0) {
    tensormap_acquire_gpu(slot);
    tensormap_acquire_gpu(slot + 128);
  }
  return slot;
}
#endif

// Issue the `rows` rows of K and V from `k` and `v` (the tile's first row: key `key` of head `head`) into stage
// `stage`.
__device__ __forceinline__ void load_stage(uint8_t* smem, uint32_t bars, const uint8_t* k, const uint8_t* v,
                                           const uint8_t* maps, int head, int key, int rows, int stage) {
  const uint32_t dst = smem_addr(smem) + stage * kStageBytes;
  if constexpr (BULK == 2) {
    const uint32_t bar = bars + 8 * stage;
    if (threadIdx.x == 0) {  // (a box past the keys' end lands zero-filled and counts whole)
      mbarrier_arrive_expect_tx(bar, kStageBytes);
      bulk_tensor_2d_to_shared(dst, maps, head * ROW_BYTES, key, bar);
      bulk_tensor_2d_to_shared(dst + kTileBytes, maps + 128, head * ROW_BYTES, key, bar);
    }
  } else if constexpr (BULK) {
    const uint32_t bar = bars + 8 * stage;
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) mbarrier_arrive_expect_tx(bar, 2 * rows * ROW_BYTES);
    if (elect_one_sync()) {
      const int runs = (rows + kRunRows - 1) / kRunRows;
      for (int i = warp; i < 2 * runs; i += kWarps) {
        const int tensor = i / runs, run = i % runs;
        const int run_rows = kRunRows == 1 ? 1 : rows;
        bulk_copy_to_shared(dst + tensor * kTileBytes + run * kRunRows * ROW_BYTES,
                            (tensor ? v : k) + int64_t(run) * kRunRows * kKeyStride,
                            run_rows * ROW_BYTES, bar);
      }
    }
  } else {
    constexpr int kChunks = ROW_BYTES / 16;
    for (int idx = threadIdx.x; idx < 2 * BLOCK_N * kChunks; idx += THREADS) {
      const int tensor = idx / (BLOCK_N * kChunks), row = idx / kChunks % BLOCK_N, chunk = idx % kChunks;
      if (row < rows)
        cp_async_16(dst + tensor * kTileBytes + (row * kChunks + chunk) * 16,
                    (tensor ? v : k) + row * kKeyStride + chunk * 16, 16);
    }
    cp_async_commit();
  }
}

#if CLUSTER > 1
#define STREAM_CLUSTER __cluster_dims__(CLUSTER, 1, 1)
#else
#define STREAM_CLUSTER
#endif

extern "C" __global__ void STREAM_CLUSTER __launch_bounds__(THREADS)
    stream_read(const uint8_t* __restrict__ k, const uint8_t* __restrict__ v, const uint8_t* __restrict__ maps, int keys,
                uint32_t* __restrict__ out) {
  // all shared memory dynamic (the launcher opts in above 48 KB by the dynamic size alone): the stages, then one
  // mbarrier a stage, then the block's sum
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * kStageBytes + kMapBuildBytes);
  uint32_t& block_sum = *reinterpret_cast<uint32_t*>(full + STAGES);
  const int head = blockIdx.x / SPLIT, part = blockIdx.x % SPLIT;
  const int64_t first = int64_t(keys) * part / SPLIT, count = int64_t(keys) * (part + 1) / SPLIT - first;
  const uint8_t* k0 = k + first * kKeyStride + head * ROW_BYTES;
  const uint8_t* v0 = v + first * kKeyStride + head * ROW_BYTES;
  const int tiles = static_cast<int>((count + BLOCK_N - 1) / BLOCK_N);
  const uint32_t bars = smem_addr(full);
  if (threadIdx.x == 0) {
    block_sum = 0;
    if constexpr (BULK) {
      for (int s = 0; s < STAGES; ++s) mbarrier_init(bars + 8 * s, 1);
      fence_mbarrier_init_cluster();  // the inits visible to the TMA unit's complete_tx
    }
  }
#if DEVICE_MAP
  maps = write_tensor_maps(smem + STAGES * kStageBytes, k, v, keys);
#endif
  __syncthreads();
  auto rows_of = [&](int t) { return static_cast<int>(min(int64_t(BLOCK_N), count - int64_t(t) * BLOCK_N)); };
  auto issue = [&](int t) {
    if (t < tiles) {
      load_stage(smem, bars, k0 + int64_t(t) * BLOCK_N * kKeyStride, v0 + int64_t(t) * BLOCK_N * kKeyStride, maps,
                 head, static_cast<int>(first) + t * BLOCK_N, rows_of(t), t % STAGES);
    } else if (!BULK) {
      cp_async_commit();  // an empty group keeps the wait count below uniform
    }
  };
  for (int t = 0; t < STAGES - 1; ++t) issue(t);
  uint32_t sum = 0;
  for (int t = 0; t < tiles; ++t) {
    const int stage = t % STAGES;
    if constexpr (BULK) {
      mbarrier_wait(bars + 8 * stage, (t / STAGES) & 1);
    } else {
      cp_async_wait<STAGES - 2>();
    }
    __syncthreads();  // tile t landed for all; every thread is done reading tile t - 1, whose stage is refilled now
    issue(t + STAGES - 1);
    const int rows = rows_of(t);
    const uint4* tile = reinterpret_cast<const uint4*>(smem + stage * kStageBytes);
    for (int tensor = 0; tensor < 2; ++tensor)
      for (int i = threadIdx.x; i < rows * ROW_BYTES / 16; i += THREADS) {
        const uint4 w = tile[tensor * kTileBytes / 16 + i];
        sum += w.x + w.y + w.z + w.w;
      }
  }
  atomicAdd(&block_sum, sum);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = block_sum;
}
