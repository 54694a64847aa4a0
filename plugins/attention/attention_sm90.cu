// trt_fusedattn::FusedAttention forward, warp-specialized for Hopper (sm_90a; FlashAttention-3's design within the
// AOT plugin ABI). One thread block computes two query tiles (one with a mask) of kBlockM = 128 rows of one (batch,
// head), one after the other, with three warpgroups:
// - warpgroup 0 loads (attention_load_sm90.cuh): each query tile's Q, then its K/V tiles into kStages swizzled
//   stages, handing each over through mbarriers (attention_pipeline_sm90.cuh); it gives most of its registers away
//   (setmaxnreg);
// - warpgroups 1 and 2 compute (attention_mma_warpgroups_sm90.cuh), 64 query rows each, with wgmma, intra-warpgroup
//   overlap of the softmax with P V, and ping-pong turns between them;
// then each normalizes and stores its rows of O straight from registers (attention_epilogue.cuh). Masking, online
// softmax and the argument list are those of attention.cu; the grid's x is half the query tiles without a mask
// (query_tile_of_block).
// FP8 (E4M3 Q/K/V): the same kernel with k32 e4m3 wgmmas, P rounded to e4m3 in registers and V transposed by the
// loader (the FP8 wgmma B operand is K-major only); scales are compile-time (attention_softmax.cuh, epilogue).
#include "attention_tile_scheduler.cuh"
#include "attention_load_sm90.cuh"
#include "attention_mma_warpgroups_sm90.cuh"
#include "attention_epilogue.cuh"
#include "common/warpgroup.cuh"

static_assert(kWarps == 8 && kBlockM == 128, "the warp-specialized kernel has two MMA warpgroups of 64 rows");
constexpr int kBlockThreads = kLoadThreads + kMmaThreads;
// Registers a thread after setmaxnreg, within the 168 * 384 = 64512 the block is launched with (8-register steps):
// loader 32 and MMA warpgroups 232 with two query tiles a block (4096 + 59392), 24 and 240 with one (3072 + 61440);
// the FP8 loader, which also transposes V, 40 (5120 + 59392).
constexpr int kLoadRegisters = FP8 ? 40 : kQueryTilesPerBlock == 2 ? 32 : 24;
constexpr int kMmaRegisters = FP8 || kQueryTilesPerBlock == 2 ? 232 : 240;

// With two query tiles a block, block x computes the x-th from the end and the x-th from the start of one (batch,
// head) (grid x = half the query tiles, rounded up): the loader fetches the second tile's Q and first K/V tiles while
// the MMA warpgroups finish the first tile's last products and store its rows, and under causal masking each
// block's two tiles together attend about the same number of keys. With an odd count the middle block has one tile.
// With one, block x computes the x-th from the end (the longest first under causal masking).
__device__ __forceinline__ int query_tiles_of_block(int len_q) {
  const int m_blocks = (len_q + kBlockM - 1) / kBlockM;
  return kQueryTilesPerBlock == 1 || static_cast<int>(blockIdx.x) == m_blocks - 1 - static_cast<int>(blockIdx.x) ? 1
                                                                                                                  : 2;
}
__device__ __forceinline__ AttentionTile query_tile_of_block(int len_q, int round) {
  const int m_blocks = (len_q + kBlockM - 1) / kBlockM;
  return AttentionTile{static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y),
                       round == 0 ? m_blocks - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x), 0};
}

// K/V tiles the query tile starting at row m0 visits (those holding keys it can attend).
__device__ __forceinline__ int key_tiles(const AttentionTile& tile, int m0, int len_q, int len_kv,
                                         const int* key_lengths) {
  const int kv_end = attended_key_end(tile, m0, len_q, len_kv, key_lengths);
  return kv_end > 0 ? (kv_end + kBlockN - 1) / kBlockN : 0;
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1) fused_attention(ATTENTION_KERNEL_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem[];
  // the plan adds kSmemAlign - 16 bytes of slack for this round-up
  qkv_t* sQ = reinterpret_cast<qkv_t*>(smem + ((kSmemAlign - smem_addr(smem) % kSmemAlign) % kSmemAlign));
  qkv_t* sK = sQ + kQTileElems;
  qkv_t* sV = sK + kStages * kKTileElems;  // V tiles (FP8: V^T tiles, then the loader's V staging tiles)
  const KVPipeline pipe{smem_addr(sV + (kStages + kVStagingTiles) * kVTileElems)};

  const int head_kv = blockIdx.y / (heads_q / heads_kv);
  const int64_t k_off = static_cast<int64_t>(blockIdx.z) * kv_stride_b + static_cast<int64_t>(head_kv) * kv_stride_h;
  const int64_t v_off = static_cast<int64_t>(blockIdx.z) * v_stride_b + static_cast<int64_t>(head_kv) * v_stride_h;
  const int causal_offset = causal_key_offset(len_q, len_kv);
  const int n_rounds = query_tiles_of_block(len_q);

  if (threadIdx.x == 0) pipe.init();
  __syncthreads();

  if (threadIdx.x < kLoadThreads) {
    warpgroup_registers_decrease<kLoadRegisters>();
    LoadChain chain;
    for (int round = 0; round < n_rounds; ++round) {
      const AttentionTile tile = query_tile_of_block(len_q, round);
      const int m0 = tile.m_block * kBlockM;
      const int64_t q_off =
          static_cast<int64_t>(tile.batch) * q_stride_b + static_cast<int64_t>(tile.head) * q_stride_h;
      load_query_tile(pipe, chain, round, sQ, sK, sV, Q + q_off, q_stride_s, m0, len_q, K + k_off, kv_stride_s,
                      V + v_off, v_stride_s, len_kv, key_tiles(tile, m0, len_q, len_kv, ATTENTION_KEY_LENGTHS));
    }
    finish_loads(pipe, chain, sV);
  } else {
    warpgroup_registers_increase<kMmaRegisters>();
    const int warp = threadIdx.x / 32 - kLoadThreads / 32, lane = threadIdx.x % 32;
    int step0 = 0;
    for (int round = 0; round < n_rounds; ++round) {
      const AttentionTile tile = query_tile_of_block(len_q, round);
      const int m0 = tile.m_block * kBlockM;
      const int kv_end = attended_key_end(tile, m0, len_q, len_kv, ATTENTION_KEY_LENGTHS);
#if MASK_KIND != MASK_NONE
      const ScoreLimits lim{kv_end, causal_offset, len_q, m0,
                            mask + static_cast<int64_t>(tile.batch) * mask_stride_b +
                                static_cast<int64_t>(tile.head) * mask_stride_h,
                            mask_stride_q, mask_stride_k};
#else
      const ScoreLimits lim{kv_end, causal_offset, len_q, m0, nullptr, 0, 0};
#endif
      const int n_tiles = key_tiles(tile, m0, len_q, len_kv, ATTENTION_KEY_LENGTHS);
      float o[1][kDTiles][4], row_sum[1][2];
      // (with one query tile a block, literal zeros: a runtime step offset cost the masked hd256 tile 64 B of spills)
      mma_warpgroup_mainloop(pipe, sQ, sK, sV, kQueryTilesPerBlock == 1 ? 0 : round,
                             kQueryTilesPerBlock == 1 ? 0 : step0, n_tiles, lim, warp, lane, o, row_sum);
      step0 += n_tiles;
      store_output_from_registers(
          O + static_cast<int64_t>(tile.batch) * o_stride_b + static_cast<int64_t>(tile.head) * o_stride_h, o,
          row_sum, o_stride_s, m0 + warp * kWarpRows + lane / 4, len_q, lane);
    }
  }
}
