"""Small hand-built attention graphs for patterns the exported samples do not hold (Mul/split scales, Tile GQA,
Trilu/Range causal masks, cross attention, bottom-right causal, ONNX Attention variants), and their inputs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class GraphBuilder:
    """Collects nodes and constants of one graph; ``op`` returns the output name."""

    def __init__(self):
        self.nodes, self.inits, self.inputs, self.count = [], [], [], 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, value, dtype=None) -> str:
        array = np.asarray(value, dtype=dtype)
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def op(self, op_type: str, inputs: list, outputs: int = 1, **attrs):
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names[0] if outputs == 1 else names

    def model(self, output: str, rank: int, elem_type: int = FLOAT, opset: int = 17, extra_outputs=(),
              check: bool = True) -> onnx.ModelProto:
        outputs = [helper.make_tensor_value_info(name, elem_type, [None] * rank) for name in (output, *extra_outputs)]
        graph = helper.make_graph(self.nodes, "attention", self.inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 9
        if check:  # off for graphs that are wrong on purpose (shape inference would reject them)
            onnx.checker.check_model(model)
        return model


def softmax_attention(*, batch=2, lq=5, lkv=5, heads=4, kv_heads=4, dim=16, scale="mul", mask=None,
                      gqa="expand", keys="split", softmax_axis=-1, fp16_softmax=False, layers=1,
                      merge="constant") -> onnx.ModelProto:
    """Q/K/V projections reshaped to heads, Softmax(scale·Q·Kᵀ + mask)·V, heads merged back to [B, Lq, H·D].

    scale: "div" | "mul" | "split" (sqrt on Q and on K) ; mask: None | "float" | "where" (Where(m, S, -inf)) |
    "masked_fill" (Where(m, -inf, S)) | "causal_const" | "causal_const_br" | "trilu" | "triu_neg_inf" | "range" |
    "range_less" | "range_greater_drop" | "range_bottom_right" | "float+range" ; gqa (kv_heads < heads): "expand" | "tile" (Tile on an inserted axis) | "tile_heads"
    (Tile on the heads axis: h % H order) ; keys: "split" (Transpose 0,2,3,1) | "bhsd" (0,1,3,2 of BHSD);
    layers: blocks in a chain, each reading the previous output as queries and the same K, V and mask;
    merge: "constant" (heads merged by a constant Reshape) | "shape" (the sdpa export's way: the output Reshaped
    to its own shape read with Shape, transposed, then merged by a shape read from the output with Shape)."""
    g = GraphBuilder()
    result = g.input("q", FLOAT, [batch, lq, heads * dim])
    k_in = g.input("k", FLOAT, [batch, lkv, kv_heads * dim])
    v_in = g.input("v", FLOAT, [batch, lkv, kv_heads * dim])
    for _ in range(layers):
        result = _attention_block(g, result, k_in, v_in, batch, lq, lkv, heads, kv_heads, dim, scale, mask, gqa,
                                  keys, softmax_axis, fp16_softmax, merge)
    return g.model(result, rank=3)


def _attention_block(g, q_in, k_in, v_in, batch, lq, lkv, heads, kv_heads, dim, scale, mask, gqa, keys,
                     softmax_axis, fp16_softmax, merge) -> str:
    q = g.op("Transpose", [g.op("Reshape", [q_in, g.const([batch, lq, heads, dim], np.int64)])], perm=[0, 2, 1, 3])
    k_bshd = g.op("Reshape", [k_in, g.const([batch, lkv, kv_heads, dim], np.int64)])
    v = g.op("Transpose", [g.op("Reshape", [v_in, g.const([batch, lkv, kv_heads, dim], np.int64)])],
             perm=[0, 2, 1, 3])
    if kv_heads != heads or keys == "bhsd":
        k = g.op("Transpose", [k_bshd], perm=[0, 2, 1, 3])
        if kv_heads != heads:
            k, v = (_repeat_heads(g, t, gqa, batch, kv_heads, heads // kv_heads, lkv, dim) for t in (k, v))
        kt = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    else:
        kt = g.op("Transpose", [k_bshd], perm=[0, 2, 3, 1])
    factor = 1.0 / np.sqrt(dim)
    if scale == "split":
        root = g.const(np.float32(np.sqrt(factor)))
        q, kt = g.op("Mul", [q, root]), g.op("Mul", [kt, root])
    scores = g.op("MatMul", [q, kt])
    if scale == "mul":
        scores = g.op("Mul", [scores, g.const(np.float32(factor))])
    elif scale == "div":
        scores = g.op("Div", [scores, g.const(np.float32(np.sqrt(dim)))])
    scores = _apply_mask(g, scores, mask, batch, lq, lkv)
    if fp16_softmax:
        scores = g.op("Cast", [scores], to=TensorProto.FLOAT16)
    probs = g.op("Softmax", [scores], axis=softmax_axis)
    if fp16_softmax:
        probs = g.op("Cast", [probs], to=FLOAT)
    out = g.op("MatMul", [probs, v])
    if merge == "constant":
        merged = g.op("Transpose", [out], perm=[0, 2, 1, 3])
        return g.op("Reshape", [merged, g.const([batch, lq, heads * dim], np.int64)])
    def dim_of(tensor, axis):
        return g.op("Unsqueeze", [g.op("Gather", [g.op("Shape", [tensor]), g.const(np.int64(axis))], axis=0),
                                  g.const([0], np.int64)])
    own_shape = g.op("Concat", [dim_of(out, 0), g.const([-1], np.int64), dim_of(q, 2), dim_of(v, 3)], axis=0)
    merged = g.op("Transpose", [g.op("Reshape", [out, own_shape])], perm=[0, 2, 1, 3])
    target = g.op("Concat", [dim_of(out, 0), dim_of(out, 2), g.const([-1], np.int64)], axis=0)
    return g.op("Reshape", [merged, target])


def _repeat_heads(g: GraphBuilder, t: str, how: str, batch, kv_heads, group, length, dim) -> str:
    if how == "tile_heads":
        return g.op("Tile", [t, g.const([1, group, 1, 1], np.int64)])
    grown = g.op("Unsqueeze", [t, g.const([2], np.int64)])
    if how == "tile":
        grown = g.op("Tile", [grown, g.const([1, 1, group, 1, 1], np.int64)])
    else:
        grown = g.op("Expand", [grown, g.const([batch, kv_heads, group, length, dim], np.int64)])
    return g.op("Reshape", [grown, g.const([batch, kv_heads * group, length, dim], np.int64)])


def causal_keep(lq: int, lkv: int, alignment: str = "top_left") -> np.ndarray:
    offset = 0 if alignment == "top_left" else lkv - lq
    return np.arange(lkv)[None, :] <= np.arange(lq)[:, None] + offset


def _mask_input(g: GraphBuilder, name: str, elem_type: int, shape: list) -> str:
    """The graph input ``name``, declared on first use (layers share their mask)."""
    if not any(value.name == name for value in g.inputs):
        g.input(name, elem_type, shape)
    return name


def _apply_mask(g: GraphBuilder, scores: str, mask, batch, lq, lkv) -> str:
    neg_inf = g.const(np.float32(-np.inf)) if mask else None
    if mask is None:
        return scores
    if mask in ("float", "float+range"):
        scores = g.op("Add", [scores, _mask_input(g, "mask", FLOAT, [batch, 1, lq, lkv])])
        if mask == "float":
            return scores
        mask = "range"
    if mask == "where":
        return g.op("Where", [_mask_input(g, "mask", TensorProto.BOOL, [batch, 1, lq, lkv]), scores, neg_inf])
    if mask == "masked_fill":
        return g.op("Where", [_mask_input(g, "drop", TensorProto.BOOL, [batch, 1, lq, lkv]), neg_inf, scores])
    if mask in ("causal_const", "causal_const_br"):
        keep = causal_keep(lq, lkv, "top_left" if mask == "causal_const" else "bottom_right")
        additive = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]
        return g.op("Add", [scores, g.const(additive)])
    if mask == "triu_neg_inf":  # torch's square subsequent mask: triu(full((Lq, Lkv), -inf), 1), added
        filled = g.op("ConstantOfShape", [g.const([lq, lkv], np.int64)],
                      value=numpy_helper.from_array(np.array([-np.inf], np.float32)))
        return g.op("Add", [scores, g.op("Trilu", [filled, g.const(np.int64(1))], upper=1)])
    if mask == "trilu":  # masked_fill(triu(ones, 1).bool(), -inf)
        ones = g.op("ConstantOfShape", [g.const([lq, lkv], np.int64)],
                    value=numpy_helper.from_array(np.ones(1, np.float32)))
        upper = g.op("Trilu", [ones, g.const(np.int64(1))], upper=1)
        return g.op("Where", [g.op("Cast", [upper], to=TensorProto.BOOL), neg_inf, scores])
    if mask.startswith("range"):  # positions from Range compared: key j <= query i (+ Lkv - Lq: bottom right)
        zero, one = g.const(np.int64(0)), g.const(np.int64(1))
        rows = g.op("Unsqueeze", [g.op("Range", [zero, g.const(np.int64(lq)), one]), g.const([1], np.int64)])
        cols = g.op("Unsqueeze", [g.op("Range", [zero, g.const(np.int64(lkv)), one]), g.const([0], np.int64)])
        if mask == "range_greater_drop":  # masked_fill(j > i, -inf)
            return g.op("Where", [g.op("Greater", [cols, rows]), neg_inf, scores])
        if mask == "range_less":  # i >= j written as j < i + 1
            allowed = g.op("Less", [cols, g.op("Add", [rows, one])])
        elif mask == "range_bottom_right":
            allowed = g.op("GreaterOrEqual", [g.op("Add", [rows, g.const(np.int64(lkv - lq))]), cols])
        else:
            allowed = g.op("LessOrEqual", [cols, rows])
        bias = g.op("Where", [allowed, g.const(np.float32(0.0)), neg_inf])
        return g.op("Add", [scores, bias])
    raise ValueError(f"unknown mask kind {mask!r}")


def onnx_attention(*, batch=2, lq=5, lkv=7, heads=4, kv_heads=2, dim=16, rank=4, is_causal=0, mask=None,
                   past=False, softcap=0.0, scale=None, mask_len=None, nonpad=False, dim_k=None,
                   dim_v=None) -> onnx.ModelProto:
    """One ONNX Attention node on graph inputs (4-D BHSD or 3-D [B, S, H·D]); opset 23, or 24 with the
    nonpad_kv_seqlen input (valid keys per batch). dim_k, dim_v: K's and V's head dims (default Q's)."""
    g = GraphBuilder()
    shape = (lambda h, l, d: [batch, h, l, d]) if rank == 4 else (lambda h, l, d: [batch, l, h * d])
    inputs = [g.input("q", FLOAT, shape(heads, lq, dim)), g.input("k", FLOAT, shape(kv_heads, lkv, dim_k or dim)),
              g.input("v", FLOAT, shape(kv_heads, lkv, dim_v or dim))]
    mask_len = mask_len or lkv + (3 if past else 0)
    if mask == "bool":
        inputs.append(g.input("mask", TensorProto.BOOL, [batch, 1, lq, mask_len]))
    elif mask == "float":
        inputs.append(g.input("mask", FLOAT, [batch, 1, lq, mask_len]))
    elif past or nonpad:
        inputs.append("")
    if past:
        inputs += [g.input("past_key", FLOAT, [batch, kv_heads, 3, dim_k or dim]),
                   g.input("past_value", FLOAT, [batch, kv_heads, 3, dim_v or dim])]
    if nonpad:
        inputs += [""] * (6 - len(inputs)) + [g.input("nonpad_kv_seqlen", TensorProto.INT64, [batch])]
    attrs = {"is_causal": is_causal}
    if rank == 3:
        attrs.update(q_num_heads=heads, kv_num_heads=kv_heads)
    if softcap:
        attrs["softcap"] = softcap
    if scale is not None:
        attrs["scale"] = scale
    out = g.op("Attention", inputs, **attrs)
    return g.model(out, rank=rank, opset=24 if nonpad else 23, check=dim_k is None)


def attention_inputs(model: onnx.ModelProto, seed: int = 0) -> dict:
    """Random inputs for a hand-built graph; a boolean mask ("mask": True = attend, "drop": True = masked) keeps
    key 0 for every query (no empty rows) and a float mask holds -inf and finite values."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name == "nonpad_kv_seqlen":  # valid keys per batch: 1 to all of them
            keys = [d.dim_value for d in next(v for v in model.graph.input if v.name == "k").type.tensor_type.shape.dim]
            feeds[value.name] = rng.integers(1, keys[-2 if len(keys) == 4 else 1] + 1, shape).astype(np.int64)
        elif value.type.tensor_type.elem_type == TensorProto.BOOL:
            keep = rng.random(shape) < 0.7
            keep[..., 0] = True
            feeds[value.name] = ~keep if value.name == "drop" else keep
        elif value.name == "mask":
            bias = rng.standard_normal(shape).astype(np.float32)
            bias[rng.random(shape) < 0.3] = -np.inf
            bias[..., 0] = 0.0
            feeds[value.name] = bias
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def torch_attention_module(style: str, *, heads: int = 4, kv_heads: int = 2, dim: int = 16, hidden: int = 64):
    """A torch module computing attention one way a model author writes it (for export by both exporters):
    "repeat_interleave" (K/V heads repeated in BHSD), "bshd_expand" (repeated before the head split),
    "sdpa_causal" (F.scaled_dot_product_attention, is_causal, scale from the head dim), "masked_fill_tril"
    (masked_fill with a tril mask), "sdpa_gqa" (sdpa with enable_gqa: K/V keep their heads), "packed_qkv" (one
    projection viewed per head and sliced into Q, K, V: onnx's shape inference loses the head dim),
    "nn_mha_causal" (torch.nn.MultiheadAttention with nn.Transformer's square subsequent mask)."""
    import math

    import torch

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(hidden, heads * dim)
            self.k = torch.nn.Linear(hidden, kv_heads * dim)
            self.v = torch.nn.Linear(hidden, kv_heads * dim)
            self.mha = torch.nn.MultiheadAttention(hidden, heads, batch_first=True)

        def forward(self, x):
            b, length, _ = x.shape
            group = heads // kv_heads
            if style == "nn_mha_causal":  # torch's own module with its square subsequent (triu of -inf) mask
                mask = torch.nn.Transformer.generate_square_subsequent_mask(length, device=x.device)
                return self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]
            q = self.q(x).view(b, length, heads, dim).transpose(1, 2)
            k = self.k(x).view(b, length, kv_heads, dim)
            v = self.v(x).view(b, length, kv_heads, dim)
            if style == "packed_qkv":  # one projection viewed per head, sliced along the last axis (GPT-NeoX)
                qkv = torch.cat([self.q(x), self.k(x).repeat(1, 1, group), self.v(x).repeat(1, 1, group)], -1)
                qkv = qkv.view(b, length, heads, 3 * dim).transpose(1, 2)
                third = qkv.size(-1) // 3  # bounds read from the shape, as GPT-NeoX slices
                q, k, v = qkv[..., :third], qkv[..., third:2 * third], qkv[..., 2 * third:]
                scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
                return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, length, heads * dim)
            if style == "bshd_expand":
                k, v = (t[:, :, :, None, :].expand(b, length, kv_heads, group, dim).reshape(b, length, heads, dim)
                        .transpose(1, 2) for t in (k, v))
            elif style == "sdpa_gqa":
                k, v = k.transpose(1, 2), v.transpose(1, 2)
            else:
                k, v = (t.transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))
            if style.startswith("sdpa"):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                       enable_gqa=style == "sdpa_gqa")
            else:
                scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
                if style == "masked_fill_tril":
                    keep = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device))
                    scores = scores.masked_fill(~keep, float("-inf"))
                out = scores.softmax(-1) @ v
            return out.transpose(1, 2).reshape(b, length, heads * dim)

    torch.manual_seed(0)
    return Attention().eval()


