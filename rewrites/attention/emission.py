"""Replacement: the FusedAttention node in the layout needing the fewest new Transposes (BSHD on a tie: it
absorbs the head split/merge), its one mask input (several combined, shared by all layers), FP8 Q/K/V through
QuantizeLinear when the site has FP8 scales, and the output routed back to the original readers."""
from __future__ import annotations

from dataclasses import replace as replace_fields

import ml_dtypes
import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from trt_fusedattn.fp8 import NUMPY_NAME, qk_rotation
from trt_fusedattn.fp8 import numpy_dtype as numpy_dtype_named
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, output_dtype_name
from trt_fusedattn.rewrites._graph import numpy_dtype, unique_name
from trt_fusedattn.rewrites.attention.fp8 import Fp8Scales, describe, fp8_attributes
from trt_fusedattn.rewrites.attention.match import (FOLDED_KEY_TRANSPOSE, HEAD_SPLIT, KEY_TRANSPOSE, FilledMask, Match,
                                                    Operand, Output, Shared)


class _Emitter:
    """Adds the new nodes of one site, with names derived from the anchor's."""

    def __init__(self, graph: gs.Graph, base: str, shared: Shared):
        self.graph, self.base, self.shared, self.taken = graph, base, shared, shared.taken

    def shared_node(self, op: str, inputs: list, what: str, dtype=None, attrs=None) -> gs.Tensor:
        """A node every site with the same inputs reuses (the mask conversions of each layer)."""
        key = (op, tuple(id(t) for t in inputs), tuple(sorted((attrs or {}).items())))
        if key not in self.shared.nodes:
            self.shared.nodes[key] = self.node(op, inputs, what, dtype, attrs)
        return self.shared.nodes[key]

    def tensor(self, what: str, dtype=None) -> gs.Variable:
        return gs.Variable(unique_name(f"{self.base}/{what}", self.taken), dtype=dtype)

    def node(self, op: str, inputs: list, what: str, dtype=None, attrs=None, outputs=None) -> gs.Tensor:
        outputs = outputs or [self.tensor(what, dtype)]
        self.graph.nodes.append(gs.Node(op=op, name=unique_name(f"{self.base}/{what}", self.taken),
                                        attrs=attrs or {}, inputs=inputs, outputs=outputs))
        return outputs[0]

    def transpose(self, tensor: gs.Tensor, perm: tuple, what: str) -> gs.Tensor:
        return self.node("Transpose", [tensor], what, numpy_dtype(tensor), {"perm": list(perm)})

    def quantize(self, tensor: gs.Tensor, scale: float, what: str) -> gs.Tensor:
        """QuantizeLinear of ``tensor`` to e4m3 with ``scale`` (a constant in the tensor's dtype, as opset 19 wants)."""
        scale = gs.Constant(unique_name(f"{self.base}/{what}_scale", self.taken),
                            np.array(scale, numpy_dtype(tensor) or np.float32))
        zero = gs.Constant(unique_name(f"{self.base}/{what}_zero_point", self.taken),
                           np.zeros((), ml_dtypes.float8_e4m3fn))
        return self.node("QuantizeLinear", [tensor, scale, zero], f"{what}_e4m3", np.dtype(ml_dtypes.float8_e4m3fn))

    def rotate(self, tensor: gs.Tensor, dim: int, what: str) -> gs.Tensor:
        """``tensor`` (head dim last) times ``fp8.qk_rotation(dim)``'s matrix, a constant in the tensor's dtype."""
        matrix = gs.Constant(unique_name(f"{self.base}/{what}_rotation", self.taken),
                             qk_rotation(dim)[0].astype(numpy_dtype(tensor)))
        return self.node("MatMul", [tensor, matrix], f"{what}_rotated", numpy_dtype(tensor))

    def constant(self, what: str, values) -> gs.Constant:
        return gs.Constant(unique_name(f"{self.base}/{what}", self.taken), np.array(values, np.int64))

    def unfold(self, tensor: gs.Tensor, heads: int, what: str) -> gs.Tensor:
        """[B*H, S, X] -> [B, H, S, X] (heads folded into the batch split off), once per tensor for all sites."""
        key = ("unfold", id(tensor), heads)
        if key not in self.shared.nodes:
            dims = self.node("Slice", [self.node("Shape", [tensor], f"{what}_shape", np.dtype(np.int64)),
                                       self.constant("one", [1]), self.constant("three", [3])],
                             f"{what}_dims", np.dtype(np.int64))
            shape = self.node("Concat", [self.constant(f"{what}_heads", [-1, heads]), dims], f"{what}_unfolded_shape",
                              np.dtype(np.int64), {"axis": 0})
            self.shared.nodes[key] = self.node("Reshape", [tensor, shape], f"{what}_unfolded", numpy_dtype(tensor))
        return self.shared.nodes[key]

    def fold(self, tensor: gs.Tensor, out: gs.Tensor) -> None:
        """Write ``out`` = [B, H, S, X] ``tensor`` reshaped to [B*H, S, X]."""
        dims = self.node("Slice", [self.node("Shape", [tensor], "O_shape", np.dtype(np.int64)),
                                   self.constant("two", [2]), self.constant("four", [4])], "O_dims", np.dtype(np.int64))
        shape = self.node("Concat", [self.constant("batch_heads", [-1]), dims], "O_folded_shape", np.dtype(np.int64),
                          {"axis": 0})
        self.node("Reshape", [tensor, shape], "O_fold", outputs=[out])

    def operand(self, op: Operand, layout: str, what: str) -> gs.Tensor:
        if op.folded is not None:
            return self.unfold(op.folded, op.heads, what)
        if op.folded_kt is not None:
            return self.unfold(self.transpose(op.folded_kt, FOLDED_KEY_TRANSPOSE, f"{what}_folded"), op.heads, what)
        if getattr(op, layout.lower()) is not None:
            return getattr(op, layout.lower())
        if op.flat is not None:
            shape = gs.Constant(unique_name(f"{self.base}/{what}_heads", self.taken),
                                np.array([0, 0, op.heads, -1], np.int64))
            return self.node("Reshape", [op.flat, shape], f"{what}_bshd", numpy_dtype(op.flat))
        if op.kt is not None:
            perm = KEY_TRANSPOSE if layout == "BHSD" else (0, 3, 1, 2)
            return self.transpose(op.kt, perm, f"{what}_{layout.lower()}")
        return self.transpose(op.any(), HEAD_SPLIT, f"{what}_{layout.lower()}")


