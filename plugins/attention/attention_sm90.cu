// trt_fusedattn::FusedAttention forward, warp-specialized for Hopper (sm_90a; FlashAttention-3's design within the
// AOT plugin ABI). A persistent thread block (the plan's grid is min(query tiles, SMs)) computes query tiles of
// kBlockM = 128 rows of one (batch, head) each, in PersistentTileOrder (attention_tile_scheduler.cuh), with three
// warpgroups:
// - warpgroup 0 loads (attention_load_sm90.cuh): Q once, then K/V tiles into kStages swizzled stages, handing each
//   over through mbarriers (attention_pipeline_sm90.cuh); it gives most of its registers away (setmaxnreg);
// - warpgroups 1 and 2 compute (attention_mma_warpgroups_sm90.cuh), 64 query rows each, with wgmma, intra-warpgroup
//   overlap of the softmax with P V, and ping-pong turns between them;
// then each normalizes and stores its rows of O straight from registers (attention_epilogue.cuh) and goes on to its
// next tile, whose Q and first K/V tiles the loader has been fetching meanwhile (K/V steps and Q buffers are counted
// on across the CTA's tiles). Masking, online softmax and the argument list are those of attention.cu.
// FP8 (E4M3 Q/K/V): the same kernel with k32 e4m3 wgmmas, P rounded to e4m3 in registers and V transposed by the
// loader (the FP8 wgmma B operand is K-major only); scales are compile-time (attention_softmax.cuh, epilogue).
#include "attention_tile_scheduler.cuh"
#include "attention_load_sm90.cuh"
#include "attention_mma_warpgroups_sm90.cuh"
#include "attention_epilogue.cuh"
#include "common/compiler_fences.cuh"
#include "common/warpgroup.cuh"

static_assert(kWarps == 8 && kBlockM == 128, "the warp-specialized kernel has two MMA warpgroups of 64 rows");
constexpr int kBlockThreads = kLoadThreads + kMmaThreads;
// 24 * 128 + 240 * 256 = 64512 of the SM's 65536 registers; the FP8 loader, which also transposes V, keeps 40
// (40 * 128 + 232 * 256 = 64512).
constexpr int kLoadRegisters = FP8 ? 40 : 24;
constexpr int kMmaRegisters = FP8 ? 232 : 240;

// One query tile of the CTA: where its rows and its (batch, head)'s K/V are, and how many K/V tiles it visits.
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

  if (threadIdx.x == 0) pipe.init();
  __syncthreads();

  if (threadIdx.x < kLoadThreads) {
    warpgroup_registers_decrease<kLoadRegisters>();
    int step0 = 0;  // K/V steps of the CTA's earlier tiles
    for (int round = 0;; ++round) {
      // the order and the grid size are read anew every tile: the loader's 24-40 registers would spill them
      const PersistentTileOrder order(batch, heads_q, len_q, len_kv);
      const int i = blockIdx.x + round * grid_dim_x();
      if (i >= order.tiles()) break;
      const QueryTile w(order.tile(i, heads_q), heads_q, heads_kv, len_q, len_kv, q_stride_b, q_stride_h, kv_stride_b,
                        kv_stride_h, v_stride_b, v_stride_h, ATTENTION_KEY_LENGTHS);
      load_q_and_kv(pipe, sQ, sK, sV, Q + w.q_off, q_stride_s, w.m0, len_q, K + w.k_off, kv_stride_s, V + w.v_off,
                    v_stride_s, len_kv, w.n_tiles, round, step0);
      step0 += w.n_tiles;
    }
  } else {
    warpgroup_registers_increase<kMmaRegisters>();
    const int warp = threadIdx.x / 32 - kLoadThreads / 32, lane = threadIdx.x % 32;
    turn_barriers_open(warp / 4);
    int step0 = 0;
    for (int round = 0;; ++round) {  // as the loader's loop: little state stays live across the main loop
      const PersistentTileOrder order(batch, heads_q, len_q, len_kv);
      const int i = blockIdx.x + round * grid_dim_x();
      if (i >= order.tiles()) break;
      const QueryTile w(order.tile(i, heads_q), heads_q, heads_kv, len_q, len_kv, q_stride_b, q_stride_h, kv_stride_b,
                        kv_stride_h, v_stride_b, v_stride_h, ATTENTION_KEY_LENGTHS);
      const int causal_offset = causal_key_offset(len_q, len_kv);
#if MASK_KIND != MASK_NONE
      const ScoreLimits lim{w.kv_end, causal_offset, len_q, w.m0,
                            mask + static_cast<int64_t>(w.tile.batch) * mask_stride_b +
                                static_cast<int64_t>(w.tile.head) * mask_stride_h,
                            mask_stride_q, mask_stride_k};
#else
      const ScoreLimits lim{w.kv_end, causal_offset, len_q, w.m0, nullptr, 0, 0};
#endif
      float o[1][kDTiles][4], row_sum[1][2];
      mma_warpgroup_mainloop(pipe, sQ, sK, sV, w.n_tiles, round, step0, lim, warp, lane, o, row_sum);
      step0 += w.n_tiles;
      // The store's (batch, head, rows) decoded again (grid_dim_x() is not CSE'd): kept live across the main loop
      // they took the registers in which ptxas holds the Q descriptors of the k-steps (which it then rebuilt in
      // every step, between the wgmmas; H100 run attn-ws-2: 10-15% slower than v4 at bf16 hd128)
      const AttentionTile out = order.tile(blockIdx.x + round * grid_dim_x(), heads_q);
      store_output_from_registers(
          O + static_cast<int64_t>(out.batch) * o_stride_b + static_cast<int64_t>(out.head) * o_stride_h, o, row_sum,
          o_stride_s, out.m_block * kBlockM + warp * kWarpRows + lane / 4, len_q, lane);
    }
    turn_barriers_close(warp / 4);
  }
}
