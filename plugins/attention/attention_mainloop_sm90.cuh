// The two matrix products of one K/V tile on Hopper (sm_90a, WGMMA=1): S = Q K^T and O += P V with wgmma, one
// warpgroup (4 warps) per 64 query rows. Same interface as attention_mainloop.cuh (the mma.sync mainloop), so the
// kernel body, masking, online softmax and epilogue are shared; only the shared-memory layout and the products differ.
//
// Shared-memory layout (every region 1024-byte aligned): a tile of ROWS rows x HEAD_DIM 16-bit elements is stored
// as HEAD_DIM / 64 column blocks of ROWS x 64 elements; in a column block, row r occupies 128 bytes at r * 128 and
// its 16-byte chunk c (elements 8c..8c+7) sits at chunk position c ^ (r % 8) -- the 128-byte swizzle (CuTe's
// Swizzle<3,4,3> on byte addresses: address bits 4-6 ^= bits 7-9). The three operands read that layout as:
// - Q (A of Q K^T, K-major) and K (B of Q K^T, K-major: stored N x K): rows at 128 B, 8-row groups at 1024 B (the
//   stride byte offset), no leading offset (1 by convention: a k16 step is 32 B, inside one swizzle row). The k16
//   step kk starts at column block kk / 4, byte 32 * (kk % 4) of the row; warpgroup g's A rows start at g * 64 rows.
// - V (B of P V, [keys, HEAD_DIM] with HEAD_DIM contiguous = MN-major, transpose flag 1): 8-key groups at 1024 B
//   (stride byte offset), the next 64-wide column block of HEAD_DIM at BLOCK_N * 128 B (leading byte offset); the
//   k16 step kk (16 keys) starts 2048 B further.
// - P (A of P V) comes from registers: the m64nN accumulator fragment of S is, per warp, the m16n8 layout of
//   mma.sync, and two adjacent n8 blocks of it rounded to 16 bits are the m64k16 A fragment (as in the mma.sync path).
// FP8 (E4M3 Q/K/V, the warp-specialized kernel): the same layout counted in bytes: a swizzle row is 128 e4m3 elements
// (head dim 64: 64-byte rows, the 64-byte swizzle, 16-byte chunk c of row r at c ^ ((r / 2) % 4), 8-row groups at
// 512 B), a k32 step is the same 32 bytes. P V reads V^T tiles ([HEAD_DIM][BLOCK_N] bytes, keys contiguous: FP8 wgmma
// takes only K-major B) that the loader writes (attention_v_transpose_sm90.cuh, which also derives P's e4m3 A
// fragment and the key order inside each k32 step it implies).
#pragma once
#include "attention_config.cuh"
#include "common/compiler_fences.cuh"
#include "common/cp_async.cuh"
#include "common/e4m3.cuh"
#include "common/smem.cuh"
#include "common/wgmma.cuh"

static_assert((kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256) && kHeadDimV == kHeadDim,
              "the wgmma mainloop serves head dims 64, 128 and 256 (the same for Q/K and V)");
// 80-key tiles: head dim 256 on the warp-specialized kernel, where two stages of 64 fit with 35 KB to spare
// (FlashAttention-3's hd256 tile is 128 x 80).
// 192-key tiles: FP8 head dim 128 (FlashAttention-3's FP8 hd128 tile is 128 x 224): 1.5x the keys per tile's fixed
// costs, S 96 + P 24 + O 64 registers a thread. 256-key tiles: FP8 head dim 128 on two warpgroups (cuDNN's FP8 hd128
// kernel, 64x256x128), with the serial step: S 128 + O 64 registers, P packed over S.
// 96-key tiles: head dim 128 on three MMA warpgroups (192 x 96), S 48 + P 12 + O 64 registers in 152 (FP8; and the
// 16-bit candidate, three K/V stages in 192 KB).
static_assert(kBlockN == 64 || kBlockN == 128 || (kBlockN == 80 && !FP8 && WARP_SPECIALIZED) ||
                  (kBlockN == 96 && WARP_SPECIALIZED && kHeadDim == 128) || ((kBlockN == 192 || kBlockN == 256) && FP8 && kHeadDim == 128),
              "the wgmma mainloop takes BLOCK_N 64 or 128 (the warp-specialized kernel at 16 bits also 80, at head "
              "dim 128 also 96; FP8 head dim 128 also 192 and 256)");