def _layout(match: Match) -> str:
    """The layout needing the fewest new Transposes (BSHD on a tie: it absorbs the head split/merge)."""
    if match.out.flat is not None:
        return "BSHD"
    if match.out.folded is not None:
        return "BHSD"
    costs = {layout: sum(op.cost(layout) for op in (match.q, match.k, match.v)) + match.out.cost(layout)
             for layout in ("BSHD", "BHSD")}
    return min(("BSHD", "BHSD"), key=lambda layout: costs[layout])


def _mask_input(match: Match, emit: _Emitter, qtype) -> tuple[gs.Tensor | None, str]:
    """The one mask tensor to pass (combining several), and its kind for the report."""
    keep, heads = None, match.folded_heads
    keep_masks, float_masks = list(match.keep_masks), list(match.float_masks)
    for mask in match.folded_masks:  # [B*H, L_q, L_kv] terms of folded scores, split to [B, H, L_q, L_kv]
        if isinstance(mask, FilledMask):
            float_masks.append(FilledMask(emit.unfold(mask.keep, heads, "keep"), mask.negate, mask.fill))
        elif isinstance(mask, tuple):
            keep_masks.append((emit.unfold(mask[0], heads, "keep"), mask[1]))
        else:
            float_masks.append(emit.unfold(mask, heads, "bias"))
    float_masks = [_additive(m, emit, qtype) if isinstance(m, FilledMask) else m for m in float_masks]
    if keep_masks:
        parts = [emit.shared_node("Not", [t], "keep", np.dtype(bool)) if negate else t for t, negate in keep_masks]
        keep = parts[0]
        for part in parts[1:]:
            keep = emit.shared_node("And", [keep, part], "keep", np.dtype(bool))
        if not float_masks:
            return keep, "bool"
    if not float_masks:
        return None, "none"
    masks = [mask if qtype is None or numpy_dtype(mask) in (None, qtype) else
             emit.shared_node("Cast", [mask], "mask_cast", qtype, {"to": helper.np_dtype_to_tensor_dtype(qtype)})
             for mask in float_masks]
    if keep is not None:  # both kinds: the boolean one in additive form (-inf where masked)
        masks.append(_additive(FilledMask(keep, False, -np.inf), emit, qtype, "keep_additive"))
    mask = masks[0]
    for part in masks[1:]:
        mask = emit.shared_node("Add", [mask, part], "mask", qtype or numpy_dtype(mask))
    return mask, "float"


