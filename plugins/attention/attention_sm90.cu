// trt_fusedattn::FusedAttention forward, warp-specialized for Hopper (sm_90a; FlashAttention-3's design within the
// AOT plugin ABI). One thread block computes kBlockM = 128 (or 192) query rows of one (batch, head) with three (four)
// warpgroups:
// - warpgroup 0 loads (attention_load_sm90.cuh): Q once, then K/V tiles into kStages swizzled stages, handing each
//   over through mbarriers (attention_pipeline_sm90.cuh); it gives most of its registers away (setmaxnreg);
// - warpgroups 1 and 2 (and 3) compute (attention_mma_warpgroups_sm90.cuh), 64 query rows each, with wgmma,
//   intra-warpgroup overlap of the softmax with P V, and ping-pong turns between them;
// then each normalizes and stores its rows of O straight from registers (attention_epilogue.cuh). Masking, online softmax, tile scheduling and the
// argument list are those of attention.cu, so the plan only switches the source.
// FP8 (E4M3 Q/K/V): the same kernel with k32 e4m3 wgmmas, P rounded to e4m3 in registers and V transposed by the
// loader (the FP8 wgmma B operand is K-major only); scales are compile-time (attention_softmax.cuh, epilogue).
#include "attention_tile_scheduler.cuh"
#include "attention_persistent_scheduler_sm90.cuh"
#include "attention_load_sm90.cuh"
#include "attention_mma_warpgroups_sm90.cuh"
#include "attention_epilogue.cuh"
#include "common/warpgroup.cuh"

static_assert(!kPersistent || !FP8, "the persistent grid (PERSISTENT_CTAS) serves the 16-bit kernel; FP8 runs one CTA a query tile");
static_assert((kWarps == 8 || kWarps == 12) && kBlockM == 16 * kWarps,
              "the warp-specialized kernel has two or three MMA warpgroups of 64 rows");
constexpr int kBlockThreads = kLoadThreads + kMmaThreads;
// Two MMA warpgroups: 24 * 128 + 240 * 256 = 64512 of the SM's 65536 registers; the FP8 loader, which also
// transposes V, keeps 40 (40 * 128 + 232 * 256 = 64512). Three (FlashAttention-3's hd64 shape): 32 * 128 + 160 * 384
// = 65536; FP8 40 * 128 + 152 * 384 = 63488. FP8 on three warpgroups with PV_OVERLAP=0 and S + O of 128 registers
// (hd128 on 128-key tiles: they and the softmax's state spill at 152) takes the 16-bit split, its loader fitting 32.
// FP8 V_TRANSPOSE_BATCH=4 (two MMA warpgroups with PV_OVERLAP=0): the loader keeps 56 for four transpose units in
// flight, the MMA warpgroups 224 (56 * 128 + 224 * 256 = 64512; hd256 x 128 keys fits).
constexpr bool kFp8LoaderWide = FP8 && (kMmaWarpgroups == 2 || kPVOverlap || kBlockN / 2 + kHeadDimV / 2 < 128);
#if FP8 && V_TRANSPOSE_BATCH == 4
constexpr bool kFp8LoaderDeep = true;
static_assert(kMmaWarpgroups == 2 && !kPVOverlap, "V_TRANSPOSE_BATCH=4 takes registers of two serial MMA warpgroups");
#else
constexpr bool kFp8LoaderDeep = false;
#endif
constexpr int kLoadRegisters = kFp8LoaderDeep ? 56 : kFp8LoaderWide ? 40 : kMmaWarpgroups == 2 ? 24 : 32;
constexpr int kMmaRegisters = kMmaWarpgroups == 2 ? (kFp8LoaderDeep ? 224 : FP8 ? 232 : 240)
                                                  : (kFp8LoaderWide ? 152 : 160);

// One query tile (of the one-tile kernel, or one of a persistent CTA's): where its rows and its (batch, head)'s K/V
// are, and how many K/V tiles it visits.
struct QueryTile {
  AttentionTile tile;
  int m0, kv_end, n_tiles;
  int64_t q_off, k_off, v_off;