static_assert(kWarpRows == 16 && kMAtoms == 1 && kWarps % 4 == 0, "the wgmma mainloop needs BLOCK_M = 16 * NUM_WARPS "
              "(one warpgroup per 64 query rows)");
static_assert(Q_IN_REGISTERS == 0, "the wgmma mainloop reads Q from shared memory (Q_IN_REGISTERS=0)");
static_assert(!FP8 || WARP_SPECIALIZED, "FP8 runs on the warp-specialized kernel (its loader transposes V)");

// One swizzle row: 64 16-bit or 128 e4m3 elements (64 e4m3 at FP8 head dim 64, the 64-byte swizzle).
constexpr int kSwizzleRowBytes = kHeadDim * sizeof(qkv_t) < 128 ? kHeadDim * sizeof(qkv_t) : 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
constexpr int kSwizzleChunks = kSwizzleRowBytes / 16;  // 16-byte chunks per swizzle row
constexpr int kChunkElems = 16 / sizeof(qkv_t);         // elements per 16-byte chunk
constexpr int kQKSteps = kHeadDim * sizeof(qkv_t) / 32;  // 32-byte k-steps of Q K^T (k16, FP8 k32)
constexpr int kPVSteps = kBlockN * sizeof(qkv_t) / 32;   // 32-byte k-steps of P V over the keys
// FP8 V^T tiles: column blocks of kVtRowBytes keys ([HEAD_DIM rows][kVtRowBytes] each, one swizzle row a head-dim
// row), 128 where BLOCK_N is a multiple of 128, else 64 or 32 (192 keys: three blocks of 64; 96: three of 32)
constexpr int kVtRowBytes = kBlockN % 128 == 0 ? 128 : kBlockN % 64 == 0 ? 64 : 32;
constexpr int kQTileElems = kBlockM * kHeadDim;
constexpr int kKTileElems = kBlockN * kHeadDim;
constexpr int kVTileElems = kKTileElems;
constexpr int kSmemAlign = 1024;                 // every tile starts on a 128-byte-swizzle atom (8 rows of 128 B)
constexpr bool kOverlapPV = WGMMA_OVERLAP;        // P V of tile t+1 runs during the softmax of tile t (PendingPV)
constexpr int kVStages = kStages + kOverlapPV;    // V tile buffers
static_assert(!kOverlapPV || kStages == 2, "WGMMA_OVERLAP needs KV_STAGES=2");
static_assert((kQTileElems * sizeof(qkv_t)) % kSmemAlign == 0 && (kKTileElems * sizeof(qkv_t)) % kSmemAlign == 0,
              "tiles keep alignment");

// A tile's shared address, from its generic pointer or as already taken (a persistent CTA's K/V tiles:
// KVTileAddresses, attention_mma_warpgroups_sm90.cuh).
__device__ __forceinline__ uint32_t tile_address(const qkv_t* tile) { return smem_addr(tile); }
__device__ __forceinline__ uint32_t tile_address(uint32_t tile) { return tile; }

// cp.async (all but the kNewest most recent groups) has landed in this thread's smem; make it visible to wgmma
// (the caller then syncs the block).
template <int kNewest = 0>
__device__ __forceinline__ void wait_tiles_landed() {
  cp_async_wait<kNewest>();
  fence_async_proxy();
}

// Shared address of the 16-byte chunk `chunk` of row `row` in a ROWS-row tile at `tile`, laid out as
// load_tile_swizzled writes it (which walks the same layout incrementally).
template <int ROWS>
__device__ __forceinline__ uint32_t swizzled_chunk(uint32_t tile, int row, int chunk) {
  const int swizzle = kSwizzleRowBytes == 128 ? row % 8 : (row / 2) % 4;
  return tile + (chunk / kSwizzleChunks) * (ROWS * kSwizzleRowBytes) + row * kSwizzleRowBytes +
         ((chunk % kSwizzleChunks) ^ swizzle) * 16;
}