def _additive(mask: FilledMask, emit: _Emitter, qtype, what: str = "filled_mask") -> gs.Tensor:
    """Where(keep, 0, fill) in Q's dtype (fill where ``keep`` is False, or True when ``negate``), once for all
    layers."""
    key = ("additive", id(mask.keep), mask.negate, mask.fill, qtype.str)
    if key not in emit.shared.nodes:
        zero, fill = (gs.Constant(unique_name(f"{emit.base}/{what}", emit.taken), np.array(value, qtype))
                      for what, value in (("zero", 0.0), ("fill", mask.fill)))
        emit.shared.nodes[key] = emit.node("Where", [mask.keep, *((fill, zero) if mask.negate else (zero, fill))],
                                           what, qtype)
    return emit.shared.nodes[key]


def _route_output(out: Output, layout: str, emit: _Emitter, qtype) -> gs.Tensor:
    """The tensor the fused node writes (in ``layout`` and ``qtype``), wired to the original output's readers
    through the head merge or a Transpose, and a Cast right after the node where the readers take another dtype
    (fp16 exports that compute P·V in fp32; FP8 nodes of float32 models, which write float16)."""
    out.producer.outputs.clear()
    readers_see = next(t for t in (out.flat, out.folded, out.bhsd) if t is not None)
    wanted = numpy_dtype(readers_see)
    if qtype is None or wanted in (None, qtype):
        return _route(out, layout, emit, qtype, readers_see)
    routed = _route(out, layout, emit, wanted, readers_see)
    fused_out = emit.tensor("O", qtype)
    emit.node("Cast", [fused_out], "O_cast", outputs=[routed], attrs={"to": helper.np_dtype_to_tensor_dtype(wanted)})
    return fused_out


def _route(out: Output, layout: str, emit: _Emitter, qtype, readers_see: gs.Tensor) -> gs.Tensor:
    """The tensor in ``layout`` and ``qtype`` whose head merge or Transpose gives ``readers_see``."""
    if out.folded is not None:
        result = emit.tensor("O_bhsd", qtype)
        emit.fold(result, readers_see)
        return result
    if out.flat is not None:
        result = emit.tensor("O_bshd", qtype)
        shape = gs.Constant(unique_name(f"{emit.base}/merge_heads", emit.taken), np.array([0, 0, -1], np.int64))
        emit.node("Reshape", [result, shape], "O_merge", outputs=[readers_see])
        return result
    if layout == "BHSD":
        return readers_see
    if out.bshd is not None and readers_see is out.bhsd:
        result = out.bshd
        for merge in out.merges:
            merged = merge.outputs[0]
            _detach(merge)
            if merged is not result:
                emit.node("Identity", [result], "O_alias", outputs=[merged])
        for reshape in out.bypassed:
            _detach(reshape)
        if out.shape_readers:  # Shape of the BHSD output: the BSHD output's, permuted
            bhsd_shape = emit.node("Gather", [emit.node("Shape", [result], "O_shape", np.dtype(np.int64)),
                                              gs.Constant(unique_name(f"{emit.base}/bhsd_axes", emit.taken),
                                                          np.array(HEAD_SPLIT, np.int64))],
                                   "O_bhsd_shape", np.dtype(np.int64), {"axis": 0})
            for reader in out.shape_readers:
                _reroute_shape(reader, bhsd_shape, emit)
        return result
    result = emit.tensor("O_bshd", qtype)
    emit.node("Transpose", [result], "O_bhsd", attrs={"perm": list(HEAD_SPLIT)}, outputs=[readers_see])
    return result


def _detach(node: gs.Node) -> None:
    """Cut a node the fused node replaces out of the graph (the driver's cleanup then drops it)."""
    node.inputs.clear()
    node.outputs.clear()


