// FP8 P V: the V^T tiles the load warpgroup writes, and why P needs no shuffle on its way from S to the A operand.
//
// FP8 wgmma takes B only K-major (no transpose flag), so P V needs V^T: [HEAD_DIM rows][BLOCK_N keys] bytes, keys
// contiguous, each row a BLOCK_N-byte swizzle row (128: 16-byte chunk c of row d at c ^ (d % 8); 64: c ^ ((d/2) % 4));
// 192 keys: three column blocks of 64 keys, each [HEAD_DIM][64] bytes in the 64-byte swizzle (kVtRowBytes).
// The loader copies V as it copies K (cp.async into the K layout, a staging buffer) and transposes it here.
//
// Why the key order inside V^T is permuted. P reaches the second product from the fp32 accumulator of S = Q K^T:
// per warp the m16n8 layout, lane l holding of n8 block j the columns 8 j + 2 (l % 4) + {0, 1} of rows l / 4 and
// l / 4 + 8 (wgmma.cuh). The e4m3 A fragment of m64nNk32 (wgmma.cuh, wgmma_rs_e4m3) wants in register i of lane l the
// columns 16 (i / 2) + 4 (l % 4) + {0..3} of row l / 4 + 8 (i % 2). With c = l % 4, the 32 keys of a k32 step that a
// lane holds are {2c, 2c+1, 8+2c, 9+2c, 16+2c, 17+2c, 24+2c, 25+2c}, the ones its A fragment names are
// {4c..4c+3, 16+4c..16+4c+3}: different sets, so using the accumulator as is would need shuffles across the quad.
// Since the k dimension of P V is a sum over keys, any order of the keys serves if P and V^T agree. So A column
// 16 h + 4 c + e (h = 0, 1; e = 0..3) holds key 16 h + pi(4 c + e), pi(4 c + e) = (2c, 2c + 1, 2c + 8, 2c + 9)[e]:
// register i of lane l packs, from n8 blocks 4 kk + 2 (i / 2) and 4 kk + 2 (i / 2) + 1, the two columns of row half
// i % 2 each (pack_p), and V^T's 16-byte chunk of keys 16 g .. 16 g + 15 holds at byte 4 c + e key 16 g + pi(4 c + e).
//
// The transpose, one warp per unit of 16 keys x 32 head-dim columns, in 16-bit pairs: ldmatrix.trans of four 8x8
// matrices (keys 0-7 / 8-15 x head-dim bytes 0-15 / 16-31 of the unit, as 16-bit pairs) gives lane l, of each matrix,
// keys 2c and 2c + 1 (c = l % 4) at the head-dim pair q = l / 4: bytes (V[2c][2q], V[2c][2q+1], V[2c+1][2q],
// V[2c+1][2q+1]). With A from keys 0-7 and B from keys 8-15 of the same columns, prmt 0x6420 gives (A0, A2, B0, B2) =
// keys (2c, 2c+1, 2c+8, 2c+9) of head-dim column 2q (V^T row 2q, bytes 4c..4c+3 in the pi order), and 0x7531 the same
// of column 2q + 1. That is the plain (not transposed) mma fragment of an 8x8 16-bit matrix whose row q is V^T row
// 2q (or 2q + 1): stmatrix writes the four (even/odd rows x two 16-column halves) with each row address pointing at
// its V^T row's chunk g. Per warp and unit: one ldmatrix.x4.trans, four prmt, one stmatrix.x4 (512 bytes). The
// ldmatrix rows (8 consecutive keys, one chunk column) hit 8 distinct chunk positions. Stored as above, a matrix's
// rows (head-dim rows 0, 2, .., 14) repeat d % 8 twice, a 2-way bank conflict. (Pairing the rows without it, the
// lanes of quads q >= 4 swapping their even and odd values, halved the store wavefronts but lost 1-3% at hd256 in
// back-to-back replays on the H100 and the H200: removed, NOTES.md "FP8 v11".)
#pragma once
#include "attention_mainloop_sm90.cuh"
#include "common/ldmatrix.cuh"

