"""The ONNX Attention rule (opset 23+): 3-D or 4-D inputs, scale, is_causal (top-left), bool or float attn_mask,
nonpad_kv_seqlen (as ``key_lengths``), softcap; past KV, present outputs in use and sliding windows are reported
unsupported."""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites import CannotFuse
from trt_fusedattn.rewrites._graph import is_graph_output, is_present, numpy_dtype
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.match import Match, Operand, Output
from trt_fusedattn.rewrites.attention.operands import trace_bhsd, trace_output

def match_onnx_attention(node: gs.Node, graph: gs.Graph, shapes: TensorShapes) -> Match:
    """The site of an ONNX Attention node: its inputs as operands, its scale, mask, causality and key lengths."""
    inputs = list(node.inputs) + [None] * (7 - len(node.inputs))
    q, k, v, mask, past_key, past_value, nonpad = inputs[:7]
    if is_present(past_key) or is_present(past_value):
        raise CannotFuse("Attention with past_key/past_value (KV cache) is not supported by FusedAttention")
    for index, what in ((1, "present_key"), (2, "present_value"), (3, "qk_matmul_output")):
        if len(node.outputs) > index and (node.outputs[index].outputs or is_graph_output(node.outputs[index], graph)):
            raise CannotFuse(f"Attention output {what} is in use; FusedAttention returns only the attention output")
    if node.attrs.get("left_window_size", -1) >= 0 or node.attrs.get("right_window_size", -1) >= 0:
        raise CannotFuse("Attention with a sliding window is not supported by FusedAttention")
    match = Match(anchor=node, q=Operand(), k=Operand(), v=Operand(), out=Output())
    rank = shapes.rank(q)
    if rank == 4:
        match.q, q_factor = trace_bhsd(q, False, shapes)
        match.k, k_factor = trace_bhsd(k, True, shapes)
        match.v, v_factor = trace_bhsd(v, True, shapes)
        if v_factor != 1.0:
            match.v = Operand(bhsd=v)
        match.out = trace_output(node.outputs[0], graph, match, shapes)
    elif rank == 3:
        hq, hkv = node.attrs.get("q_num_heads"), node.attrs.get("kv_num_heads")
        if not hq or not hkv:
            raise CannotFuse("3-D Attention without q_num_heads/kv_num_heads")
        match.q, match.k, match.v = Operand(flat=q, heads=hq), Operand(flat=k, heads=hkv), Operand(flat=v, heads=hkv)
        q_factor = k_factor = 1.0
        match.out = Output(flat=node.outputs[0], producer=node)
    else:
        raise CannotFuse(f"Attention inputs of rank {rank or 'unknown'} (3 or 4 expected)")
    base = node.attrs.get("scale")
    if base is None or base == 0:
        dim = shapes.dim(q, 3) if rank == 4 else (shapes.dim(q, 2) // hq if shapes.dim(q, 2) else None)
        if q_factor * k_factor != 1.0 and dim is None:
            raise CannotFuse("cannot fold the Q/K scale without the head dim")
        base = 1.0 / math.sqrt(dim) if dim else 0.0
    match.scale = base * q_factor * k_factor if base else 0.0
    match.softcap = float(node.attrs.get("softcap", 0.0))  # ONNX Attention caps before the mask, as the contract
    if is_present(mask):
        if numpy_dtype(mask) == np.dtype(bool):
            match.keep_masks.append((mask, False))
        else:
            match.float_masks.append(mask)
        mask_len, keys_len = shapes.dim(mask, -1), shapes.dim(k, 2 if rank == 4 else 1)
        if mask_len is not None and keys_len is not None and mask_len != keys_len:
            raise CannotFuse(f"Attention mask covers {mask_len} of {keys_len} keys (ONNX pads it with -inf); "
                        f"FusedAttention needs a mask over all keys")
    if node.attrs.get("is_causal", 0):
        if is_present(nonpad):
            raise CannotFuse("Attention is_causal with nonpad_kv_seqlen aligns causality to each batch's valid keys "
                        "(offset nonpad_kv_seqlen[b] - L_q); FusedAttention's causal alignment is one for all")
        match.causal = 1
    if is_present(nonpad):
        match.key_lengths = nonpad
    return match