def _reroute_shape(reader: gs.Node, shape: gs.Tensor, emit: _Emitter) -> None:
    """Make ``reader``'s output (Shape of the old BHSD output, maybe sliced by start/end) come from ``shape``."""
    out = reader.outputs[0]
    start, end = reader.attrs.get("start"), reader.attrs.get("end")
    _detach(reader)
    if start is None and end is None:
        emit.node("Identity", [shape], "O_shape_alias", outputs=[out])
        return
    bounds = [gs.Constant(unique_name(f"{emit.base}/shape_{what}", emit.taken), np.array([value], np.int64))
              for what, value in (("start", start or 0), ("end", 4 if end is None else end))]
    emit.node("Slice", [shape, *bounds], "O_shape_slice", outputs=[out])


def replace(match: Match, graph: gs.Graph, shared: Shared, fp8: Fp8Scales | None = None) -> gs.Node:
    """Emit the FusedAttention node and route the output to the original readers. ``fp8``: Q, K, V quantized to
    e4m3 by QuantizeLinear nodes with these scales (in Q's dtype, as QuantizeLinear takes them) before the node,
    which writes float16 (bfloat16 for bfloat16 models; a Cast back for float32 readers)."""
    base = match.anchor.name or "attention"
    emit, taken = _Emitter(graph, f"{base}/fused", shared), shared.taken
    layout = _layout(match)
    qtype = numpy_dtype(match.q.any())
    fp8_attrs = {}
    if fp8 is not None:  # the scales as QuantizeLinear holds them: in Q's dtype
        fp8 = replace_fields(fp8, **{k: float(np.asarray(getattr(fp8, k), qtype)) for k in ("q", "k", "v")})
        fp8_attrs = fp8_attributes(fp8, qtype)
        qtype = numpy_dtype_named(output_dtype_name(NUMPY_NAME, fp8_attrs))
    mask, kind = _mask_input(match, emit, qtype)
    inputs = [emit.operand(match.q, layout, "Q"), emit.operand(match.k, layout, "K"),
              emit.operand(match.v, layout, "V")]
    scale = match.scale
    if fp8 is not None and fp8.rotation:  # (Q R)(K R)ᵀ = c Q Kᵀ: the scale divided by c gives the same scores
        inputs[:2] = [emit.rotate(t, fp8.rotation, what) for t, what in zip(inputs[:2], "QK")]
        scale = (scale or fp8.rotation ** -0.5) / qk_rotation(fp8.rotation)[1]
    if fp8 is not None:
        inputs = [emit.quantize(t, s, what) for t, s, what in zip(inputs, (fp8.q, fp8.k, fp8.v), "QKV")]
    inputs += [mask] if mask is not None else []
    if match.key_lengths is not None:  # int32 [B], after the mask slot (left empty when there is no mask)
        lengths = match.key_lengths
        if numpy_dtype(lengths) != np.dtype(np.int32):
            lengths = emit.shared_node("Cast", [lengths], "key_lengths", np.dtype(np.int32), {"to": TensorProto.INT32})
        inputs += ([] if mask is not None else [gs.Variable.empty()]) + [lengths]
    result = _route_output(match.out, layout, emit, qtype)
    attrs = {"layout": layout, "scale": scale, "causal": match.causal}
    if match.causal:
        attrs["causal_alignment"] = match.causal_alignment
    if match.softcap:
        attrs["softcap"] = match.softcap
    attrs.update(fp8_attrs)
    node = gs.Node(op=FUSED_ATTENTION.name, domain=FUSED_ATTENTION.domain,
                   name=unique_name(f"{base}/FusedAttention", taken),
                   attrs=FUSED_ATTENTION.explicit_attributes(**attrs), inputs=inputs, outputs=[result])
    graph.nodes.append(node)
    if match.key_lengths is not None:
        match.details["key_lengths"] = True
    match.details.update(layout=layout, mask=kind, scale=scale, causal=match.causal,
                         **({"causal_alignment": match.causal_alignment} if match.causal else {}),
                         **({"softcap": match.softcap} if match.softcap else {}),
                         **({"gqa_group": match.k.repeats or "from shapes"} if match.k.repeats != 1 else {}),
                         **({"fp8": describe(fp8)} if fp8 is not None else {}))
    return node
