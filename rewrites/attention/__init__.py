"""Attention family: each Softmax(scale·Q·Kᵀ + mask)·V subgraph and each ONNX ``Attention`` node becomes one
``trt_fusedattn::FusedAttention`` node.

Sites are matched by dataflow, not by names, one rule per anchor: ``softmax`` (a Softmax between Q·Kᵀ and P·V)
and ``onnx_attention`` (the opset-23 op). ``operands`` traces Q, K, V and the output (scales folded into
``scale``, Kᵀ forms and K/V head repeats undone, head split/merge Transposes absorbed); ``masks`` turns causal
triangles into ``causal`` and passes the rest; ``checks`` holds what the contract needs of the dims and dtypes;
``emission`` writes the node in the layout needing the fewest new Transposes; ``fp8`` gives a site FP8 scales (its
FP8 Q/DQ pairs', or calibrated ones) where the FP8 kernel takes it; ``choice`` leaves a site to TensorRT where its
own fused attention is faster on the target arch. A site whose checks fail is left as it was and reported with one
reason.
"""
from __future__ import annotations

from typing import Callable

import onnx_graphsurgeon as gs

from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.rewrites import CannotFuse, Site
from trt_fusedattn.rewrites._graph import is_op, names_in_use, numpy_dtype
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.checks import check, sequence_lengths
from trt_fusedattn.rewrites.attention.choice import site_choice
from trt_fusedattn.rewrites.attention.emission import replace
from trt_fusedattn.rewrites.attention.fp8 import (FP8_ARCH, Fp8Scales, calibrated_scales, fp8_attributes, plan_problem,
                                                  qdq_scales, rotated)
from trt_fusedattn.rewrites.attention.masks import classify_masks
from trt_fusedattn.rewrites.attention.match import Match, Shared
from trt_fusedattn.rewrites.attention.onnx_attention import match_onnx_attention
from trt_fusedattn.rewrites.attention.softmax import match_softmax, weights_values

FAMILY = "attention"


def _site_shapes(match: Match, shapes: TensorShapes) -> dict:
    """Shapes of Q, K, V as the match found them (a site left alone reports these)."""
    return _reported({name: op.any() for name, op in (("Q", match.q), ("K", match.k), ("V", match.v))}, shapes)


def _reported(tensors: dict, shapes: TensorShapes) -> dict:
    """The dims of each named tensor a Site shows, those known only."""
    return {name: shapes.report_recorded(t) for name, t in tensors.items() if shapes.report_recorded(t) is not None}


def _rule(anchor: gs.Node):
    return match_softmax if anchor.op == "Softmax" else match_onnx_attention


def _mask_kind(match: Match) -> str | None:
    """The kind of mask input the node will take (None, "bool" or "additive"), from the classified masks."""
    folded = [m for m in match.folded_masks if not isinstance(m, tuple)]
    if match.float_masks or folded:
        return "additive"
    return "bool" if match.keep_masks or match.folded_masks else None


def _fp8_scales(match: Match, calibrated, heads: tuple, dims: tuple, arch: str) -> Fp8Scales | None:
    """The FP8 scales the node gets: its Q/DQ pairs' (CannotFuse when they cannot all be absorbed), else the
    calibrated ones; None, with the reason in the details, when it stays in its dtype."""
    scales = qdq_scales(match.q.fp8_scale, match.k.fp8_scale, match.v.fp8_scale, match.p_scale) or calibrated
    if isinstance(scales, str):
        match.details["fp8"] = scales
        return None
    if scales is None:
        return None
    qtype = numpy_dtype(match.q.any())
    problem = "Q's dtype is not known" if qtype is None else plan_problem(
        heads, dims, _mask_kind(match), match.key_lengths is not None,
        dict(scale=match.scale, causal=match.causal, causal_alignment=match.causal_alignment, softcap=match.softcap,
             **fp8_attributes(scales, qtype)), arch)
    if not problem:
        return scales
    if scales.source == "Q/DQ":
        raise CannotFuse(f"FP8 Q/DQ not absorbed: no FP8 kernel for this site ({problem}); left to TensorRT")
    match.details["fp8"] = f"no: no FP8 kernel for this site ({problem})"
    return None


