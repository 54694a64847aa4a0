// FusedConv as an implicit GEMM (cuDNN's formulation): NHWC activations, OHWI weights, the epilogue fused.
//
//   GEMM rows    m = (n, p, q)           M = N*P*Q output pixels
//   GEMM columns k_out in the group      Kg = K / GROUPS (grid.z walks the groups)
//   reduction    kg = (r, s, c)          KH*KW*Cg, flattened in OHWI order, so W is a plain [Kg, KH*KW*Cg] matrix
// The lowered input matrix exists only tile by tile in shared memory: each thread precomputes, once, the input
// offset and the top-left input coordinate of the output pixels it loads for, and per reduction tile turns kg into
// (r, s, c) with one fast division by Cg (fast_divmod.cuh). Tiles stream through a STAGES-deep cp.async pipeline
// into XOR-swizzled shared memory, are read with ldmatrix and multiplied with mma.sync m16n8k16 (fp32 accumulate).
// The epilogue (epilogue.cuh) runs on the accumulators, stages the tile through shared memory and leaves as
// OUT_VEC-wide stores, with the residual read the same way.
//
// Loaders: IN_VEC = 8 (Cg % 8 == 0) moves 16-byte chunks of 8 channels with cp.async (zero-filled outside the
// image); IN_VEC = 1 (any Cg, e.g. the 3-channel stem) gathers elements into registers one tile ahead and stores
// them after the tile's MMAs.
//
// Split reduction (SPLIT_K > 1): the CTA holds SPLIT_K groups of WARPS_M x WARPS_N warps on the same output tile,
// group g taking reduction tiles g, g + SPLIT_K, ... through its own pipeline (own stages, own named barrier); the
// groups' accumulators are summed through shared memory before the epilogue. More warps per output tile hide the
// load latency of deep, narrow layers (3x3 over 256+ channels at 7x7/14x14) without a workspace or second kernel.
//
// FP8 (FP8 = 1, sm_89+): X stays float16/bfloat16 in global memory and is quantized to e4m3 on its way into shared
// memory (x * INPUT_SCALE_INV, saturating round-to-nearest-even: the contract's e4m3(X / input_scale)); W is e4m3 in
// global memory. Operand tiles hold bytes, the MMA is mma.sync m16n8k32 e4m3 (same ldmatrix addressing: a 32-byte
// k-step either way), and the epilogue multiplies the fp32 accumulator by INPUT_SCALE (and the per-channel scale).
// With 16-byte loads (IN_VEC = 8) the A tile lands as elem_t by cp.async in its pipeline stage and is quantized
// once per CTA into a ring of e4m3 A tiles, one tile ahead of the MMAs; with the element gather the registers are
// quantized when stored. X_E4M3 = 1: X is already e4m3 in global memory (the previous layer wrote e4m3(x /
// input_scale)), so A moves as bytes like W (C/G % 16 == 0): half the A traffic and no quantize pass.
//
// WGMMA = 1 (sm_90a, 16-byte loads, whole warpgroups): the MMAs are Hopper's asynchronous warpgroup MMAs
// (wgmma.cuh) straight from the swizzled tiles (the kernel's XOR swizzle is wgmma's 64/128-byte swizzle); warpgroup
// w of a group owns rows w * BLOCK_M / warpgroups.. of the tile and every column. One tile's MMAs stay in flight
// while the next tile is waited for and issued (wait_group 1), so loads run STAGES - 2 tiles ahead. The
// accumulators keep the m16n8 fragment layout per warp, so split groups and the epilogue are shared. (ptxas lowers
// mma.sync e4m3 on sm_90 to fp16 HMMA: Hopper's FP8 rate is wgmma-only.)
//
// TAPS_INNER = 1 (C/G % BLOCK_K == 0): reduction tiles walk every filter tap of one BLOCK_K channel chunk before
// the next chunk, and A is loaded through L1 (cp.async.ca): consecutive tiles read overlapping input windows, so
// most of a 3x3 layer's A traffic hits L1 instead of L2.
// CLUSTER_K > 1 (sm_90): the reduction is split over a thread-block cluster of CLUSTER_K CTAs along grid.z (a
// compile-time cluster shape, so the launch itself is plain); CTA rank r takes the r-th contiguous slice of the
// reduction tiles, and rank 0 sums the others' partial tiles from their shared memory (DSMEM) before the epilogue.
// Deep layers with few output tiles (3x3 over 512 channels at 7x7) fill the GPU without a workspace.
//
// Compile-time: CONV_BF16, FP8 (+ INPUT_SCALE, INPUT_SCALE_INV, X_E4M3), WGMMA, TAPS_INNER, CLUSTER_K, KH, KW, STRIDE_H,
// STRIDE_W, DIL_H, DIL_W, GROUPS, BLOCK_M, BLOCK_N, BLOCK_K (32|64; FP8: 64|128), WARPS_M, WARPS_N, SPLIT_K,
// STAGES (per group), IN_VEC, OUT_VEC, and the epilogue's defines.
// Arguments (AOT plugin ABI): x [N,H,W,C] (X_E4M3: e4m3), w [K,KH,KW,C/G] (FP8: e4m3), shift?, scale?, residual? [N,P,Q,K];
// int32 N, H, W, C, K, P, Q, pad_h, pad_w; y [N,P,Q,K]. Tensors must hold < 2^31 elements.
#include "element.cuh"
#include "fast_divmod.cuh"
#include "epilogue.cuh"
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
// A staged as elem_t and quantized in shared memory: FP8 with float16/bfloat16 X on the 16-byte path.
#define QUANTIZE_A (FP8 && IN_VEC == 8 && !X_E4M3)
#ifndef CLUSTER_K
#define CLUSTER_K 1
#endif
#if WGMMA
#include "wgmma.cuh"
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