def export_torch_attention(style: str, exporter: str, path, dtype: str = "float32") -> onnx.ModelProto:
    """Export ``torch_attention_module(style)`` in ``dtype`` with TorchScript (opset 18) or dynamo (opset 23),
    dynamic batch and sequence."""
    import torch

    dtype = getattr(torch, dtype)
    module, x = torch_attention_module(style).to(dtype), torch.randn(2, 6, 64, dtype=dtype)
    if exporter == "torchscript":
        torch.onnx.export(module, (x,), str(path), opset_version=18, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "seq"}})
    else:
        torch.onnx.export(module, (x,), str(path), opset_version=23, dynamo=True, input_names=["x"],
                          output_names=["y"], dynamic_shapes={"x": {0: torch.export.Dim("batch"),
                                                                    1: torch.export.Dim("seq")}})
    return onnx.load(str(path))


def irregular_scores(kind: str, *, batch=2, heads=4, length=5, dim=16) -> onnx.ModelProto:
    """Softmax(f(Q·Kᵀ))·V on BHSD inputs where f is not what FusedAttention computes, or the probabilities are
    used elsewhere: "probs_output", "mask_before_scale", "fill_zero", "dynamic_scale", "float_and_bool",
    "mask_inside_softcap"; and "kt_input" (plain attention with Kᵀ as the graph input, no transpose to undo),
    "softcap" and "softcap_mask" (Gemma-2: cap * tanh(scale * S / cap), then the mask)."""
    g = GraphBuilder()
    shape = [batch, heads, length, dim]
    q, v = g.input("q", FLOAT, shape), g.input("v", FLOAT, shape)
    if kind == "kt_input":  # Kᵀ given as is: [B, H, D, L]
        kt = g.input("kt", FLOAT, [batch, heads, dim, length])
    else:
        kt = g.op("Transpose", [g.input("k", FLOAT, shape)], perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [q, kt])
    mask_shape = [batch, 1, length, length]
    if kind == "mask_before_scale":
        scores = g.op("Mul", [g.op("Add", [scores, g.input("mask", FLOAT, mask_shape)]), g.const(np.float32(0.25))])
    elif kind == "fill_zero":
        scores = g.op("Where", [g.input("mask", TensorProto.BOOL, mask_shape), scores, g.const(np.float32(0.0))])
    elif kind == "dynamic_scale":
        scores = g.op("Mul", [scores, g.input("scale", FLOAT, [1])])
    elif kind in ("softcap", "softcap_mask", "mask_inside_softcap"):  # Gemma 2: cap * tanh(scale * scores / cap)
        cap = g.const(np.float32(2.0))  # small, so that the cap bites on unit-normal inputs
        scores = g.op("Mul", [scores, g.const(np.float32(0.4))])
        if kind == "mask_inside_softcap":
            scores = g.op("Add", [scores, g.input("mask", FLOAT, mask_shape)])
        scores = g.op("Mul", [g.op("Tanh", [g.op("Div", [scores, cap])]), cap])
        if kind == "softcap_mask":
            scores = g.op("Add", [scores, g.input("mask", FLOAT, mask_shape)])
    elif kind == "float_and_bool":
        scores = g.op("Where", [g.input("keep", TensorProto.BOOL, mask_shape), scores, g.const(np.float32(-np.inf))])
        scores = g.op("Add", [scores, g.input("mask", FLOAT, mask_shape)])
    probs = g.op("Softmax", [scores], axis=-1)
    out = g.op("MatMul", [probs, v])
    return g.model(out, rank=4, extra_outputs=[probs] if kind == "probs_output" else ())


