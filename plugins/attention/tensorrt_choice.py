"""Which attention sites to leave to TensorRT on a target GPU arch: where TensorRT's own fused attention (measured as
cuDNN's fused SDPA through torch, the fastest torch backend, in the same run as FusedAttention: benchmarks/attention.py,
attention_decode.py, attention_fp8.py) is faster, an engine with our plugin would be slower than one without it, so
the pass leaves the site unfused and says why. Rules per arch, first match wins; a rule's length bounds need static
lengths (a dynamic length never satisfies one), so sites of dynamic shapes take the class rules at the end.
"""
from __future__ import annotations

from dataclasses import dataclass

from trt_fusedattn.plugins.tensorrt_choice import Choice, table_arch

OP = "attention"  # what the report says TensorRT's own fusion runs instead
# FP8 precisions: "fp8" from the model's Q/DQ pairs (without the plugin TensorRT runs its own FP8 attention:
# compared with cuDNN's FP8 SDPA), "fp8-calibrated" from --precision fp8 (without the plugin the site stays in the
# model's float dtype: compared with the best 16-bit torch backend)
FLOAT = ("bfloat16", "float16", "float32")
ROWS_FULL = 2 ** 17  # batch x query heads x L_q of the benchmark grid (16k tokens) and Whisper; SD self has 2 ** 16