def _fuse(anchor: gs.Node, graph: gs.Graph, shared: Shared, shapes: TensorShapes, arch: str,
          calibrated=None, target: str | None = None) -> Site:
    """Match, check and replace the site ``anchor`` starts; the Site says what was done or the one reason not.
    ``calibrated``: the site's calibrated FP8 scales (or why it has none), None without calibration; ``target``:
    the GPU arch whose evidence decides between our plugin and TensorRT's own attention (None: fuse)."""
    site = Site(family=FAMILY, anchor=anchor.name, fused=False)
    try:
        match = _rule(anchor)(anchor, graph, shapes)
        site.shapes = _site_shapes(match, shapes)
        lengths = sequence_lengths(match, shapes)
        classify_masks(match, *lengths, shared, shapes)
        heads, dims = check(match, shapes)
        scales = _fp8_scales(match, calibrated, heads, dims, arch)
        choice = site_choice(match, dims, lengths, shapes, scales, target)
        if choice is not None and choice.to_tensorrt:
            site.reason, site.details = choice.reason, {"left_to": "TensorRT", "target": choice.arch}
            return site
        node = replace(match, graph, shared, scales)
    except CannotFuse as reason:
        site.reason = str(reason)
        return site
    if choice is not None:
        match.details["faster_than_tensorrt"] = f"{choice.arch}: {choice.evidence}"
    site.fused, site.op, site.node, site.details = True, FUSED_ATTENTION.qualified_name, node.name, match.details
    tensors = dict(zip(("Q", "K", "V", "mask", "key_lengths"), node.inputs), O=node.outputs[0])
    site.shapes = _reported(tensors, shapes)
    return site


def _calibrated(anchors: list, graph: gs.Graph, shapes: TensorShapes, amax: Callable, rotate: bool) -> dict:
    """Anchor name -> the calibrated FP8 scales of its site (or why none): ``amax`` of the tensors each match
    reads as Q, K and V (the fused node reads them, or a Transpose/Reshape of them: the same amax); with
    ``rotate``, of Q and K after the rotation the node's inputs get (``fp8.rotated``), where their head dim allows."""
    operands = {}  # anchor -> (Q, K, V as calibration reads them, the rotation's head dim or 0)
    for anchor in anchors:
        try:
            match = _rule(anchor)(anchor, graph, shapes)
        except CannotFuse:
            continue
        q, k = (rotated(op, shapes) if rotate else None for op in (match.q, match.k))
        rotation = q.dim if q and k and q.dim == k.dim else 0
        qk = (q, k) if rotation else (match.q.any().name, match.k.any().name)
        operands[anchor.name] = (qk + (match.v.any().name,), rotation)
    found = amax(list(dict.fromkeys(t for tensors, _ in operands.values() for t in tensors))) if operands else {}
    return {anchor: calibrated_scales(tuple(found[t] for t in tensors), rotation)
            for anchor, (tensors, rotation) in operands.items()}


def rewrite(graph: gs.Graph, arch: str | None = None, amax: Callable | None = None,
            rotate: bool = False) -> list[Site]:
    """Fuse every attention site of ``graph`` in place; one Site per ONNX Attention node and per Softmax whose
    probabilities weight values (a Softmax that does not, such as a MoE router or a classifier head, is no site).
    Sites with FP8 Q/DQ pairs become FP8 nodes (``fp8``); ``amax`` (tensor names -> their calibrated amax) makes
    every other site FP8 too where the FP8 kernel of ``arch`` (default sm_90a) takes it. A given ``arch`` is also the
    target: sites TensorRT's own fused attention runs faster there are left to it (``choice``). ``rotate``: calibrated
    sites quantize Q and K after a Hadamard rotation (``fp8.qk_rotation``; lower error on outlier channels)."""
    shared = Shared(names_in_use(graph))
    anchors = [n for n in graph.nodes if is_op(n, "Attention") or is_op(n, "Softmax") and weights_values(n)]
    if not anchors:
        return []
    shapes = TensorShapes(graph, symbolic=True)
    calibrated = _calibrated(anchors, graph, shapes, amax, rotate) if amax is not None else {}
    return [_fuse(anchor, graph, shared, shapes, arch or FP8_ARCH, calibrated.get(anchor.name), arch)
            for anchor in anchors]