def folded_heads_attention(*, batch=2, heads=4, length=5, dim=16, dim_v=None, split_heads=False, bias=False,
                           mask=None, scale="mul") -> onnx.ModelProto:
    """Attention computed with the heads folded into the batch: Q, K, V [B, L, H·D] inputs reshaped to [B·H, L, D],
    Softmax(Q·Kᵀ)·V on rank-3 tensors (torch's MultiheadAttention), merged back to [B, L, H·Dv].

    split_heads: the scores are Reshaped to [B, H, L, L] before the mask and Softmax and back to [B·H, L, L] for
    P·V (DeBERTa-v2); bias: a score term computed from Q (Q·Pᵀ against constant positions, sliced) added to
    the rank-3 scores before the mask; mask: None | "causal" (a rank-2 -inf triangle added to the scores) |
    "keep" (a boolean [B, 1, 1, L] input, masked scores filled with finfo.min, needs split_heads); scale: "mul"
    (on the scores) | "keys" (Kᵀ divided by sqrt(D), as DeBERTa)."""
    dim_v = dim_v or dim
    g = GraphBuilder()

    def fold(name, d):
        x = g.input(name, FLOAT, [batch, length, heads * d])
        x = g.op("Transpose", [g.op("Reshape", [x, g.const([batch, length, heads, d], np.int64)])], perm=[0, 2, 1, 3])
        return g.op("Reshape", [x, g.const([-1, length, d], np.int64)])

    q, k, v = fold("q", dim), fold("k", dim), fold("v", dim_v)
    kt = g.op("Transpose", [k], perm=[0, 2, 1])
    if scale == "keys":
        kt = g.op("Div", [kt, g.const(np.float32(np.sqrt(dim)))])
    scores = g.op("MatMul", [q, kt])
    if scale == "mul":
        scores = g.op("Mul", [scores, g.const(np.float32(1 / np.sqrt(dim)))])
    if bias:
        positions = g.const(np.random.default_rng(1).standard_normal((length + 2, dim)).astype(np.float32) * 0.3)
        relative = g.op("MatMul", [q, g.op("Transpose", [positions], perm=[1, 0])])
        relative = g.op("Slice", [relative, *(g.const([i], np.int64) for i in (0, length, 2))])
        scores = g.op("Add", [scores, relative])
    if mask == "causal":
        triangle = np.triu(np.full((length, length), -np.inf, np.float32), 1)
        scores = g.op("Add", [scores, g.const(triangle)])
    if split_heads:
        scores = g.op("Reshape", [scores, g.const([-1, heads, length, length], np.int64)])
    if mask == "keep":
        keep = g.input("mask", TensorProto.BOOL, [batch, 1, 1, length])
        scores = g.op("Where", [keep, scores, g.const(np.float32(np.finfo(np.float32).min))])
    probs = g.op("Softmax", [scores], axis=-1)
    if split_heads:
        probs = g.op("Reshape", [probs, g.const([-1, length, length], np.int64)])
    out = g.op("MatMul", [probs, v])
    out = g.op("Reshape", [out, g.const([batch, heads, length, dim_v], np.int64)])
    out = g.op("Transpose", [out], perm=[0, 2, 1, 3])
    return g.model(g.op("Reshape", [out, g.const([batch, length, heads * dim_v], np.int64)]), rank=3)
