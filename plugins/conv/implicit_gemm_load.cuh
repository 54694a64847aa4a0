// Global -> shared memory tile loads of the implicit GEMM: a TileLoader fetch()es a reduction tile (cp.async into its
// stage, or the element gather into registers) and land()s it (the gather's store into the stage, after the tile's
// MMAs; nothing for cp.async). The lowered input matrix exists only tile by tile in
// shared memory: each thread precomputes, once, the input offset and the top-left input coordinate of the output
// pixels it loads for, and per reduction tile turns kg into (r, s, c) with one fast division by Cg (fast_divmod.cuh).
//
// IN_VEC = 8 (Cg % 8 == 0) moves 16-byte chunks of 8 channels with cp.async (zero-filled outside the image);
// IN_VEC = 1 (any Cg, e.g. the 3-channel stem) gathers elements into registers one tile ahead and stores them after
// the tile's MMAs; TAP_ROWS = 1 (a stem: KW * C/G <= 32) gathers one filter row per reduction tile instead
// (implicit_gemm_load_tap_rows.cuh). TAPS_INNER = 1 (C/G % BLOCK_K == 0): reduction tiles walk every filter tap of
// one BLOCK_K channel chunk before the next chunk, and A is loaded through L1 (cp.async.ca): consecutive tiles read
// overlapping input windows, so most of a 3x3 layer's A traffic hits L1 instead of L2.
#pragma once
#include "common/cp_async.cuh"
#include "common/smem.cuh"
#include "common/st_async.cuh"
#include "fast_divmod.cuh"
#include "implicit_gemm_config.cuh"
#include "implicit_gemm_quantize.cuh"

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
// x_stride is X's pixel stride: C, or C padded to 8 / 16 when TensorRT gives X as HWC8 / HWC16.
// Rows past M get an h0 no filter tap can bring inside the image.
struct RowOrigin {
  int offset, h0, w0;
  __device__ __forceinline__ RowOrigin(int m, int M, const FastDivmod& pq_div, const FastDivmod& q_div, int H, int W,
                                       int x_stride, int pad_h, int pad_w, int channel0) {
    int pq, q;
    const int n = pq_div.divmod(m, &pq);
    const int p = q_div.divmod(pq, &q);
    const int h = p * STRIDE_H - pad_h;
    w0 = q * STRIDE_W - pad_w;
    offset = ((n * H + h) * W + w0) * x_stride + channel0;
    h0 = m < M ? h : -(1 << 28);
  }
};

#if IN_VEC == 8
// Which filter taps of one A row read inside the image. Filters of <= 32 taps: a bit per tap r * KW + s, set once from
// the row's window, so that a tile's test per row is one AND with the tile's tap bit (probe) instead of two adds and
// two compares of the window's origin (the loader's per-tile path sets the pace of short grids: NOTES, session 9).
// Larger filters keep the origin and compare per tile. Rows past M read no tap (RowOrigin's h0).
template <bool kBits = (KH * KW <= 32)>
struct RowTaps {
  unsigned bits = 0;
  RowTaps() = default;
  __device__ __forceinline__ RowTaps(const RowOrigin& o, int H, int W) {
    unsigned columns = 0;  // the filter columns s inside the image, as bits s
#pragma unroll
    for (int s = 0; s < KW; ++s) columns |= unsigned(unsigned(o.w0 + s * DIL_W) < unsigned(W)) << s;
#pragma unroll
    for (int r = 0; r < KH; ++r) bits |= (unsigned(o.h0 + r * DIL_H) < unsigned(H) ? columns : 0u) << (r * KW);
  }
  // A tile's probe: its tap's bit, none where the tile's reduction index is past the end.
  static __device__ __forceinline__ unsigned probe(int rs, int /*dh*/, int /*dw*/, bool k_ok, int /*H*/, int /*W*/) {
    return k_ok ? 1u << rs : 0u;
  }
  __device__ __forceinline__ bool inside(unsigned tap) const { return bits & tap; }
};
template <>
struct RowTaps<false> {
  int h0, w0;
  struct Probe { int dh, dw, H, W; bool k_ok; };
  RowTaps() = default;
  __device__ __forceinline__ RowTaps(const RowOrigin& o, int /*H*/, int /*W*/) : h0(o.h0), w0(o.w0) {}
  static __device__ __forceinline__ Probe probe(int /*rs*/, int dh, int dw, bool k_ok, int H, int W) {
    return {dh, dw, H, W, k_ok};
  }
  __device__ __forceinline__ bool inside(const Probe& t) const {
    return t.k_ok && unsigned(h0 + t.dh) < unsigned(t.H) && unsigned(w0 + t.dw) < unsigned(t.W);
  }
};