// Byte offset of (row, byte) in a swizzled tile of CHUNKS 16-byte chunks per row: the 8 rows one ldmatrix phase
// reads at one chunk column land in 8 different bank groups.
template <int CHUNKS>
__device__ __forceinline__ int smem_offset(int row, int byte) {
  const int swizzle = CHUNKS >= 8 ? (row & 7) : ((row >> 1) & 3);
  return (row * CHUNKS + ((byte >> 4) ^ swizzle)) * 16 + (byte & 15);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !pred; through L1 (.ca) when L1 is true, else L2 only (.cg).
template <bool L1 = false>
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool pred) {
  if constexpr (L1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Barrier over one reduction group's threads (named barrier 1 + group; 0 is __syncthreads').
__device__ __forceinline__ void group_barrier(int group) {
  if (SPLIT_K == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;\n" ::"r"(group + 1), "n"(kGroupThreads) : "memory");
  }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// One 32-byte k-step: m16n8k16 f16/bf16 or m16n8k32 e4m3, fp32 accumulate. Both fragments hold, per register,
// 4 consecutive bytes of one row, so ldmatrix (b16) addresses the bytes alike.
__device__ __forceinline__ void mma_k32bytes(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#if FP8
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
#elif CONV_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
#endif
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
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

#if WGMMA
// Issue one tile's warpgroup MMAs (A: this warpgroup's rows of the A tile, B: the W tile) as one commit group; they
// run asynchronously until a later wgmma_wait.
__device__ __forceinline__ void wgmma_tile_issue(float (&acc)[kMI][kNI][4], const unsigned char* a_tile,
                                                 const unsigned char* b_tile, int warpgroup) {
  const unsigned long long b_desc = smem_descriptor<kRowBytes>(b_tile);
  const unsigned char* a_rows = a_tile + warpgroup * kWgRows * kRowBytes;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) fence_accumulators<kNI * 4>(&acc[mi][0][0]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kRowBytes / 32; ++kk)  // a 32-byte k-step moves the descriptors' start by 2 (16-byte units)
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
      wgmma_k32bytes<BLOCK_N>(&acc[mi][0][0], smem_descriptor<kRowBytes>(a_rows + mi * 64 * kRowBytes) + 2 * kk,
                              b_desc + 2 * kk);
  wgmma_commit();
}

// Wait until at most PENDING of this warpgroup's tile MMA groups are still running.
template <int PENDING>
__device__ __forceinline__ void wgmma_tile_wait(float (&acc)[kMI][kNI][4]) {
  wgmma_wait<PENDING>();
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) fence_accumulators<kNI * 4>(&acc[mi][0][0]);
}
#endif

#if CLUSTER_K > 1
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The shared::cluster address of the same variable in the cluster's CTA ``rank``.
__device__ __forceinline__ unsigned cluster_address(const void* local, int rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
  return remote;
}

__device__ __forceinline__ float load_cluster(unsigned address) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(address) : "memory");
  return v;
}
#endif