  __device__ __forceinline__ QueryTile(const AttentionTile& t, int heads_q, int heads_kv, int len_q, int len_kv,
                                       int q_stride_b, int q_stride_h, int kv_stride_b, int kv_stride_h,
                                       int v_stride_b, int v_stride_h, const int* key_lengths)
      : tile(t), m0(t.m_block * kBlockM), kv_end(attended_key_end(t, t.m_block * kBlockM, len_q, len_kv, key_lengths)) {
    const int head_kv = t.head / (heads_q / heads_kv);
    n_tiles = kv_end > 0 ? (kv_end + kBlockN - 1) / kBlockN : 0;
    q_off = static_cast<int64_t>(t.batch) * q_stride_b + static_cast<int64_t>(t.head) * q_stride_h;
    k_off = static_cast<int64_t>(t.batch) * kv_stride_b + static_cast<int64_t>(head_kv) * kv_stride_h;
    v_off = static_cast<int64_t>(t.batch) * v_stride_b + static_cast<int64_t>(head_kv) * v_stride_h;
  }
};

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1) fused_attention(ATTENTION_KERNEL_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem[];
  // the plan adds kSmemAlign - 16 bytes of slack for this round-up
  qkv_t* sQ = reinterpret_cast<qkv_t*>(smem + ((kSmemAlign - smem_addr(smem) % kSmemAlign) % kSmemAlign));
  qkv_t* sK = sQ + kQStages * kQTileElems;
  qkv_t* sV = sK + kStages * kKTileElems;  // V tiles (FP8: V^T tiles, then the loader's V staging tiles)
  const KVPipeline pipe{smem_addr(sV + (kStages + kVStagingTiles) * kVTileElems)};

#if PERSISTENT_CTAS > 0  // (the FP8 loader has no tile chain: preprocessed out there)
  {
    // The CTA's query tiles in PersistentTileOrder; the order is rebuilt from the arguments every tile (the loader's
    // registers would spill it). K/V steps and Q rounds are counted on across the tiles.
    auto query_tile = [&](int item, int b) {
      return QueryTile(PersistentTileOrder(batch, heads_q, len_q).tile(item, b, heads_q), heads_q, heads_kv, len_q,
                       len_kv, q_stride_b, q_stride_h, kv_stride_b, kv_stride_h, v_stride_b, v_stride_h,
                       ATTENTION_KEY_LENGTHS);
    };
    if (threadIdx.x == 0) pipe.init();
    __syncthreads();
    if (threadIdx.x < kLoadThreads) {
      warpgroup_registers_decrease<kLoadRegisters>();
      int step0 = 0, round = 0;
      for (int item = blockIdx.x; item < PersistentTileOrder(batch, heads_q, len_q).items; item += gridDim.x) {
        for (int b = 0; b < PersistentTileOrder(batch, heads_q, len_q).blocks(item); ++b, ++round) {
          const QueryTile w = query_tile(item, b);
          pipe.acquire_q(round);
          // the strides kept once a tile: otherwise ptxas rebuilt each copy's row step from the stride, reloaded every
          // K/V step (LDC, then IMAD.WIDE a row), where the one-tile loader adds a step held in uniform registers
          load_q_and_kv(pipe, sQ + (round % kQStages) * kQTileElems, sK, sV, Q + w.q_off, q_stride_s, w.m0, len_q,
                        K + w.k_off, warp_uniform_kept(kv_stride_s), V + w.v_off, warp_uniform_kept(v_stride_s),
                        len_kv, w.n_tiles, step0, round);
          step0 += w.n_tiles;
        }
      }
    } else {
      warpgroup_registers_increase<kMmaRegisters>();
      const int warp = threadIdx.x / 32 - kLoadThreads / 32, lane = threadIdx.x % 32;
      const int causal_offset = causal_key_offset(len_q, len_kv);
      turn_ring_open(warp / 4);
      int step0 = 0, round = 0;
      for (int item = blockIdx.x; item < PersistentTileOrder(batch, heads_q, len_q).items; item += gridDim.x) {
        for (int b = 0; b < PersistentTileOrder(batch, heads_q, len_q).blocks(item); ++b, ++round) {
          const QueryTile w = query_tile(item, b);
#if MASK_KIND != MASK_NONE
          const ScoreLimits lim{w.kv_end, causal_offset, len_q, w.m0,
                                mask + static_cast<int64_t>(w.tile.batch) * mask_stride_b +
                                    static_cast<int64_t>(w.tile.head) * mask_stride_h,
                                mask_stride_q, mask_stride_k};
#else
          const ScoreLimits lim{w.kv_end, causal_offset, len_q, w.m0, nullptr, 0, 0};
#endif
          float o[1][kDTiles][4], row_sum[1][2];
          mma_warpgroup_mainloop(pipe, sQ + (round % kQStages) * kQTileElems, sK, sV, w.n_tiles, lim, warp, lane, o,
                                 row_sum, step0, round);
          step0 += w.n_tiles;
          const AttentionTile out = query_tile(item, b).tile;  // recomputed: not kept live across the main loop
          store_output_from_registers(
              O + static_cast<int64_t>(out.batch) * o_stride_b + static_cast<int64_t>(out.head) * o_stride_h, o,
              row_sum, o_stride_s, out.m_block * kBlockM + warp * kWarpRows + lane / 4, len_q, lane);
        }
      }
      turn_ring_close(warp / 4);
    }
    return;
  }
#endif

  const QueryTile w(schedule_tile(), heads_q, heads_kv, len_q, len_kv, q_stride_b, q_stride_h, kv_stride_b, kv_stride_h,
                    v_stride_b, v_stride_h, ATTENTION_KEY_LENGTHS);
  const AttentionTile& tile = w.tile;
  const int causal_offset = causal_key_offset(len_q, len_kv);

  if (threadIdx.x == 0) pipe.init();
  __syncthreads();

  if (threadIdx.x < kLoadThreads) {
    warpgroup_registers_decrease<kLoadRegisters>();
    load_q_and_kv(pipe, sQ, sK, sV, Q + w.q_off, q_stride_s, w.m0, len_q, K + w.k_off, kv_stride_s, V + w.v_off,
                  v_stride_s, len_kv, w.n_tiles);
  } else {
    warpgroup_registers_increase<kMmaRegisters>();
    const int warp = threadIdx.x / 32 - kLoadThreads / 32, lane = threadIdx.x % 32;
#if MASK_KIND != MASK_NONE
    const ScoreLimits lim{w.kv_end, causal_offset, len_q, w.m0,
                          mask + static_cast<int64_t>(tile.batch) * mask_stride_b +
                              static_cast<int64_t>(tile.head) * mask_stride_h,
                          mask_stride_q, mask_stride_k};
#else
    const ScoreLimits lim{w.kv_end, causal_offset, len_q, w.m0, nullptr, 0, 0};
#endif
    float o[1][kDTiles][4], row_sum[1][2];
    mma_warpgroup_mainloop(pipe, sQ, sK, sV, w.n_tiles, lim, warp, lane, o, row_sum);
    store_output_from_registers(
        O + static_cast<int64_t>(tile.batch) * o_stride_b + static_cast<int64_t>(tile.head) * o_stride_h, o, row_sum,
        o_stride_s, w.m0 + warp * kWarpRows + lane / 4, len_q, lane);
  }
}
