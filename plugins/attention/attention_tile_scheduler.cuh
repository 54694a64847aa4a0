// Which (batch, head, query block) a thread block computes, and which keys it can attend. grid = (query blocks,
// heads, batch): the launch order walks x fastest, so the blocks running at one time are mostly query blocks of the
// SAME head and share its K/V tiles in L2 (with heads fastest, each of ~2 blocks per SM would stream its own head's
// K/V from HBM). Within a head the LAST query block (under causal masking the one with the most keys) is dispatched
// first, so the short blocks fill the tail of the wave. With KV_SPLIT > 1 the KV_SPLIT CTAs of a query block are
// adjacent in x (one thread-block cluster) and split its keys. With PACK_GQA > 1 the heads of the grid are K/V heads
// and a query block's rows are (query, query head of the group) pairs (attention_config.cuh: packed_row_offset).
#pragma once
#include "attention_config.cuh"

struct AttentionTile {
  int batch, head, m_block;  // head: the query head, or with PACK_GQA > 1 the K/V head
  int split;                 // with KV_SPLIT > 1: this CTA's share of the keys (its rank in the cluster along x)
};

__device__ __forceinline__ AttentionTile schedule_tile() {
  AttentionTile t;
  t.m_block = gridDim.x / KV_SPLIT - 1 - blockIdx.x / KV_SPLIT;
  t.split = blockIdx.x % KV_SPLIT;
  t.head = blockIdx.y;
  t.batch = blockIdx.z;
  return t;
}

// Causal alignment: query i may attend keys j <= i + causal_key_offset (bottom-right: the last query sees every key).
__device__ __forceinline__ int causal_key_offset(int len_q, int len_kv) { return CAUSAL_BOTTOM_RIGHT ? len_kv - len_q : 0; }

// Keys [0, end) can be attended by some row of the tile whose rows start at m0 (rows beyond the last query are
// none): key_lengths[batch] and the causal limit of its last query shrink the range; later keys are never loaded.
// `key_lengths` is ATTENTION_KEY_LENGTHS (nullptr without HAS_KEY_LENGTHS).
__device__ __forceinline__ int attended_key_end(const AttentionTile& t, int m0, int len_q, int len_kv,
                                                const int* key_lengths) {
  int end = len_kv;
#if HAS_KEY_LENGTHS
  end = min(end, max(key_lengths[t.batch], 0));
#endif
#if CAUSAL
  const int last_query = (min(m0 + kBlockM, len_q * kPackGqa) - 1) / kPackGqa;
  end = min(end, last_query + 1 + causal_key_offset(len_q, len_kv));
#endif
  return end;
}

// The warp-specialized kernel's tile order (attention_sm90.cu: a 1-D grid; with the plan's persistent grid,
// min(query tiles, SMs) CTAs, CTA b computes tiles b, b + gridDim.x, ...). The (batch, head) pairs go in sections
// whose K/V fit in TILE_ORDER_L2_MB of L2 together; within a section the query blocks run from the last to the first
// (under causal masking the longest first), the section's pairs fastest. TILE_ORDER_L2_MB 0 (the plan's default)
// makes sections of one pair: v4's order, query blocks of one head adjacent (their K/V shared in L2), the last first.
// Larger sections put blocks of about one length next to each other (FlashAttention-3's longest-first order), but
// static striding of such rounds over persistent CTAs gave CTA c the same place in every round (H100 run attn-ws-1:
// causal 7-25% slower than one CTA a tile); the hardware's dispatch of one CTA a tile balances them.
#ifndef TILE_ORDER_L2_MB
#define TILE_ORDER_L2_MB 0  // set by the plan for the warp-specialized kernel, unused by the others
#endif
constexpr int kTileOrderL2Bytes = TILE_ORDER_L2_MB << 20;

struct PersistentTileOrder {
  int m_blocks, pairs, section;  // query blocks per (batch, head), pairs, pairs per section

  __device__ __forceinline__ PersistentTileOrder(int batch, int heads, int len_q, int len_kv)
      : m_blocks((len_q + kBlockM - 1) / kBlockM), pairs(batch * heads) {
    constexpr int kSectionKeys = kTileOrderL2Bytes / (2 * kHeadDim * static_cast<int>(sizeof(qkv_t)));  // K and V
    section = kSectionKeys == 0 ? 1 : max(1, min(pairs, kSectionKeys / max(len_kv, 1)));
  }
  __device__ __forceinline__ int tiles() const { return m_blocks * pairs; }
  // Tile i of the order (heads: query heads per batch element).
  __device__ __forceinline__ AttentionTile tile(int i, int heads) const {
    if constexpr (kTileOrderL2Bytes == 0) {
      const int pair = i / m_blocks;
      return AttentionTile{pair / heads, pair % heads, m_blocks - 1 - (i - pair * m_blocks), 0};
    }
    const int first_pair = i / (m_blocks * section) * section;
    const int width = min(section, pairs - first_pair);  // the last section may hold fewer pairs
    const int r = i - first_pair * m_blocks;
    const int pair = first_pair + r % width;
    return AttentionTile{pair / heads, pair % heads, m_blocks - 1 - r / width, 0};
  }
};