// A group's accumulators as one partial tile in shared memory, in fragment order (consecutive threads, consecutive
// words: conflict-free), for the split groups' and the cluster's sums.
constexpr int kAccRegs = kMI * kNI * 4;  // accumulators per thread
__device__ __forceinline__ void store_partial(const float (&acc)[kMI][kNI][4], float* partial, int group_tid) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) partial[i * kGroupThreads + group_tid] = (&acc[0][0][0])[i];
}
__device__ __forceinline__ void add_partial(float (&acc)[kMI][kNI][4], const float* partial, int group_tid) {
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) (&acc[0][0][0])[i] += partial[i * kGroupThreads + group_tid];
}

// Reduction tile t's first reduction index: OHWI order, or with TAPS_INNER every tap of one BLOCK_K channel chunk
// before the next chunk (consecutive tiles then read overlapping input windows).
__device__ __forceinline__ int tile_k0(int t, int Cg) {
#if TAPS_INNER
  const int chunk = t / (KH * KW), rs = t - chunk * (KH * KW);
  return rs * Cg + chunk * BLOCK_K;
#else
  return t * BLOCK_K;
#endif
}

#if FP8
// e4m3(x * INPUT_SCALE_INV) of 4 values, packed low byte first (saturating, round-to-nearest-even).
__device__ __forceinline__ unsigned quantize4(float x0, float x1, float x2, float x3) {
  const float inv = float(INPUT_SCALE_INV);
  const unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(x0 * inv, x1 * inv), __NV_SATFINITE, __NV_E4M3);
  const unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(x2 * inv, x3 * inv), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// 4 elements packed in two elem2_t words -> 4 e4m3 bytes.
__device__ __forceinline__ unsigned quantize4(unsigned lo2, unsigned hi2) {
  const float2 a = elem2_to_float2(lo2), b = elem2_to_float2(hi2);
  return quantize4(a.x, a.y, b.x, b.y);
}

// One stage's elem_t A tile (swizzled, 2 * kChunks chunks per row) -> an e4m3 A tile (kChunks per row).
__device__ __forceinline__ void quantize_a_tile(unsigned char* dst, const unsigned char* src, int group_tid) {
  constexpr int kSrcChunks = 2 * kChunks;
  static_assert(BLOCK_M * kChunks % kGroupThreads == 0, "quantize pass must tile evenly");
#pragma unroll
  for (int j = 0; j < BLOCK_M * kChunks / kGroupThreads; ++j) {
    const int i = group_tid + j * kGroupThreads, row = i / kChunks, chunk = i % kChunks;
    const uint4 lo = *reinterpret_cast<const uint4*>(src + smem_offset<kSrcChunks>(row, chunk * 32));
    const uint4 hi = *reinterpret_cast<const uint4*>(src + smem_offset<kSrcChunks>(row, chunk * 32 + 16));
    uint4 q;
    q.x = quantize4(lo.x, lo.y); q.y = quantize4(lo.z, lo.w);
    q.z = quantize4(hi.x, hi.y); q.w = quantize4(hi.z, hi.w);
    *reinterpret_cast<uint4*>(dst + smem_offset<kChunks>(row, chunk * 16)) = q;
  }
}
#endif

// 8 consecutive reduction elements of A as operand bytes (FP8: quantized).
__device__ __forceinline__ op8_bits_t a_operand8(const elem_t* v) {
#if FP8
  return make_uint2(quantize4(to_float(v[0]), to_float(v[1]), to_float(v[2]), to_float(v[3])),
                    quantize4(to_float(v[4]), to_float(v[5]), to_float(v[6]), to_float(v[7])));
#else
  Op8 o;
#pragma unroll
  for (int e = 0; e < 8; ++e) o.e[e] = v[e];
  return o.bits;
#endif
}