static_assert(FP8, "V^T tiles are for the FP8 P V");
// Tuning V_TRANSPOSE_BATCH: the units a warp loads (ldmatrix) before it stores them (stmatrix), 2 (default; 4 spilled
// 8-44 B at the loader's 40 registers) or 4 (the loader then takes 56 registers: attention_sm90.cu).
#ifndef V_TRANSPOSE_BATCH
#define V_TRANSPOSE_BATCH 2
#endif
static_assert(V_TRANSPOSE_BATCH == 2 || V_TRANSPOSE_BATCH == 4, "V_TRANSPOSE_BATCH is 2 or 4");
static_assert(kBlockN % kVtRowBytes == 0, "V^T rows are whole 32-, 64- or 128-byte swizzle rows of keys");
constexpr int kVtTileBytes = kHeadDim * kBlockN;

// Shared address of the chunk of keys 16 g .. 16 g + 15 in V^T row d: column block g / (kVtRowBytes / 16) (a block
// of 64 or 128 keys), chunk g % (kVtRowBytes / 16) of that block's row d.
__device__ __forceinline__ uint32_t vt_chunk(uint32_t tile, int d, int g) {
  constexpr int kChunks = kVtRowBytes / 16;
  const int swizzle = kVtRowBytes == 128 ? d % 8 : kVtRowBytes == 64 ? (d / 2) % 4 : (d / 4) % 2;
  return tile + d * kVtRowBytes + (((g % kChunks) ^ swizzle) * 16) + (g / kChunks) * (kHeadDim * kVtRowBytes);
}

// Tuning VT_ADDRESS_STEP: 1 steps the transpose's shared addresses from one base a column strip (an ldmatrix moves
// 16 key rows, a constant; the V^T chunk of key group g is the base XOR (g << 4)), 0 (default) computes both
// addresses of every unit from its index (about 18 of the ~25 instructions a unit).
#ifndef VT_ADDRESS_STEP
#define VT_ADDRESS_STEP 0
#endif

// One batch of kBatch units: their ldmatrix loads (addresses ld(b)) all issued before the first stmatrix (st(b)).
template <int kBatch, typename Ld, typename St>
__device__ __forceinline__ void transpose_units(Ld&& ld, St&& st) {
  uint32_t r[kBatch][4];
#pragma unroll
  for (int b = 0; b < kBatch; ++b) ldmatrix_x4_trans(r[b], ld(b));
#pragma unroll
  for (int b = 0; b < kBatch; ++b) {
    const uint32_t even_lo = __byte_perm(r[b][0], r[b][1], 0x6420), odd_lo = __byte_perm(r[b][0], r[b][1], 0x7531);
    const uint32_t even_hi = __byte_perm(r[b][2], r[b][3], 0x6420), odd_hi = __byte_perm(r[b][2], r[b][3], 0x7531);
    const uint32_t x[4] = {even_lo, odd_lo, even_hi, odd_hi};
    stmatrix_x4(x, st(b));
  }
}

