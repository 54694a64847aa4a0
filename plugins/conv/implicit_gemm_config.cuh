// Compile-time configuration of the implicit-GEMM kernel (implicit_gemm.cu): defaults of the optional defines, the
// operand types in shared memory, the tile geometry that follows from the defines, and the swizzled tile layout
// every role (loads, MMAs, FP8 quantize) addresses.
#pragma once
#include "common/element.cuh"
#include "common/named_barrier.cuh"
#if FP8
#include <cuda_fp8.h>
#endif

#ifndef SPLIT_K
#define SPLIT_K 1
#endif
#ifndef FP8
#define FP8 0
#endif
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef TAPS_INNER
#define TAPS_INNER 0
#endif
#ifndef X_E4M3
#define X_E4M3 0
#endif
#ifndef WARP_SPECIALIZED
#define WARP_SPECIALIZED 0  // 1: implicit_gemm_sm90.cu (a load warpgroup feeding WARPS_M x WARPS_N MMA warps)
#endif
// A staged as elem_t and quantized in shared memory: FP8 with float16/bfloat16 X on the 16-byte path.
#define QUANTIZE_A (FP8 && IN_VEC == 8 && !X_E4M3)
#ifndef CLUSTER_K
#define CLUSTER_K 1
#endif
#ifndef TAP_ROWS
#define TAP_ROWS 0  // 1: reduction tile r = filter row r, KW * TAP_CG elements and zeros (implicit_gemm_load_tap_rows.cuh)
#endif
#if TAP_ROWS && !defined(TAP_ROWS_BLOCKS)
#error "TAP_ROWS needs TAP_ROWS_BLOCKS: the blocks per SM its registers are capped for (the plan gives it)"
#endif

// The MMA operand type in shared memory: the element type, or e4m3 bytes.
#if FP8
typedef unsigned char op_t;
typedef uint2 op8_bits_t;
#else
typedef elem_t op_t;
typedef uint4 op8_bits_t;
#endif
#if X_E4M3
typedef unsigned char x_t;  // X already e4m3 in global memory (written by an FP8 producer): A lands as operand bytes
#else
typedef elem_t x_t;
#endif
union Op8 {  // 8 consecutive reduction elements of one operand row
  op8_bits_t bits;
  op_t e[8];
};

constexpr int kGroupThreads = WARPS_M * WARPS_N * 32;  // one reduction group: the warps of one output tile
constexpr int kThreads = kGroupThreads * SPLIT_K;
constexpr int kWarpM = BLOCK_M / WARPS_M, kWarpN = BLOCK_N / WARPS_N;
#if WGMMA
// Warpgroup w owns rows w * kWgRows..: kMI blocks of 64 rows (warp w % 4: rows 16 (w % 4).. of each), kNI blocks of
// 8 columns over the whole tile.
constexpr int kWarpgroups = WARPS_M * WARPS_N / 4, kWgRows = BLOCK_M / kWarpgroups;
constexpr int kMI = kWgRows / 64, kNI = BLOCK_N / 8, kRowsPerMI = 64;
static_assert(IN_VEC == 8 && WARPS_M * WARPS_N % 4 == 0 && kWgRows % 64 == 0,
              "wgmma: 16-byte loads, whole warpgroups of 64-row blocks");
#else
constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8, kRowsPerMI = 16;
#endif
constexpr bool kQuantizeA = QUANTIZE_A;
constexpr int kRowBytes = BLOCK_K * int(sizeof(op_t));    // one operand row of a tile the MMAs read
constexpr int kChunks = kRowBytes / 16;                   // 16-byte chunks per such row
constexpr int kAStageBytes = BLOCK_M * BLOCK_K * int(kQuantizeA ? sizeof(elem_t) : sizeof(op_t));
constexpr int kStageBytes = kAStageBytes + BLOCK_N * kRowBytes;
constexpr int kA8Bytes = BLOCK_M * kRowBytes;             // one quantized A tile
// Tiles loaded ahead of the MMAs: a stage is free once its MMAs are done; wgmma keeps the previous tile's in flight.
constexpr int kAhead = WGMMA ? STAGES - 2 : STAGES - 1;
constexpr int kQuantAhead = kQuantizeA ? 1 : 0;           // FP8: tile it + 1's A is quantized during iteration it
constexpr int kA8Tiles = WGMMA ? 3 : 2;                   // quantized A tiles: in use by MMAs, plus the one written
constexpr int kGroupBytes = STAGES * kStageBytes + (kQuantizeA ? kA8Tiles * kA8Bytes : 0);
constexpr int kCStride = BLOCK_N + 8;                     // padded row of the staged output tile
static_assert(kRowBytes == 64 || kRowBytes == 128, "BLOCK_K is 32 or 64 (FP8: 64 or 128)");
static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile must be a multiple of 16x16");
static_assert(kAhead >= 1 + kQuantAhead, "pipeline stages: 2 (+1 when A is quantized ahead, +1 for wgmma)");
static_assert(!X_E4M3 || (FP8 && IN_VEC == 8), "e4m3 X: FP8 with 16-byte loads (C/G % 16 == 0)");
static_assert(!TAPS_INNER || KH * KW > 1, "TAPS_INNER reorders the filter taps of a KHxKW > 1 filter");

// Reduction tiles of one output tile: BLOCK_K elements each, or (TAP_ROWS) one per filter row.
__device__ __forceinline__ int reduction_tiles(int Kgemm) { return TAP_ROWS ? KH : (Kgemm + BLOCK_K - 1) / BLOCK_K; }

// Byte offset of (row, byte) in a swizzled tile of CHUNKS 16-byte chunks per row: the 8 rows one ldmatrix phase
// reads at one chunk column land in 8 different bank groups.
template <int CHUNKS>
__device__ __forceinline__ int smem_offset(int row, int byte) {
  const int swizzle = CHUNKS >= 8 ? (row & 7) : ((row >> 1) & 3);
  return (row * CHUNKS + ((byte >> 4) ^ swizzle)) * 16 + (byte & 15);
}

// Barrier over one reduction group's threads (named barrier 1 + group; 0 is __syncthreads').
__device__ __forceinline__ void group_barrier(int group) {
  if (SPLIT_K == 1) {
    __syncthreads();
  } else {
    named_barrier_sync<kGroupThreads>(group + 1);
  }
}