// The input pixel window of one output row m: element offset of (n, h0, w0, group's first channel) and h0, w0.
// Rows past M get an h0 no filter tap can bring inside the image.
struct RowOrigin {
  int offset, h0, w0;
  __device__ __forceinline__ RowOrigin(int m, int M, const FastDivmod& pq_div, const FastDivmod& q_div, int H, int W,
                                       int C, int pad_h, int pad_w, int channel0) {
    int pq, q;
    const int n = pq_div.divmod(m, &pq);
    const int p = q_div.divmod(pq, &q);
    const int h = p * STRIDE_H - pad_h;
    w0 = q * STRIDE_W - pad_w;
    offset = ((n * H + h) * W + w0) * C + channel0;
    h0 = m < M ? h : -(1 << 28);
  }
};

#if IN_VEC == 8
// cp.async loader. A: thread owns one 16-byte chunk column (8 elem_t) and kRows rows; B: one 16-byte chunk column
// (8 elem_t or 16 e4m3, so FP8 needs a reduction length that is a multiple of 16) and kBRows rows.
// Both land in the stage in the A tile's and the MMA operand's swizzled layouts.
struct TileLoader {
  static constexpr int kAChunks = BLOCK_K * int(sizeof(x_t)) / 16;
  static constexpr int kBCols = kChunks;
  static constexpr int kRows = BLOCK_M * kAChunks / kGroupThreads;
  static constexpr int kBRows = BLOCK_N * kBCols / kGroupThreads;
  static_assert(kRows >= 1 && kBRows >= 1 && kGroupThreads % kBCols == 0, "tile too small for the thread count");
  int a_offset[kRows], a_h0[kRows], a_w0[kRows];
  int b_offset[kBRows];
  unsigned b_valid;
  int chunk, row0, b_col, b_row0;

  __device__ __forceinline__ TileLoader(int tid, int m0, int n0, int g, int M, int Kg, int Kgemm, int H, int W,
                                        int C, int Cg, int pad_h, int pad_w, const FastDivmod& pq_div,
                                        const FastDivmod& q_div) {
    chunk = tid % kAChunks;
    row0 = tid / kAChunks;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const RowOrigin o(m0 + row0 + i * (kGroupThreads / kAChunks), M, pq_div, q_div, H, W, C, pad_h, pad_w,
                        g * Cg);
      a_offset[i] = o.offset; a_h0[i] = o.h0; a_w0[i] = o.w0;
    }
    b_col = tid % kBCols;
    b_row0 = tid / kBCols;
    b_valid = 0;
#pragma unroll
    for (int j = 0; j < kBRows; ++j) {
      const int kout = n0 + b_row0 + j * (kGroupThreads / kBCols);
      b_offset[j] = (g * Kg + kout) * Kgemm;
      b_valid |= unsigned(kout < Kg) << j;
    }
  }

  __device__ __forceinline__ void load(unsigned char* stage, int k0, const x_t* x, const op_t* w, int H, int W,
                                       int C, int Kgemm, const FastDivmod& cg_div) {
    const int kg = k0 + chunk * (16 / int(sizeof(x_t)));
    int c;
    const int rs = cg_div.divmod(kg, &c);
    const int r = rs / KW, s = rs - (rs / KW) * KW;
    const int dh = r * DIL_H, dw = s * DIL_W;
    const int delta = (dh * W + dw) * C + c;
    const bool k_ok = kg < Kgemm;
    const unsigned a_base = smem_addr(stage), b_base = smem_addr(stage + kAStageBytes);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = row0 + i * (kGroupThreads / kAChunks);
      const bool ok = k_ok && unsigned(a_h0[i] + dh) < unsigned(H) && unsigned(a_w0[i] + dw) < unsigned(W);
      cp_async_16<TAPS_INNER>(a_base + smem_offset<kAChunks>(row, chunk * 16), ok ? x + a_offset[i] + delta : x,
                              ok);
    }
    const int kb = k0 + b_col * (16 / int(sizeof(op_t)));