// V (a [kBlockN keys][kHeadDim] e4m3 tile in the K layout at `v`) -> V^T (at `vt`), by the kThreadsT threads of the
// calling warps (this one is `tid`); the caller orders it after the copies into `v` landed and before wgmma reads `vt`.
// A warp takes kUnitsPerWarp consecutive units (key groups first, then column strips) in batches of kBatch: the
// batch's ldmatrix loads are all issued before its first stmatrix (the "memory" clobbers keep program order, so
// without batching each prmt waited the full shared-memory latency of its own ldmatrix: the loader's top stall at
// hd256, 9% of all samples, NOTES.md).
template <int kThreadsT>
__device__ __forceinline__ void transpose_v_tile(const qkv_t* v, qkv_t* vt, int tid) {
  constexpr int kKeyGroups = kBlockN / 16, kUnits = kKeyGroups * (kHeadDim / 32), kWarpsT = kThreadsT / 32;
  static_assert(kUnits % kWarpsT == 0, "whole units per warp");
  constexpr int kUnitsPerWarp = kUnits / kWarpsT;
  constexpr int kBatch = kUnitsPerWarp % V_TRANSPOSE_BATCH == 0 ? V_TRANSPOSE_BATCH : kUnitsPerWarp % 2 == 0 ? 2 : 1;
  const int warp = tid / 32, lane = tid % 32, m = lane / 8, j = lane % 8;
  const uint32_t v_tile = smem_addr(v), vt_tile = smem_addr(vt);
  const int row_odd = m % 2;  // stmatrix matrix m's row j: V^T row 2 j + row_odd of its 16-row half
  if constexpr (VT_ADDRESS_STEP) {
    // the warp's units: key groups g0 .. g0 + kGroups - 1 of column strips c0 .. c0 + kStrips - 1
    constexpr int kGroups = kUnitsPerWarp < kKeyGroups ? kUnitsPerWarp : kKeyGroups, kStrips = kUnitsPerWarp / kGroups;
    constexpr int kChunks = kVtRowBytes / 16;
    static_assert(kUnitsPerWarp % kGroups == 0 && kGroups % kBatch == 0 && (kGroups == kKeyGroups ||
                  (kKeyGroups % kGroups == 0 && (kGroups & (kGroups - 1)) == 0 && kGroups <= kChunks)),
                  "VT_ADDRESS_STEP: a warp's key groups start at a multiple of a power of two within one V^T chunk row");
    const int g0 = warp * kUnitsPerWarp % kKeyGroups, c0 = warp * kUnitsPerWarp / kKeyGroups;
#pragma unroll
    for (int k = 0; k < kStrips; ++k) {
      // g0 + g = g0 ^ g below kChunks (g0 a multiple of the power of two kGroups): XOR into the swizzled chunk
      const uint32_t ld0 = swizzled_chunk<kBlockN>(v_tile, 16 * g0 + 8 * (m % 2) + j, 2 * (c0 + k) + m / 2);
      const uint32_t st0 = vt_chunk(vt_tile, 32 * (c0 + k) + 16 * (m / 2) + 2 * j + row_odd, g0);
#pragma unroll 1  // batches: more in flight would spill the loader's registers
      for (int i0 = 0; i0 < kGroups; i0 += kBatch) {
        transpose_units<kBatch>([&](int b) { return ld0 + (i0 + b) * 16 * kSwizzleRowBytes; },
                                [&](int b) {  // (column block g / kChunks of 64- and 32-byte V^T rows)
                                  const int g = i0 + b;
                                  return kGroups <= kChunks ? st0 ^ (g << 4)
                                                            : (st0 ^ ((g % kChunks) << 4)) +
                                                                  (g / kChunks) * (kHeadDim * kVtRowBytes);
                                });
      }
    }
  } else {
#pragma unroll 1  // batches: more in flight would spill the loader's registers
    for (int i0 = 0; i0 < kUnitsPerWarp; i0 += kBatch) {
      auto unit = [&](int b) { return warp * kUnitsPerWarp + i0 + b; };
      transpose_units<kBatch>(
          [&](int b) {
            const int g = unit(b) % kKeyGroups, col32 = unit(b) / kKeyGroups;
            return swizzled_chunk<kBlockN>(v_tile, 16 * g + 8 * (m % 2) + j, 2 * col32 + m / 2);
          },
          [&](int b) {
            const int g = unit(b) % kKeyGroups, col32 = unit(b) / kKeyGroups;
            return vt_chunk(vt_tile, 32 * col32 + 16 * (m / 2) + 2 * j + row_odd, g);
          });
    }
  }
}