// Copy rows [row0, row0 + ROWS) of a [len, HEAD_DIM] matrix (row stride `stride` elements) into the swizzled tile
// by THREADS threads (this one is `tid`); rows >= len are zero-filled so they add nothing to P V and make no NaN.
// A thread copies one 16-byte chunk of every (THREADS / chunks per row)-th row: with 8k rows per step it keeps its
// row % 8 (its swizzle) throughout; with 4 (head dim 256 by one warpgroup) row % 8 alternates by XOR 4, since adding
// 4 modulo 8 flips bit 2. 64-byte rows (FP8 head dim 64: 32 rows a step) keep (row / 2) % 4. kGuarded = false: the
// caller knows every row is < len (no bounds test, no zero-fill select: 3 instructions a copy instead of 6-7).
template <int ROWS, int THREADS, bool kGuarded = true>
__device__ __forceinline__ void load_tile_swizzled(qkv_t* smem, const qkv_t* base, int64_t stride, int row0, int len,
                                                   int tid) {
  constexpr int kRowsPerStep = THREADS / kChunksPerRow;
  static_assert(THREADS % kChunksPerRow == 0 && kRowsPerStep % 4 == 0 && ROWS % kRowsPerStep == 0,
                "whole rows per step, 4 or a multiple of 8 of them");
  static_assert(kSwizzleRowBytes == 128 || kRowsPerStep % 8 == 0, "64-byte swizzle rows: 8k rows per step");
  const int row = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
  const qkv_t* src = base + (row0 + row) * stride + chunk * kChunkElems;  // one running pointer (few live registers)
  const int64_t step = kRowsPerStep * stride;
  const uint32_t dst = smem_addr(smem) + (chunk / kSwizzleChunks) * (ROWS * kSwizzleRowBytes) + row * kSwizzleRowBytes;
#pragma unroll
  for (int i = 0; i < ROWS / kRowsPerStep; ++i) {
    const bool valid = !kGuarded || row0 + row + i * kRowsPerStep < len;
    const int swizzle = kSwizzleRowBytes == 128 ? (row % 8) ^ ((i * kRowsPerStep) % 8) : (row / 2) % 4;
    cp_async_16(dst + i * kRowsPerStep * kSwizzleRowBytes + (((chunk % kSwizzleChunks) ^ swizzle) * 16),
                valid ? src : base, valid ? 16 : 0);
    src += step;
  }
}

// The single-role kernel's tile loads: every thread of the block.
template <int ROWS, int DIM>
__device__ __forceinline__ void load_tile_async(qkv_t* smem, const qkv_t* base, int64_t stride, int row0, int len) {
  static_assert(DIM == kHeadDim, "the wgmma tiles have one head dim");
  load_tile_swizzled<ROWS, kThreads>(smem, base, stride, row0, len, threadIdx.x);
}

// The A operand of S = Q K^T: this warpgroup's 64 rows of the Q tile in shared memory, as a wgmma descriptor;
// step(kk) is k-step kk's.
struct QFromSmem {
  uint64_t desc;
  __device__ __forceinline__ QFromSmem(const qkv_t* sQ, int warp, int /*lane*/)
      : desc(smem_desc<kSwizzleRowBytes>(smem_addr(sQ) + (warp / 4) * 64 * kSwizzleRowBytes, 16, kSwizzleAtomBytes)) {}
  __device__ __forceinline__ uint64_t step(int kk) const { return desc + (q_step_bytes(kk) >> 4); }
  static __device__ __forceinline__ uint32_t q_step_bytes(int kk) {
    constexpr int kStepsPerRow = kSwizzleRowBytes / 32;
    return (kk / kStepsPerRow) * (kBlockM * kSwizzleRowBytes) + (kk % kStepsPerRow) * 32;
  }
};

