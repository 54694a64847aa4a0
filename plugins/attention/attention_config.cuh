// Compile-time specialization of the fused attention kernel (every -D the launch plan sets), the mask type, and the
// tile geometry that follows from them (the element type, DTYPE_BF16, is common/element.cuh's).
#pragma once
#include "common/element.cuh"

#if !defined(HEAD_DIM) || !defined(HEAD_DIM_V) || !defined(SOFTCAP) || !defined(DTYPE_BF16) || !defined(CAUSAL) || !defined(CAUSAL_BOTTOM_RIGHT) || \
    !defined(MASK_KIND) || !defined(HAS_KEY_LENGTHS) || !defined(SCALE_LOG2) || !defined(BLOCK_M) ||  \
    !defined(BLOCK_N) || !defined(NUM_WARPS) || !defined(Q_IN_REGISTERS) || !defined(KV_STAGES) || \
    !defined(RESCALE_THRESHOLD) || !defined(WGMMA) || !defined(MIN_BLOCKS_PER_SM) || \
    !defined(WGMMA_OVERLAP) || !defined(KV_SPLIT) || !defined(WARP_SPECIALIZED) || !defined(PACK_GQA) || !defined(WARP_SPLIT)
#error "attention.cu needs WARP_SPLIT PACK_GQA WARP_SPECIALIZED KV_SPLIT HEAD_DIM HEAD_DIM_V SOFTCAP DTYPE_BF16 CAUSAL CAUSAL_BOTTOM_RIGHT MASK_KIND HAS_KEY_LENGTHS SCALE_LOG2 BLOCK_M BLOCK_N NUM_WARPS Q_IN_REGISTERS KV_STAGES RESCALE_THRESHOLD WGMMA MIN_BLOCKS_PER_SM WGMMA_OVERLAP (plan_attention sets them)"
#endif

// FP8 (E4M3 Q/K/V, the warp-specialized kernel only): set by the plan in FP8 specializations with P_SCALE_LOG2
// (log2 of 1 / p_scale), OUTPUT_FACTOR (v_scale, over output_scale for an e4m3 output) and OUTPUT_E4M3; the
// float16/bfloat16 specializations leave it out. DTYPE_BF16 then names the output's (and an additive mask's) type.
#ifndef FP8
#define FP8 0
#endif
#if FP8 && (!defined(P_SCALE_LOG2) || !defined(OUTPUT_FACTOR) || !defined(OUTPUT_E4M3) || !defined(EXP2_FMA_EVERY))
#error "FP8=1 needs P_SCALE_LOG2 OUTPUT_FACTOR OUTPUT_E4M3 EXP2_FMA_EVERY (plan_attention sets them)"
#endif

#define MASK_NONE 0
#define MASK_ADDITIVE 1
#define MASK_BOOL 2

#if MASK_KIND == MASK_BOOL
typedef unsigned char mask_t;  // numpy/torch bool: one byte, nonzero = attend
#else
typedef elem_t mask_t;         // additive mask: the dtype of Q
#endif

// The kernel's parameter list in TensorRT's AOT plugin order (inputs, int32 scalars, output), one text for every
// attention kernel: plan_attention's scalar list mirrors it. The optional inputs and their scalars exist only in the
// specializations that take them.
#if MASK_KIND != MASK_NONE
#define ATTENTION_MASK_PARAM const mask_t* __restrict__ mask,
#define ATTENTION_MASK_STRIDE_PARAMS int mask_stride_b, int mask_stride_h, int mask_stride_q, int mask_stride_k,
#else
#define ATTENTION_MASK_PARAM
#define ATTENTION_MASK_STRIDE_PARAMS
#endif
#if HAS_KEY_LENGTHS
#define ATTENTION_KEY_LENGTHS_PARAM const int* __restrict__ key_lengths,
#define ATTENTION_KEY_LENGTHS key_lengths
#else
#define ATTENTION_KEY_LENGTHS_PARAM
#define ATTENTION_KEY_LENGTHS nullptr
#endif
// Q/K/V as stored (e4m3 bytes in FP8 specializations) and O as written (e4m3 bytes with OUTPUT_E4M3).
#if FP8
typedef uint8_t qkv_t;
#else
typedef elem_t qkv_t;
#endif
#if FP8 && OUTPUT_E4M3
typedef uint8_t out_t;
#else
typedef elem_t out_t;
#endif
#define ATTENTION_KERNEL_PARAMS                                                                                      \
  const qkv_t* __restrict__ Q, const qkv_t* __restrict__ K, const qkv_t* __restrict__ V,                            \
  ATTENTION_MASK_PARAM ATTENTION_KEY_LENGTHS_PARAM                                                                   \
  int batch, int heads_q, int heads_kv, int len_q, int len_kv,                                                       \
  int q_stride_b, int q_stride_h, int q_stride_s, int kv_stride_b, int kv_stride_h, int kv_stride_s,                 \
  int v_stride_b, int v_stride_h, int v_stride_s, int o_stride_b, int o_stride_h, int o_stride_s,                    \
  ATTENTION_MASK_STRIDE_PARAMS                                                                                       \
  out_t* __restrict__ O