// cp.async loader run by kLoaderThreads threads (a reduction group, or the warp-specialized kernel's load
// warpgroup). A: thread owns one 16-byte chunk column (8 elem_t) and kRows rows; B: one 16-byte chunk column
// (8 elem_t or 16 e4m3, so FP8 needs a reduction length that is a multiple of 16) and kBRows rows.
// Both land in the stage in the A tile's and the MMA operand's swizzled layouts. kWParts = 2 (SHARE_W): the loader
// fetches only part w_part of the W rows (BLOCK_N / 2 rows); the other CTA of the cluster fetches the other part and
// both push theirs to each other (push_w).
template <int kLoaderThreads, int kWParts = 1>
struct AsyncTileLoader {
  static constexpr bool kAsync = true;  // tiles land by cp.async groups: commit after each fetch
  static constexpr int kAChunks = BLOCK_K * int(sizeof(x_t)) / 16;
  static constexpr int kBCols = kChunks;
  static constexpr int kRows = BLOCK_M * kAChunks / kLoaderThreads;
  static constexpr int kWPartRows = BLOCK_N / kWParts;  // W rows this loader fetches
  static constexpr int kBRows = kWPartRows * kBCols / kLoaderThreads;
  static constexpr int kWPartBytes = kWPartRows * kRowBytes;
  static_assert(kRows >= 1 && kBRows >= 1 && kLoaderThreads % kBCols == 0, "tile too small for the thread count");
  int a_offset[kRows];
  RowTaps<> a_taps[kRows];
  int b_offset[kBRows];
  unsigned b_valid;
  int chunk, row0, b_col, b_row0;

  __device__ __forceinline__ AsyncTileLoader(int tid, int m0, int n0, int g, int M, int Kg, int Kgemm, int H, int W,
                                             int x_stride, int Cg, int pad_h, int pad_w, const FastDivmod& pq_div,
                                             const FastDivmod& q_div, int w_part = 0) {
    chunk = tid % kAChunks;
    row0 = tid / kAChunks;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const RowOrigin o(m0 + row0 + i * (kLoaderThreads / kAChunks), M, pq_div, q_div, H, W, x_stride, pad_h, pad_w,
                        g * Cg);
      a_offset[i] = o.offset;
      a_taps[i] = RowTaps<>(o, H, W);
    }
    b_col = tid % kBCols;
    b_row0 = w_part * kWPartRows + tid / kBCols;
    b_valid = 0;
#pragma unroll
    for (int j = 0; j < kBRows; ++j) {
      const int kout = n0 + b_row0 + j * (kLoaderThreads / kBCols);
      b_offset[j] = (g * Kg + kout) * Kgemm;
      b_valid |= unsigned(kout < Kg) << j;
    }
  }

  // Start the copies of the reduction tile at k0 into `stage`. A copy that is not made (src-size 0) reads from the
  // tensor's start: the offset, not the pointer, is selected, as an unsigned 32-bit value (one SEL and a zero-extended
  // address add per copy; selecting between 64-bit pointers cost twice the instructions in this per-tile path, which
  // the loader's time per tile follows: NOTES, session 9).
  __device__ __forceinline__ void fetch(unsigned char* stage, int k0, const x_t* x, const op_t* w, int H, int W,
                                        int x_stride, int /*Cg*/, int Kgemm, const FastDivmod& cg_div) {
    const int kg = k0 + chunk * (16 / int(sizeof(x_t)));
    int c = kg, rs = 0;  // a 1x1 filter's reduction index is the channel (kg < Kgemm = C/G wherever it is copied)
    if constexpr (KH * KW > 1) rs = cg_div.divmod(kg, &c);
    const int r = rs / KW, s = rs - (rs / KW) * KW;
    const int dh = r * DIL_H, dw = s * DIL_W;
    const int delta = (dh * W + dw) * x_stride + c;
    const auto tap = RowTaps<>::probe(rs, dh, dw, kg < Kgemm, H, W);
    const unsigned a_base = smem_addr(stage), b_base = smem_addr(stage + kAStageBytes);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = row0 + i * (kLoaderThreads / kAChunks);
      const bool ok = a_taps[i].inside(tap);
      cp_async_16<TAPS_INNER>(a_base + smem_offset<kAChunks>(row, chunk * 16),
                              x + unsigned(ok ? a_offset[i] + delta : 0), ok ? 16 : 0);
    }
    const int kb = k0 + b_col * (16 / int(sizeof(op_t)));