// The same operand with every k-step's descriptor built once (a persistent CTA: once per query tile) and pinned in
// registers, each made opaque so ptxas cannot rebuild it between the wgmmas of every K/V step, which it did from one
// base descriptor kept live across the CTA's tile loop (14 IADD3/IMAD.X a step at hd128; v6.2 of session 4 lost
// 10-15% with that rebuild).
struct QFromSmemPinned {
  uint64_t desc[kQKSteps];
  __device__ __forceinline__ explicit QFromSmemPinned(uint32_t rows) {
    const uint64_t base = smem_desc<kSwizzleRowBytes>(rows, 16, kSwizzleAtomBytes);
#pragma unroll
    for (int kk = 0; kk < kQKSteps; ++kk) desc[kk] = opaque_u64(base + (QFromSmem::q_step_bytes(kk) >> 4));
  }
  __device__ __forceinline__ uint64_t step(int kk) const { return desc[kk]; }
};

// Issue S (this warpgroup's 64 x kBlockN raw scores; this thread's part in the mma.sync fragment layout) = Q K^T
// as one wgmma group; the caller waits for it.
template <typename QOperand, typename KTile>
__device__ __forceinline__ void gemm_qk_issue(float (&s)[1][kNTiles][4], const QOperand& q, KTile sK) {
  constexpr int kStepsPerRow = kSwizzleRowBytes / 32;
  const uint64_t k_desc = smem_desc<kSwizzleRowBytes>(tile_address(sK), 16, kSwizzleAtomBytes);
  fence_operands(s[0]);
  wgmma_fence();  // S's registers were last read by the previous tile's softmax
#pragma unroll
  for (int kk = 0; kk < kQKSteps; ++kk) {
    const uint32_t b_bytes = (kk / kStepsPerRow) * (kBlockN * kSwizzleRowBytes) + (kk % kStepsPerRow) * 32;
    wgmma_ss<kBlockN>(s[0], q.step(kk), k_desc + (b_bytes >> 4), kk > 0);
  }
  wgmma_commit();
}

// S = Q K^T, complete on return.
__device__ __forceinline__ void gemm_qk(float (&s)[1][kNTiles][4], const QFromSmem& q, const qkv_t* sK, int) {
  gemm_qk_issue(s, q, sK);
  wgmma_wait<0>();
  fence_operands(s[0]);
}

// P (the probabilities in S's registers) rounded to the element type: the register A fragments of P V's k16 steps.
// FP8: rounded to e4m3 (P is already divided by p_scale: the softmax's exponent offset), four n8 blocks per k32
// step, in the key order of the V^T tiles (attention_v_transpose_sm90.cuh derives it).
__device__ __forceinline__ void pack_p(uint32_t (&a)[kPVSteps][4], const float (&p)[1][kNTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kPVSteps; ++kk) {
    if constexpr (FP8) {
      a[kk][0] = pack_e4m3x4(p[0][4 * kk][0], p[0][4 * kk][1], p[0][4 * kk + 1][0], p[0][4 * kk + 1][1]);
      a[kk][1] = pack_e4m3x4(p[0][4 * kk][2], p[0][4 * kk][3], p[0][4 * kk + 1][2], p[0][4 * kk + 1][3]);
      a[kk][2] = pack_e4m3x4(p[0][4 * kk + 2][0], p[0][4 * kk + 2][1], p[0][4 * kk + 3][0], p[0][4 * kk + 3][1]);
      a[kk][3] = pack_e4m3x4(p[0][4 * kk + 2][2], p[0][4 * kk + 2][3], p[0][4 * kk + 3][2], p[0][4 * kk + 3][3]);
    } else {
      a[kk][0] = pack_elem2(p[0][2 * kk][0], p[0][2 * kk][1]);
      a[kk][1] = pack_elem2(p[0][2 * kk][2], p[0][2 * kk][3]);
      a[kk][2] = pack_elem2(p[0][2 * kk + 1][0], p[0][2 * kk + 1][1]);
      a[kk][3] = pack_elem2(p[0][2 * kk + 1][2], p[0][2 * kk + 1][3]);
    }
  }
}