#pragma unroll
    for (int j = 0; j < kBRows; ++j) {
      const int row = b_row0 + j * (kGroupThreads / kBCols);
      const bool ok = kb < Kgemm && ((b_valid >> j) & 1);
      cp_async_16(b_base + smem_offset<kChunks>(row, b_col * 16), ok ? w + b_offset[j] + kb : w, ok);
    }
  }
};
#else
// Element gather for channel counts that are not multiples of 8: thread owns one A row (and one B row) and a run
// of kA (kB) consecutive reduction indices, walked incrementally through (r, s, c).
struct TileLoader {
  static constexpr int kASegs = kGroupThreads / BLOCK_M, kA = BLOCK_K / kASegs;
  static constexpr int kBSegs = kGroupThreads / BLOCK_N, kB = BLOCK_K / kBSegs;
  static_assert(kGroupThreads % BLOCK_M == 0 && kGroupThreads % BLOCK_N == 0 && kA % 8 == 0 && kB % 8 == 0,
                "element gather needs BLOCK_M, BLOCK_N dividing the thread count in runs of 8");
  RowOrigin a;
  int a_row, a_seg, b_row, b_seg, b_offset;
  bool b_ok;
  elem_t a_vals[kA];
  op_t b_vals[kB];

  __device__ __forceinline__ TileLoader(int tid, int m0, int n0, int g, int M, int Kg, int Kgemm, int H, int W,
                                        int C, int Cg, int pad_h, int pad_w, const FastDivmod& pq_div,
                                        const FastDivmod& q_div)
      : a(m0 + tid % BLOCK_M, M, pq_div, q_div, H, W, C, pad_h, pad_w, g * Cg) {
    a_row = tid % BLOCK_M; a_seg = tid / BLOCK_M;
    b_row = tid % BLOCK_N; b_seg = tid / BLOCK_N;
    b_ok = n0 + b_row < Kg;
    b_offset = (g * Kg + n0 + b_row) * Kgemm;
  }

  __device__ __forceinline__ void gather(int k0, const elem_t* x, const op_t* w, int H, int W, int C, int Cg,
                                         int Kgemm, const FastDivmod& cg_div) {
    const elem_t zero = from_float(0.f);
    int kg = k0 + a_seg * kA, c;
    const int rs = cg_div.divmod(kg, &c);
    int r = rs / KW, s = rs - (rs / KW) * KW;
#pragma unroll
    for (int j = 0; j < kA; ++j) {
      const int h = a.h0 + r * DIL_H, wi = a.w0 + s * DIL_W;
      const bool ok = kg + j < Kgemm && unsigned(h) < unsigned(H) && unsigned(wi) < unsigned(W);
      a_vals[j] = ok ? x[a.offset + (r * DIL_H * W + s * DIL_W) * C + c] : zero;
      if (++c == Cg) { c = 0; if (++s == KW) { s = 0; ++r; } }
    }
    const int kb = k0 + b_seg * kB;
#pragma unroll
    for (int j = 0; j < kB; ++j) b_vals[j] = b_ok && kb + j < Kgemm ? w[b_offset + kb + j] : op_t(0);
  }

  __device__ __forceinline__ void store(unsigned char* stage) const {
    constexpr int kOp = int(sizeof(op_t));
#pragma unroll
    for (int j = 0; j < kA / 8; ++j)
      *reinterpret_cast<op8_bits_t*>(stage + smem_offset<kChunks>(a_row, (a_seg * kA + j * 8) * kOp)) =
          a_operand8(a_vals + j * 8);
#pragma unroll
    for (int j = 0; j < kB / 8; ++j) {
      Op8 v;
#pragma unroll
      for (int e = 0; e < 8; ++e) v.e[e] = b_vals[j * 8 + e];
      *reinterpret_cast<op8_bits_t*>(stage + kAStageBytes + smem_offset<kChunks>(b_row, (b_seg * kB + j * 8) * kOp)) =
          v.bits;
    }
  }
};
#endif

#if CLUSTER_K > 1
#define CLUSTER_ATTRIBUTE __cluster_dims__(1, 1, CLUSTER_K)
#else
#define CLUSTER_ATTRIBUTE
#endif

extern "C" __global__ void __launch_bounds__(kThreads) CLUSTER_ATTRIBUTE
fused_conv_implicit_gemm(const x_t* __restrict__ x, const op_t* __restrict__ w SHIFT_PARAM SCALE_PARAM
                         RESIDUAL_PARAM, int N, int H, int W, int C, int K, int P, int Q, int pad_h, int pad_w,
                         elem_t* __restrict__ y) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // wgmma's swizzle atoms: 512/1024-byte aligned

  const int tid = threadIdx.x, lane = tid & 31;
  const int group = tid / kGroupThreads, group_tid = tid % kGroupThreads, warp = group_tid >> 5;