#pragma unroll
    for (int j = 0; j < kBRows; ++j) {
      const int row = b_row0 + j * (kLoaderThreads / kBCols);
      const bool ok = kb < Kgemm && ((b_valid >> j) & 1);
      cp_async_16(b_base + smem_offset<kChunks>(row, b_col * 16), w + unsigned(ok ? b_offset[j] + kb : 0),
                  ok ? 16 : 0);
    }
  }
  // The copies land in shared memory by themselves (cp_async_wait).
  __device__ __forceinline__ void land(unsigned char* /*stage*/) const {}

  // SHARE_W: this thread's W chunks of `stage` (landed: the caller waited for its copies) into the same place of the
  // other CTA's stage (`remote_stage`, a shared::cluster address), counted on that CTA's full barrier `remote_full`.
  __device__ __forceinline__ void push_w(const unsigned char* stage, uint32_t remote_stage, uint32_t remote_full) const {
#pragma unroll
    for (int j = 0; j < kBRows; ++j) {
      const int offset = kAStageBytes + smem_offset<kChunks>(b_row0 + j * (kLoaderThreads / kBCols), b_col * 16);
      st_async_16(remote_stage + offset, *reinterpret_cast<const uint4*>(stage + offset), remote_full);
    }
  }
};
typedef AsyncTileLoader<kGroupThreads> TileLoader;
#elif TAP_ROWS
#include "implicit_gemm_load_tap_rows.cuh"
#else
// Element gather for channel counts that are not multiples of 8: thread owns one A row (and one B row) and a run
// of kA (kB) consecutive reduction indices, walked incrementally through (r, s, c).
struct TileLoader {
  static constexpr bool kAsync = false;  // tiles land when stored: no cp.async groups
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
                                        int x_stride, int Cg, int pad_h, int pad_w, const FastDivmod& pq_div,
                                        const FastDivmod& q_div)
      : a(m0 + tid % BLOCK_M, M, pq_div, q_div, H, W, x_stride, pad_h, pad_w, g * Cg) {
    a_row = tid % BLOCK_M; a_seg = tid / BLOCK_M;
    b_row = tid % BLOCK_N; b_seg = tid / BLOCK_N;
    b_ok = n0 + b_row < Kg;
    b_offset = (g * Kg + n0 + b_row) * Kgemm;
  }

  // Load the reduction tile at k0 into registers (stored into its stage by land()).
  __device__ __forceinline__ void fetch(unsigned char* /*stage*/, int k0, const elem_t* x, const op_t* w, int H,
                                        int W, int x_stride, int Cg, int Kgemm, const FastDivmod& cg_div) {
    const elem_t zero = from_float(0.f);
    int kg = k0 + a_seg * kA, c;
    const int rs = cg_div.divmod(kg, &c);
    int r = rs / KW, s = rs - (rs / KW) * KW;
#pragma unroll
    for (int j = 0; j < kA; ++j) {
      const int h = a.h0 + r * DIL_H, wi = a.w0 + s * DIL_W;
      const bool ok = kg + j < Kgemm && unsigned(h) < unsigned(H) && unsigned(wi) < unsigned(W);
      a_vals[j] = ok ? x[a.offset + (r * DIL_H * W + s * DIL_W) * x_stride + c] : zero;
      if (++c == Cg) { c = 0; if (++s == KW) { s = 0; ++r; } }
    }
    const int kb = k0 + b_seg * kB;
#pragma unroll
    for (int j = 0; j < kB; ++j) b_vals[j] = b_ok && kb + j < Kgemm ? w[b_offset + kb + j] : op_t(0);
  }

  __device__ __forceinline__ void land(unsigned char* stage) const {
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
