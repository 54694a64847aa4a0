// The persistent grid's static tile order (tuning PERSISTENT_CTAS > 0 on the warp-specialized kernel): the plan
// launches min(work items, PERSISTENT_CTAS) CTAs and CTA b computes items b, b + gridDim.x, ... Each item is one
// query block (no causal masking) or, under causal masking, the pair of query blocks j and M - 1 - j of one
// (batch, head): a long and a short block whose key tiles add up to about M + 1 blocks' worth, so every item costs
// the same and static striding stays balanced (v6 strode over single causal blocks: the busiest CTA had 1.12-1.41x
// the mean work). Items of one (batch, head) are adjacent, the longest block of each item first, so the CTAs of a
// round read few heads' K/V through L2 at a time (v4's order). No memory, no host work: the AOT ABI holds.
#pragma once
#include "attention_tile_scheduler.cuh"

constexpr int kBlocksPerItem = CAUSAL ? 2 : 1;

struct PersistentTileOrder {
  int m_blocks, items_per_pair, items;  // query blocks and items per (batch, head); items in all

  __device__ __forceinline__ PersistentTileOrder(int batch, int heads, int len_q)
      : m_blocks((len_q + kBlockM - 1) / kBlockM),
        items_per_pair((m_blocks + kBlocksPerItem - 1) / kBlocksPerItem),
        items(items_per_pair * batch * heads) {}

  // Query blocks of `item`: 2 under causal masking but for the middle block of an odd count, else 1.
  __device__ __forceinline__ int blocks(int item) const {
    return kBlocksPerItem == 2 && 2 * (item % items_per_pair) + 1 != m_blocks ? 2 : 1;
  }
  // The `second`-th query block of `item` (0: block M - 1 - j, the longer; 1: block j).
  __device__ __forceinline__ AttentionTile tile(int item, int second, int heads) const {
    const int pair = item / items_per_pair, j = item - pair * items_per_pair;
    return AttentionTile{pair / heads, pair % heads, second ? j : m_blocks - 1 - j, 0};
  }
};