// Issue O += P V as one wgmma group; O and P stay owned by it until the caller's wait. FP8: sV is a V^T tile
// (BLOCK_N / kVtRowBytes column blocks of [HEAD_DIM][kVtRowBytes] bytes, 8-row groups at 8 * kVtRowBytes B), K-major,
// a k32 step 32 B on inside a block, the next block HEAD_DIM * kVtRowBytes B on.
template <typename VTile>
__device__ __forceinline__ void gemm_pv_issue(float (&o)[1][kDTiles][4], uint32_t (&a)[kPVSteps][4], VTile sV) {
  if constexpr (FP8) {
    const uint64_t vt_desc = smem_desc<kVtRowBytes>(tile_address(sV), 16, 8 * kVtRowBytes);
    fence_operands(a);
    fence_operands(o[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk) {
      const uint32_t b_bytes = (kk * 32 / kVtRowBytes) * (kHeadDim * kVtRowBytes) + (kk * 32) % kVtRowBytes;
      wgmma_rs_e4m3<kHeadDim>(o[0], a[kk], vt_desc + (b_bytes >> 4));
    }
  } else {
    const uint64_t v_desc = smem_desc<128>(tile_address(sV), kBlockN * kSwizzleRowBytes, kSwizzleAtomBytes);
    fence_operands(a);
    fence_operands(o[0]);
    wgmma_fence();  // P was written and O possibly rescaled by ordinary instructions
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk)
      wgmma_rs_b_mn_major<kHeadDim>(o[0], a[kk], v_desc + ((kk * 16 * kSwizzleRowBytes) >> 4));
  }
  wgmma_commit();
}

// O += P V, complete on return.
__device__ __forceinline__ void gemm_pv(float (&o)[1][kDTiles][4], const float (&p)[1][kNTiles][4],
                                        const qkv_t* sV, int) {
  uint32_t a[kPVSteps][4];
  pack_p(a, p);
  gemm_pv_issue(o, a, sV);
  wgmma_wait<0>();
  fence_operands(a);
  fence_operands(o[0]);
}

// WGMMA_OVERLAP=1 (FlashAttention-3's intra-warpgroup overlap): P V of the previous tile is issued right after Q K^T
// of the current one and awaited only after the current softmax, so the tensor cores run it during the exponentials.
// Needs a third V buffer (V of tiles t+1, t and t-1 are live at once) and O rescaled after that wait. V(t-1) is
// first read two tiles later, so it loads in its own cp.async group issued after the softmax (the loop top waits
// for all groups but that newest one); K(t-1) still loads from the top of the tile. Issues and
// waits are unconditional (ptxas serializes every wgmma when it cannot prove an accumulator idle where it is read):
// before the first tile the pending product is P = 0 times the first V tile, which adds nothing.
struct PendingPV {
  uint32_t p[kPVSteps][4];
  const qkv_t* sV;  // the V tile of the pending product

  __device__ __forceinline__ explicit PendingPV(const qkv_t* first_v_tile) : sV(first_v_tile) {
#pragma unroll
    for (int kk = 0; kk < kPVSteps; ++kk) p[kk][0] = p[kk][1] = p[kk][2] = p[kk][3] = 0u;
  }
  // Issue this tile's Q K^T, then the pending P V; return with S complete (P V may still run).
  __device__ __forceinline__ void gemm_qk_then_pv(float (&s)[1][kNTiles][4], const QFromSmem& q, const qkv_t* sK,
                                                  float (&o)[1][kDTiles][4]) {
    gemm_qk_issue(s, q, sK);
    gemm_pv_issue(o, p, sV);
    wgmma_wait<1>();  // groups complete in order: Q K^T is done
    fence_operands(s[0]);
  }
  // Wait for the pending P V: O holds every tile before the current one.
  __device__ __forceinline__ void finish(float (&o)[1][kDTiles][4]) {
    wgmma_wait<0>();
    fence_operands(p);
    fence_operands(o[0]);
  }
  // The current tile's P V becomes the pending one.
  __device__ __forceinline__ void stage(const float (&s)[1][kNTiles][4], const qkv_t* sV_t) {
    pack_p(p, s);
    sV = sV_t;
  }
  // After the last tile (only when there was one): run the pending P V to completion.
  __device__ __forceinline__ void flush(float (&o)[1][kDTiles][4]) {
    gemm_pv_issue(o, p, sV);
    wgmma_wait<0>();
    fence_operands(p);
    fence_operands(o[0]);
  }
};