#if WGMMA
  const int row_base = (warp >> 2) * kWgRows + (warp & 3) * 16, col_base = 0;  // this warp's accumulator rows
#else
  const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
  const int row_base = warp_m * kWarpM, col_base = warp_n * kWarpN;
#endif
  const int Cg = C / GROUPS, Kg = K / GROUPS;
  const int M = N * P * Q, Kgemm = KH * KW * Cg;
  const int m0 = blockIdx.x * BLOCK_M, n0 = blockIdx.y * BLOCK_N;
  const int g = blockIdx.z / CLUSTER_K, rank = blockIdx.z % CLUSTER_K;  // conv group; CTA rank in the cluster
  const FastDivmod pq_div(P * Q), q_div(Q), cg_div(Cg);
  unsigned char* stages = smem_raw + group * kGroupBytes;
#if QUANTIZE_A
  unsigned char* a8 = stages + STAGES * kStageBytes;  // the ring of quantized A tiles
#endif

  TileLoader loader(group_tid, m0, n0, g, M, Kg, Kgemm, H, W, C, Cg, pad_h, pad_w, pq_div, q_div);

  float acc[kMI][kNI][4];
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;

  // This CTA's contiguous slice of the reduction tiles; group takes the slice's tiles group, group + SPLIT_K, ...
  const int tiles = (Kgemm + BLOCK_K - 1) / BLOCK_K;
  const int t_begin = rank * tiles / CLUSTER_K, t_end = (rank + 1) * tiles / CLUSTER_K;
  const int k_tiles = (t_end - t_begin - group + SPLIT_K - 1) / SPLIT_K;
  auto k0_of = [&](int i) { return tile_k0(t_begin + group + i * SPLIT_K, Cg); };
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < k_tiles) {
#if IN_VEC == 8
      loader.load(stages + st * kStageBytes, k0_of(st), x, w, H, W, C, Kgemm, cg_div);
#else
      loader.gather(k0_of(st), x, w, H, W, C, Cg, Kgemm, cg_div);
      loader.store(stages + st * kStageBytes);
#endif
    }
    cp_async_commit();
  }
#if QUANTIZE_A
  // Tile 0's A quantized before the loop; iteration it quantizes tile it + 1 while the MMAs run on tile it.
  cp_async_wait<kAhead - 1>();
  group_barrier(group);
  if (k_tiles > 0) quantize_a_tile(a8, stages, group_tid);
#endif

  for (int it = 0; it < k_tiles; ++it) {
    cp_async_wait<kAhead - 1 - kQuantAhead>();  // tile it (and it + 1 when A is quantized ahead) has landed
#if WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // this thread's tile writes, seen by wgmma
#endif
    // Everyone's tile data is visible, and every MMA that read the stage loaded next has finished.
    group_barrier(group);
    const int ahead = it + kAhead;
    unsigned char* stage = stages + (it % STAGES) * kStageBytes;
#if IN_VEC == 8
    if (ahead < k_tiles) loader.load(stages + (ahead % STAGES) * kStageBytes, k0_of(ahead), x, w, H, W, C, Kgemm,
                                     cg_div);
    cp_async_commit();
#else
    if (ahead < k_tiles) loader.gather(k0_of(ahead), x, w, H, W, C, Cg, Kgemm, cg_div);
#endif
#if QUANTIZE_A
    const unsigned char* a_tile = a8 + (it % kA8Tiles) * kA8Bytes;
#else
    const unsigned char* a_tile = stage;
#endif
#if WGMMA
    wgmma_tile_issue(acc, a_tile, stage + kAStageBytes, warp >> 2);
#endif
#if QUANTIZE_A
    if (it + 1 < k_tiles)
      quantize_a_tile(a8 + ((it + 1) % kA8Tiles) * kA8Bytes, stages + ((it + 1) % STAGES) * kStageBytes, group_tid);
#endif
#if WGMMA
    wgmma_tile_wait<1>(acc);  // the previous tile's MMAs are done: its stage may be loaded after the next barrier
#else
    mma_stage(acc, a_tile, stage + kAStageBytes, row_base, col_base, lane);
#endif
#if IN_VEC != 8
    if (ahead < k_tiles) loader.store(stages + (ahead % STAGES) * kStageBytes);
#endif
  }