_H100 = "H100, 2026-11-24"
_GRID = "benchmarks/results/attention_h100_v7.md (hd64), attention_h100_v4_final.md (hd128/256)"
_V12 = "attention_h100_v12.md, attention_h100_v11_candidates.md"
RULES = {
    "sm_90": [
        dict(precision=FLOAT + ("fp8", "fp8-calibrated"), masked=True, choice="fused",
             evidence=f"a mask or key lengths: 1.73x cuDNN on BERT-base padded 32x512 (hd64), 1.29x on decode 1 query "
                      f"x 4k keys x batch 32 with key lengths (hd128), cuDNN given the mask ({_H100}, "
                      "attention_h100_deployment_v5_2.md)"),
        dict(precision=FLOAT, chunked=True, choice="fused",
             evidence=f"bottom-right causal with fewer queries than keys: chunked prefill 512 after 3584 keys 2.06x "
                      f"cuDNN ({_H100}, attention_h100_deployment_v5_2.md)"),
        dict(precision=FLOAT, softcap=True, choice="fused",
             evidence="soft-capped scores: cuDNN's SDPA has no softcap, so TensorRT runs the unfused graph "
                      "(not timed)"),
        dict(precision=FLOAT, min_len_q=2, max_len_q=16, choice="fused",
             evidence=f"decode, 4-16 queries: 2.5-14.6x cuDNN over 1k-128k keys ({_H100}, "
                      "attention_h100_decode_v5.md)"),
        dict(precision=FLOAT, max_len_q=1, min_len_kv=1024, choice="tensorrt",
             evidence=f"decode, 1 query: 0.74-1.02x cuDNN over 1k-128k keys, below 1.0x at 1k/4k keys x batch 1 and "
                      f"32k/128k keys x batch 4 ({_H100}, attention_h100_decode_v5.md)"),
        dict(precision=FLOAT, max_head_dim=64, max_len_kv=256, choice="fused",
             evidence=f"head dim 64, <= 256 keys: ViT-L/16 (197) 1.01x cuDNN, SD cross-attention (77) 1.25x ({_H100}, "
                      "attention_h100_deployment_v5_2.md)"),
        dict(precision=FLOAT, max_head_dim=64, causal=False, min_len=1500, max_len=2047, min_rows=ROWS_FULL,
             choice="fused",
             evidence=f"head dim 64 non-causal, 1500-2047 rows: Whisper encoder 8x1500 x 20 heads 1.10-1.11x cuDNN in "
                      f"two runs ({_H100}, attention_h100_deployment_v5_2.md, "
                      "attention_h100_deployment_v8c_candidates.md)"),
        dict(precision=FLOAT, max_head_dim=64, causal=False, min_len=4096, min_rows=ROWS_FULL, choice="fused",
             evidence=f"head dim 64 non-causal from 4k: 1.02-1.11x cuDNN (bfloat16 and float16, two runs) ({_H100}, "
                      f"{_GRID}, attention_h100_v8c_candidates.md)"),
        dict(precision=FLOAT, max_head_dim=128, causal=False, min_len=4096, min_rows=ROWS_FULL, choice="fused",
             evidence=f"head dim 128 non-causal from 4k: 0.99-1.08x cuDNN, 11 of 12 points >= 1.00x (v12: three MMA "
                      f"warpgroups, the serial step; bfloat16 and float16, two runs) ({_H100}, {_V12})"),
        dict(precision=FLOAT, max_head_dim=64, causal=True, min_len=8192, min_rows=ROWS_FULL, choice="fused",
             evidence=f"causal from 8k, head dim 64: 1.01-1.06x cuDNN ({_H100}, {_GRID}, "
                      "attention_h100_v11_candidates.md)"),
        dict(precision=FLOAT, causal=True, min_len=16384, min_rows=ROWS_FULL, choice="fused",
             evidence=f"causal from 16k, head dim 128: 1.04-1.10x cuDNN, 256: 1.08-1.11x (bfloat16 and float16, two "
                      f"runs) ({_H100}, {_V12})"),
        dict(precision=("fp8",), max_head_dim=64, min_len=8192, min_rows=ROWS_FULL, choice="fused",
             evidence=f"FP8 head dim 64 from 8k: 1.07/1.09x cuDNN's FP8 SDPA non-causal, 1.05/1.03x causal ({_H100}, "
                      "attention_fp8_h100_v9.md; the same kernel 1.09/1.02x, 1.07/1.04x in attention_fp8_h100_v11.md, "
                      "1.07/1.04x, 1.06/1.04x and 1.07/1.03x, 1.04/1.05x in attention_fp8_h100_v12*_candidates.md of "
                      "2026-11-25; H200 1.06/1.08x, 1.06/1.03x in attention_fp8_h200_v11_candidates.md)"),
        dict(precision=("fp8",), choice="tensorrt",
             evidence=f"FP8 Q/DQ: 0.91-1.01x cuDNN's FP8 SDPA at head dim 64 below 8k, 0.67-0.91x at 128, 0.70-0.99x "
                      f"at 256 ({_H100}, attention_fp8_h100_v9.md, attention_fp8_h100_v10.md, and session 8's v10 "
                      f"kernel in attention_fp8_h100_v11*.md); 2026-11-25: hd64 below 8k 0.92-1.00x, hd128 0.76-0.95x, "
                      f"hd256 0.78-1.04x with its new default (attention_fp8_h100_v12*.md); session 10: hd128 0.79-0.90x "
                      f"non-causal, causal 0.88/0.80/0.88/0.98x at 2k-16k on its new 256-key tiles, hd256 0.73-1.03x "
                      f"(attention_fp8_h100_v13_candidates.md); the landing run 0.79-0.89x, 0.82-0.95x, 0.68-1.02x "
                      f"(attention_fp8_h100_v13.md)"),
        dict(precision=("fp8-calibrated",), causal=False, min_len=4096, min_rows=ROWS_FULL, choice="fused",
             evidence=f"FP8 (calibrated) non-causal from 4k: 1.13-1.32x the fastest 16-bit torch backend, which the "
                      f"site would run unfused ({_H100}, attention_fp8_h100_v7.md, attention_fp8_h100_v4.md)"),
        dict(precision=("fp8-calibrated",), causal=True, min_len=8192, min_rows=ROWS_FULL, choice="fused",
             evidence=f"FP8 (calibrated) causal from 8k: 1.12-1.33x the fastest 16-bit torch backend, which the site "
                      f"would run unfused ({_H100}, attention_fp8_h100_v7.md, attention_fp8_h100_v4.md)"),
        dict(precision=("fp8-calibrated",), choice="tensorrt",
             evidence=f"FP8 (calibrated) at shorter or unknown lengths: 0.84-1.01x the fastest 16-bit torch backend "
                      f"at 2k-4k ({_H100}, attention_fp8_h100_v7.md, attention_fp8_h100_v4.md)"),
        dict(precision=FLOAT, max_head_dim=64, choice="tensorrt",
             evidence=f"head dim 64 here (causal below 8k, non-causal 2k-4k, short or unknown lengths, few rows): "
                      f"causal 0.81-0.92x cuDNN at 2k-4k, non-causal 0.89-1.02x at 2k over two runs, 0.83-0.88x at "
                      f"512-1k, SD self-attention 2x4096 x 8 heads 0.96-0.99x ({_H100}, {_GRID}, "
                      "attention_h100_v8c_candidates.md, attention_h100_grid.md, attention_h100_deployment_v5_2.md)"),
        dict(precision=FLOAT, max_head_dim=128, choice="tensorrt",
             evidence=f"head dim 128 here (non-causal below 4k, causal below 16k, short or unknown lengths): "
                      f"0.81-0.96x cuDNN at 2k non-causal, 0.76-0.95x causal 2k-8k, 0.58-0.79x at 512-1k (older tree), "
                      f"Llama-3-8B prefill 0.99x/0.85x ({_H100}, {_V12}, attention_h100_deployment_v12.md, "
                      "attention_h100_grid.md)"),
        dict(precision=FLOAT, choice="tensorrt",
             evidence=f"head dim above 128 here (non-causal, causal below 16k, short or unknown lengths): "
                      f"0.72-0.99x cuDNN non-causal at 2k-16k but one float16 4k point (1.04x), 0.80-1.01x causal "
                      f"2k-8k, 0.70-0.74x at 512-1k (older tree) ({_H100}, {_V12}, attention_h100_grid.md)"),
    ],
}


