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