constexpr int kHeadDim = HEAD_DIM;       // D_qk: the head dim of Q and K as stored
constexpr int kHeadDimV = HEAD_DIM_V;    // D_v: the head dim of V and the output as stored
// Padded to the MMA granularity (k16 steps of Q K^T, n16 pairs of P V) in shared memory and registers only: the
// padding columns are zero-filled there, never read from or written to memory.
constexpr int kHeadDimQKPad = (kHeadDim + 15) / 16 * 16;
constexpr int kHeadDimVPad = (kHeadDimV + 15) / 16 * 16;
constexpr int kBlockM = BLOCK_M;          // query rows per thread block
constexpr int kBlockN = BLOCK_N;          // keys per K/V tile
constexpr int kWarps = NUM_WARPS;
constexpr int kThreads = kWarps * 32;
// __launch_bounds__ minimum: 2 caps registers at 65536 / (2 * kThreads) so two blocks share an SM (one block's
// softmax then overlaps the other's matrix products)
constexpr int kMinBlocksPerSm = MIN_BLOCKS_PER_SM;
// Decode (WARP_SPLIT > 1): the warps of a block also split its keys, in WARP_SPLIT groups of kRowWarps warps, each
// group with its own K/V stages and key range, combined in shared memory like the cluster's splits
// (attention_split_kv.cuh). 1: every warp reads every K/V tile.
constexpr int kWarpSplit = WARP_SPLIT;
constexpr int kRowWarps = kWarps / kWarpSplit;  // warps splitting the rows of a block (one key group)
constexpr int kGroupThreads = kRowWarps * 32;
constexpr int kWarpRows = kBlockM / kRowWarps;  // query rows owned by one warp
constexpr int kMAtoms = kWarpRows / 16;       // m16 MMA tiles per warp
constexpr int kNTiles = kBlockN / 8;          // n8 MMA tiles of S per row block
constexpr int kDTiles = kHeadDimVPad / 8;     // n8 MMA tiles of O
// smem row pitches in elements of the mma.sync tiles (Q, K; V and the output staging): 16 bytes of padding keep
// ldmatrix conflict-free
constexpr int kRowPitch = kHeadDimQKPad + 8;
constexpr int kRowPitchV = kHeadDimVPad + 8;
constexpr int kChunksPerRow = kHeadDim * sizeof(qkv_t) / 16;  // 16-byte chunks per row of Q/K (wgmma tile loads)
constexpr int kKvSplit = KV_SPLIT;            // CTAs of a cluster sharing one query block's keys (decode)
// GQA packing (decode): the query heads of one K/V head share a tile, row r = (query r / kPackGqa, head in the group
// r % kPackGqa), so K/V are read once per K/V head (grid y = K/V heads). 1: a tile holds one head's queries.
constexpr int kPackGqa = PACK_GQA;
constexpr int kStages = KV_STAGES;            // K/V tile buffers (1-3; the single-role kernel's ring up to 5)
// cp.async groups the single-role kernel's loop top leaves in flight: the ring's tiles past the next one
constexpr int kRingInFlight = kStages >= 3 ? kStages - 2 : 0;
constexpr float kScaleLog2 = SCALE_LOG2;      // scale * log2(e): softmax runs on exp2
constexpr float kRescaleThreshold = RESCALE_THRESHOLD;  // log2 units; 0 = rescale whenever the max grows
constexpr float kLog2e = 1.4426950408889634f;
// Logit soft-capping (Gemma-2): s -> cap * tanh(scale * s / cap), before the mask; 0 = none.
constexpr float kSoftcap = SOFTCAP;
constexpr bool kHasSoftcap = kSoftcap > 0.f;
// Additive masks, a softcap (and a negative scale, which flips the row max) need scores scaled before the row max.
constexpr bool kPrescale = MASK_KIND == MASK_ADDITIVE || SCALE_LOG2 < 0 || kHasSoftcap;
constexpr float kSoftmaxScale = kPrescale ? 1.0f : kScaleLog2;

static_assert(kHeadDim >= 1 && kHeadDimV >= 1 && kHeadDimQKPad <= 512 && kHeadDimVPad <= 512, "head dims 1..512");
static_assert(kSoftcap >= 0.f, "SOFTCAP must be >= 0 (0: none)");
static_assert(kWarpRows % 16 == 0 && kMAtoms >= 1, "BLOCK_M must give each warp a multiple of 16 rows");
static_assert(kBlockN % 16 == 0, "BLOCK_N must be a multiple of 16");
static_assert(kRescaleThreshold >= 0.f && kRescaleThreshold <= 14.f, "p <= 2^threshold must stay well inside fp16");
static_assert(kStages >= 1 && kStages <= (WARP_SPECIALIZED ? 3 : 5),
              "KV_STAGES must be 1-3 (the single-role kernel's ring of a key group: up to 5)");
static_assert(kKvSplit >= 1 && kKvSplit <= 8 && kBlockM % kKvSplit == 0, "KV_SPLIT: 1..8 CTAs, dividing BLOCK_M");
static_assert(kWarpSplit >= 1 && kWarps % kWarpSplit == 0 && (kWarpSplit == 1 || !WARP_SPECIALIZED),
              "WARP_SPLIT (key groups of warps) divides NUM_WARPS, on the mma.sync or single-role wgmma mainloop");
static_assert(kPackGqa >= 1 && (kPackGqa == 1 || !WARP_SPECIALIZED),
              "PACK_GQA (query heads per tile) is an option of the mma.sync and single-role wgmma mainloops");

// Element offset of tile row r (absolute, packed) in Q or O: query r / kPackGqa, head r % kPackGqa of the tile's
// first head (with kPackGqa = 1 simply r * stride_s).
__device__ __forceinline__ int64_t packed_row_offset(int r, int64_t stride_s, int64_t stride_h) {
  return static_cast<int64_t>(r / kPackGqa) * stride_s + static_cast<int64_t>(r % kPackGqa) * stride_h;
}