#if WGMMA
  wgmma_tile_wait<0>(acc);
#endif
  cp_async_wait<0>();
  __syncthreads();

#if SPLIT_K > 1
  // Sum the groups' partial accumulators into group 0's.
  {
    float* partial = reinterpret_cast<float*>(smem_raw);
    if (group > 0) store_partial(acc, partial + (group - 1) * kAccRegs * kGroupThreads, group_tid);
    __syncthreads();
    if (group == 0)
#pragma unroll
      for (int s = 0; s < SPLIT_K - 1; ++s)
        add_partial(acc, partial + s * kAccRegs * kGroupThreads, group_tid);
    __syncthreads();
  }
#endif
#if CLUSTER_K > 1
  // Sum the cluster's partial tiles into rank 0's group 0 through distributed shared memory; the other CTAs wait
  // until rank 0 has read their shared memory, then leave.
  {
    float* partial = reinterpret_cast<float*>(smem_raw);
    if (rank > 0 && group == 0) store_partial(acc, partial, group_tid);
    cluster_sync();
    if (rank == 0 && group == 0)
#pragma unroll 1
      for (int r = 1; r < CLUSTER_K; ++r) {
        const unsigned remote = cluster_address(partial, r);
#pragma unroll
        for (int i = 0; i < kAccRegs; ++i)
          (&acc[0][0][0])[i] += load_cluster(remote + 4 * (i * kGroupThreads + group_tid));
      }
    cluster_sync();
    if (rank > 0) return;
  }
#endif

  // Epilogue: scale, shift, activation on the accumulators; the tile goes through shared memory so that the
  // residual read and the output store are OUT_VEC wide.
  elem_t* tile = reinterpret_cast<elem_t*>(smem_raw);
  const ChannelAffine affine{SCALE_ARG, SHIFT_ARG};
  const int channel0 = g * Kg + n0;
  if (group == 0) {
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni) {
      const int col = col_base + ni * 8 + (lane & 3) * 2;
      const bool ok0 = n0 + col < Kg, ok1 = n0 + col + 1 < Kg;
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = row_base + mi * kRowsPerMI + (lane >> 2) + half * 8;
          const float v0 = ok0 ? affine.apply(acc[mi][ni][half * 2], channel0 + col) : 0.f;
          const float v1 = ok1 ? affine.apply(acc[mi][ni][half * 2 + 1], channel0 + col + 1) : 0.f;
          *reinterpret_cast<elem2_t*>(tile + row * kCStride + col) = pack2(v0, v1);
        }
    }
  }
  __syncthreads();
  // Output pass in batches of kBatch vectors per thread: all residual loads of a batch are in flight at once.
  constexpr int kVecsPerRow = BLOCK_N / OUT_VEC;
  constexpr int kIters = BLOCK_M * kVecsPerRow / kThreads;
  constexpr int kBatch = kIters < 8 ? kIters : 8;
  static_assert(BLOCK_M * kVecsPerRow % kThreads == 0 && kIters % kBatch == 0, "output pass must tile evenly");
#pragma unroll 1
  for (int b = 0; b < kIters; b += kBatch) {
    ElemVec<OUT_VEC> res[kBatch];
    long long offset[kBatch];
    bool ok[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int idx = tid + (b + j) * kThreads;
      const int row = idx / kVecsPerRow, col = (idx % kVecsPerRow) * OUT_VEC;
      ok[j] = m0 + row < M && n0 + col < Kg;
      offset[j] = (long long)(m0 + row) * K + channel0 + col;
#if HAS_RESIDUAL
      if (ok[j]) res[j] = load_vec<OUT_VEC>(residual, offset[j]);
#endif
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (!ok[j]) continue;
      const int idx = tid + (b + j) * kThreads;
      const int row = idx / kVecsPerRow, col = (idx % kVecsPerRow) * OUT_VEC;
      ElemVec<OUT_VEC> staged;
      staged.bits = *reinterpret_cast<const typename VecBits<OUT_VEC>::type*>(tile + row * kCStride + col);
      float v[OUT_VEC];
#pragma unroll
      for (int e = 0; e < OUT_VEC; ++e) v[e] = to_float(staged.e[e]);
      store_output<OUT_VEC>(v, res[j], y, offset[j]);
    }
  }
}