@dataclass(frozen=True)
class AttentionShape:
    """What the rewrite knows statically about one attention site: the precision the plugin would run (a FLOAT
    dtype name, "fp8" or "fp8-calibrated"), the larger of the Q/K and V head dims, causal, the sequence lengths and
    batch x query heads x L_q (``rows``) where static (None where dynamic), and the features cuDNN handles worse: a
    mask or key lengths, bottom-right causal with fewer queries than keys (chunked prefill), a softcap."""

    precision: str
    head_dim: int | None
    causal: bool = False
    len_q: int | None = None
    len_kv: int | None = None
    rows: int | None = None
    masked: bool = False
    chunked: bool = False
    softcap: bool = False


def choose(shape: AttentionShape, target: str) -> Choice | None:
    """Fuse or leave to TensorRT, for ``shape`` on ``target``; None when the arch has no evidence at all."""
    arch = table_arch(target)
    for rule in RULES.get(arch, ()):
        if _matches(rule, shape):
            return Choice(arch, rule["choice"] == "tensorrt", rule["evidence"], OP)
    return None if arch not in RULES else Choice(arch, False, "no rule covers this site: fused", OP)


def _at_least(value: int | None, bound: int | None) -> bool:
    return bound is None or value is not None and value >= bound


def _at_most(value: int | None, bound: int | None) -> bool:
    return bound is None or value is not None and value <= bound


def _matches(rule: dict, shape: AttentionShape) -> bool:
    if shape.precision not in rule["precision"]:
        return False
    if any(key in rule and rule[key] != getattr(shape, key) for key in ("causal", "masked", "chunked", "softcap")):
        return False
    static = shape.len_q is not None and shape.len_kv is not None
    shortest, longest = (min(shape.len_q, shape.len_kv), max(shape.len_q, shape.len_kv)) if static else (None, None)
    return (_at_most(shape.head_dim, rule.get("max_head_dim")) and _at_least(shortest, rule.get("min_len"))
            and _at_most(longest, rule.get("max_len"))
            and _at_least(shape.len_q, rule.get("min_len_q")) and _at_most(shape.len_q, rule.get("max_len_q"))
            and _at_least(shape.len_kv, rule.get("min_len_kv")) and _at_most(shape.len_kv, rule.get("max_len_kv"))
            and _at_least(shape.rows, rule.get("min_rows")))
