// The tap-row gather of the implicit GEMM (TAP_ROWS = 1): the loader for stems, whose few input channels (C/G = TAP_CG,
// not a multiple of 8) rule out 16-byte chunks. Reduction tile r is filter row r: its first KW * TAP_CG elements are the
// row's taps (s, c), the rest of the BLOCK_K = 32 are zeros. For a dense NHWC X (pixel stride TAP_CG) one output
// pixel's filter row is then one contiguous run of KW * TAP_CG elements (21 for a 7x7 filter over 3 channels).
// - A: a thread owns one A row; a run whose taps are all inside the image is read as 32-bit words (11 loads for 21
//   elements, where the element gather issued one 2-byte load, a bounds check, an index step and a pack per element);
//   runs at the image's edges, or in a channel-padded X (TensorRT's HWC8), element by element with a bounds check.
// - B: a thread owns a segment of BLOCK_K / (threads / BLOCK_N) elements of one W row's run, read as words the same
//   way (load_run).
// The padding costs tensor-core work (a 7x7 stem: 7 tiles of 32 for 147 elements, where 5 would do), which these
// layers have to spare: the element gather was bound by its instruction issue (ncu, NOTES.md). Float16/bfloat16 only.
#pragma once
#include "fast_divmod.cuh"
#include "implicit_gemm_config.cuh"

static_assert(!FP8 && GROUPS == 1 && DIL_W == 1 && BLOCK_K == 32 && KW * TAP_CG <= BLOCK_K,
              "TAP_ROWS: float16/bfloat16, one group, undilated rows of KW * TAP_CG <= 32 elements, BLOCK_K 32");

// kLen consecutive elements from element e of `bits` (inside a run the caller may read, and element e - 1 readable
// where e is odd) as packed pairs into out[0 .. (kLen + 1) / 2), the high half of an odd last pair zero: 32-bit words
// from the even element at or below e, realigned by a funnel shift where e is odd; the last access a 2-byte load
// where a word would pass the run's end.
template <int kLen>
__device__ __forceinline__ void load_run(unsigned* out, const unsigned short* bits, int e) {
  constexpr int kFull = kLen / 2;
  const bool odd = e & 1;
  const int base = e - int(odd);
  const unsigned* words = reinterpret_cast<const unsigned*>(bits + base);
  unsigned wd[kFull + 2];
#pragma unroll
  for (int i = 0; i < kFull; ++i) wd[i] = words[i];
  // elements needed from base: odd + kLen, i.e. kFull whole words and then one more word or half as that count asks
  const bool tail_word = (kLen % 2 == 1) && odd, tail_half = (kLen % 2 == 1) ? !odd : odd;
  wd[kFull] = tail_word ? words[kFull] : tail_half ? unsigned(bits[base + 2 * kFull]) : 0u;
  wd[kFull + 1] = 0;
#pragma unroll
  for (int i = 0; i < (kLen + 1) / 2; ++i) out[i] = odd ? __funnelshift_r(wd[i], wd[i + 1], 16) : wd[i];
}

struct TileLoader {
  static constexpr bool kAsync = false;  // tiles land when stored: no cp.async groups
  static constexpr int kRun = KW * TAP_CG;            // elements of one filter row (the run)
  static constexpr int kWords = BLOCK_K / 2;          // an A row of a tile as packed element pairs
  static constexpr int kBSegs = kGroupThreads / BLOCK_N, kB = BLOCK_K / kBSegs;  // W: a run of kB per thread
  static_assert(kGroupThreads == BLOCK_M && kGroupThreads % BLOCK_N == 0 && kB % 8 == 0 && kB * kBSegs == BLOCK_K,
                "TAP_ROWS: a thread per A row, W rows in runs of whole 16-byte chunks");
  RowOrigin a;
  int a_row, b_row, b_seg, b_offset;  // b_offset: this thread's first W element of filter row 0
  bool b_ok;                          // its W row exists (< K/G)
  unsigned a_words[kWords];
  unsigned b_words[kB / 2];

  __device__ __forceinline__ TileLoader(int tid, int m0, int n0, int g, int M, int Kg, int Kgemm, int H, int W,
                                        int x_stride, int Cg, int pad_h, int pad_w, const FastDivmod& pq_div,
                                        const FastDivmod& q_div)
      : a(m0 + tid, M, pq_div, q_div, H, W, x_stride, pad_h, pad_w, g * Cg), a_row(tid), b_row(tid % BLOCK_N),
        b_seg(tid / BLOCK_N) {
    b_ok = n0 + b_row < Kg;
    b_offset = (n0 + b_row) * Kgemm + b_seg * kB;
  }

  // Load filter row r = k0 / BLOCK_K of A and W into registers (stored into the stage by land()).
  __device__ __forceinline__ void fetch(unsigned char* /*stage*/, int k0, const elem_t* x, const op_t* w, int H,
                                        int W, int x_stride, int /*Cg*/, int /*Kgemm*/, const FastDivmod&) {
    const int r = k0 / BLOCK_K;
    const bool row_ok = unsigned(a.h0 + r * DIL_H) < unsigned(H);
    const int e0 = a.offset + r * DIL_H * W * x_stride;  // element (h, w0, c = 0) of this row's run
    const unsigned short* x_bits = reinterpret_cast<const unsigned short*>(x);
#pragma unroll
    for (int i = 0; i < kWords; ++i) a_words[i] = 0;
    if (row_ok && x_stride == TAP_CG && a.w0 >= 0 && a.w0 + KW <= W) {
      load_run<kRun>(a_words, x_bits, e0);
    } else {
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        const int s = j / TAP_CG, c = j % TAP_CG;
        const bool ok = row_ok && unsigned(a.w0 + s) < unsigned(W);
        const unsigned v = ok ? x_bits[e0 + s * x_stride + c] : 0u;
        a_words[j / 2] |= v << (16 * (j % 2));
      }
    }
    // W: this thread's segment of the row's run, of a length known per segment at compile time
#pragma unroll
    for (int i = 0; i < kB / 2; ++i) b_words[i] = 0;
    if (b_ok) fetch_w_segment<0>(reinterpret_cast<const unsigned short*>(w), b_offset + r * kRun);
  }

  // Store the fetched tile into its stage (the swizzled layout the MMAs read).
  __device__ __forceinline__ void land(unsigned char* stage) const {
#pragma unroll
    for (int j = 0; j < kWords / 4; ++j)
      *reinterpret_cast<uint4*>(stage + smem_offset<kChunks>(a_row, j * 16)) =
          make_uint4(a_words[4 * j], a_words[4 * j + 1], a_words[4 * j + 2], a_words[4 * j + 3]);
#pragma unroll
    for (int j = 0; j < kB / 8; ++j)
      *reinterpret_cast<uint4*>(stage + kAStageBytes + smem_offset<kChunks>(b_row, (b_seg * kB + j * 8) * 2)) =
          make_uint4(b_words[4 * j], b_words[4 * j + 1], b_words[4 * j + 2], b_words[4 * j + 3]);
  }

 private:
  // Segment kSeg of a W row's run (positions kSeg * kB .. of the filter row, as far as the run goes) where it is this
  // thread's (b_seg, uniform over a warp); `e`: the segment's first element.
  template <int kSeg>
  __device__ __forceinline__ void fetch_w_segment(const unsigned short* w_bits, int e) {
    if constexpr (kSeg < kBSegs) {
      constexpr int kLen = kRun - kSeg * kB < kB ? kRun - kSeg * kB : kB;
      if (b_seg != kSeg) {
        fetch_w_segment<kSeg + 1>(w_bits, e);
      } else if constexpr (kLen > 0) {
        load_run<kLen>(b_words, w_bits, e);
      }
    }
  }
};
