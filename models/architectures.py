"""Real architectures from `transformers` with small configs and seeded random weights (nothing is downloaded).

Each builder takes config overrides and returns a `Sample`: the model wrapped to return plain tensors, a
function that makes fresh random inputs, and the dynamic axes the exporters should keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import transformers


@dataclass
class Sample:
    """A model ready to export: positional inputs in `input_names` order, tensors out in `output_names` order."""

    name: str
    model: torch.nn.Module
    make_inputs: Callable[[int, int, torch.Generator], tuple[torch.Tensor, ...]]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]]
    dtype: torch.dtype = torch.float32


class TensorOutputs(torch.nn.Module):
    """Calls a transformers model with named inputs and returns the chosen output fields as a tuple."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...], output_names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output_names = output_names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.input_names, inputs)))
        return tuple(out[name] for name in self.output_names)


def _randomize_affine(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Give every bias, every norm scale and the BN statistics non-trivial random values (transformers initializes
    them to 0 and 1), so that folding or dropping them is really tested."""
    with torch.no_grad():
        for module in model.modules():
            is_norm = isinstance(module, (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)) or \
                type(module).__name__.endswith("RMSNorm")
            if is_norm and getattr(module, "weight", None) is not None:
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=generator))
            if isinstance(getattr(module, "bias", None), torch.nn.Parameter):
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=generator))
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.copy_(0.2 * torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))


def _build(name: str, model_class: type, config, seed: int, dtype: torch.dtype,
           input_names: tuple[str, ...], output_names: tuple[str, ...], make_inputs, dynamic_axes) -> Sample:
    torch.manual_seed(seed)
    model = model_class(config)
    _randomize_affine(model, torch.Generator().manual_seed(seed + 1))
    model = TensorOutputs(model, input_names, output_names).eval().to(dtype)
    return Sample(name, model, make_inputs, input_names, output_names, dynamic_axes, dtype)


def _text_inputs(vocab_size: int, names: tuple[str, ...]):
    """Token ids and right-padded attention masks (every row keeps at least one token)."""

    def make(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        tensors = []
        for name in names:
            if name.endswith("input_ids"):
                tensors.append(torch.randint(0, vocab_size, (batch, seq), generator=generator))
            elif name == "position_ids":
                tensors.append(torch.arange(seq).expand(batch, seq).contiguous())
            else:
                lengths = torch.randint(1, seq + 1, (batch,), generator=generator)
                lengths[0] = seq
                tensors.append((torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64))
        return tuple(tensors)

    return make


def _text_axes(input_names, output_names, seq_dims: dict[str, str] | None = None) -> dict[str, dict[int, str]]:
    seq_dims = seq_dims or {}
    return {name: {0: "batch", 1: seq_dims.get(name, "seq")} for name in (*input_names, *output_names)}


def _image_inputs(channels: int, size: int, dtype: torch.dtype):
    def make(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, channels, size, size, generator=generator).to(dtype),)

    return make


def bert(attn_implementation: str = "sdpa", layers: int = 2, hidden: int = 32, heads: int = 2,
         intermediate: int | None = None, vocab: int = 128, max_positions: int = 128,
         dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """BertModel (bidirectional self-attention with a padding mask)."""
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate or 4 * hidden, max_position_embeddings=max_positions,
        attn_implementation=attn_implementation)
    inputs, outputs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return _build(f"bert_{attn_implementation}", transformers.BertModel, config, seed, dtype, inputs, outputs,
                  _text_inputs(vocab, inputs), _text_axes(inputs, outputs))


def gpt2(attn_implementation: str = "sdpa", layers: int = 2, hidden: int = 32, heads: int = 2,
         vocab: int = 128, max_positions: int = 128, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """GPT2Model (causal self-attention plus a padding mask, no KV cache)."""
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions,
        use_cache=False, attn_implementation=attn_implementation)
    inputs, outputs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    name = "gpt2" if attn_implementation == "sdpa" else f"gpt2_{attn_implementation}"
    return _build(name, transformers.GPT2Model, config, seed, dtype, inputs, outputs,
                  _text_inputs(vocab, inputs), _text_axes(inputs, outputs))


def llama_gqa(attn_implementation: str = "sdpa", layers: int = 2, hidden: int = 64, heads: int = 4,
              kv_heads: int = 2, intermediate: int | None = None, vocab: int = 128, max_positions: int = 128,
              dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """LlamaModel with grouped-query attention (kv_heads < heads), rotary embeddings, causal + padding mask.
    position_ids is an input: without it the dynamo exporter's optimizer fuses the rotary embedding into an ONNX
    RotaryEmbedding whose cos/sin caches have batch 1, which onnxruntime rejects for batch > 1."""
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate or 2 * hidden,
        max_position_embeddings=max_positions, use_cache=False, attn_implementation=attn_implementation)
    inputs, outputs = ("input_ids", "attention_mask", "position_ids"), ("last_hidden_state",)
    name = "llama_gqa" if attn_implementation == "sdpa" else f"llama_gqa_{attn_implementation}"
    return _build(name, transformers.LlamaModel, config, seed, dtype, inputs, outputs,
                  _text_inputs(vocab, inputs), _text_axes(inputs, outputs))


def bart(attn_implementation: str = "sdpa", layers: int = 1, hidden: int = 32, heads: int = 2,
         vocab: int = 128, max_positions: int = 128, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """BartModel: encoder self-attention, causal decoder self-attention, decoder-to-encoder cross-attention."""
    config = transformers.BartConfig(
        vocab_size=vocab, d_model=hidden, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=2 * hidden,
        decoder_ffn_dim=2 * hidden, max_position_embeddings=max_positions, use_cache=False,
        attn_implementation=attn_implementation)
    inputs = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
    outputs = ("last_hidden_state",)
    seq_dims = {"decoder_input_ids": "decoder_seq", "decoder_attention_mask": "decoder_seq",
                "last_hidden_state": "decoder_seq"}
    name = "bart" if attn_implementation == "sdpa" else f"bart_{attn_implementation}"

    encoder_decoder_text = _text_inputs(vocab, inputs)

    def make(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        ids, mask, _, _ = encoder_decoder_text(batch, seq, generator)
        _, _, dec_ids, dec_mask = encoder_decoder_text(batch, max(1, seq - 2), generator)
        return ids, mask, dec_ids, dec_mask

    return _build(name, transformers.BartModel, config, seed, dtype, inputs, outputs, make,
                  _text_axes(inputs, outputs, seq_dims))


def vit(attn_implementation: str = "sdpa", layers: int = 2, hidden: int = 32, heads: int = 2,
        image_size: int = 32, patch_size: int = 8, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """ViTModel (patch-embedding Conv, then bidirectional self-attention without a mask)."""
    config = transformers.ViTConfig(
        image_size=image_size, patch_size=patch_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden, attn_implementation=attn_implementation)
    outputs = ("last_hidden_state",)
    name = "vit" if attn_implementation == "sdpa" else f"vit_{attn_implementation}"
    return _build(name, transformers.ViTModel, config, seed, dtype, ("pixel_values",), outputs,
                  _image_inputs(3, image_size, dtype), {"pixel_values": {0: "batch"}, outputs[0]: {0: "batch"}})


def resnet(depths: tuple[int, ...] = (1, 1, 1, 1), hidden_sizes: tuple[int, ...] = (32, 64, 128, 256),
           embedding_size: int = 16, image_size: int = 64, dtype: torch.dtype = torch.float32,
           seed: int = 0) -> Sample:
    """ResNetModel with bottleneck blocks (ResNet-50 is depths (3, 4, 6, 3), ResNet-152 (3, 8, 36, 3),
    hidden_sizes (256, 512, 1024, 2048), embedding_size 64, image_size 224)."""
    config = transformers.ResNetConfig(
        embedding_size=embedding_size, hidden_sizes=list(hidden_sizes), depths=list(depths),
        layer_type="bottleneck")
    outputs = ("last_hidden_state", "pooler_output")
    axes = {name: {0: "batch"} for name in ("pixel_values", *outputs)}
    return _build("resnet", transformers.ResNetModel, config, seed, dtype, ("pixel_values",), outputs,
                  _image_inputs(3, image_size, dtype), axes)


def mobilenetv2(depth_multiplier: float = 0.25, image_size: int = 64, finegrained_output: bool = False,
                tf_padding: bool = True, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """MobileNetV2Model: inverted residuals (1x1 expand, depthwise 3x3, 1x1 project), BN, ReLU6 as Clip."""
    config = transformers.MobileNetV2Config(
        image_size=image_size, depth_multiplier=depth_multiplier, finegrained_output=finegrained_output,
        tf_padding=tf_padding)
    outputs = ("last_hidden_state", "pooler_output")
    axes = {name: {0: "batch"} for name in ("pixel_values", *outputs)}
    return _build("mobilenetv2", transformers.MobileNetV2Model, config, seed, dtype, ("pixel_values",), outputs,
                  _image_inputs(3, image_size, dtype), axes)


def deberta_v2(layers: int = 2, hidden: int = 32, heads: int = 2, vocab: int = 128, max_positions: int = 128,
               dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """DebertaV2Model: disentangled attention, with the heads folded into the batch ([B*H, L, L] scores) and
    content-to-position and position-to-content terms added to the scores before the mask."""
    config = transformers.DebertaV2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=2 * hidden, max_position_embeddings=max_positions, relative_attention=True,
        pos_att_type=["p2c", "c2p"], max_relative_positions=max_positions, position_biased_input=False)
    inputs, outputs = ("input_ids", "attention_mask"), ("last_hidden_state",)
    return _build("deberta_v2", transformers.DebertaV2Model, config, seed, dtype, inputs, outputs,
                  _text_inputs(vocab, inputs), _text_axes(inputs, outputs))


def gemma2(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 128,
           max_positions: int = 128, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """Gemma2Model: logit softcapping (cap * tanh(s / cap) before the mask), a query scale that is not
    1/sqrt(D) (query_pre_attn_scalar), GQA, alternating sliding-window and global layers. Eager attention: the
    softcap exists only there."""
    config = transformers.Gemma2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=max_positions, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
        final_logit_softcapping=None, sliding_window=4, use_cache=False, attn_implementation="eager")
    inputs, outputs = ("input_ids", "attention_mask", "position_ids"), ("last_hidden_state",)
    return _build("gemma2", transformers.Gemma2Model, config, seed, dtype, inputs, outputs,
                  _text_inputs(vocab, inputs), _text_axes(inputs, outputs))


def mixtral(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, experts: int = 4,
            vocab: int = 128, max_positions: int = 128, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """MixtralModel: mixture-of-experts layers whose routers are Softmaxes that are not attention, beside causal
    GQA self-attention."""
    config = transformers.MixtralConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, num_local_experts=experts, num_experts_per_tok=2,
        max_position_embeddings=max_positions, use_cache=False, attn_implementation="eager",
        experts_implementation="batched_mm")  # every expert on every token, then the routed ones kept: traceable
    inputs, outputs = ("input_ids", "attention_mask", "position_ids"), ("last_hidden_state",)
    return _build("mixtral", transformers.MixtralModel, config, seed, dtype, inputs, outputs,
                  _text_inputs(vocab, inputs), _text_axes(inputs, outputs))


def levit(image_size: int = 64, hidden_sizes: tuple[int, ...] = (24, 32, 48), heads: tuple[int, ...] = (2, 3, 4),
          key_dim: tuple[int, ...] = (8, 8, 8), dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """LevitModel: a conv+BN stem, then attention whose value head dim (attention_ratio * key_dim) differs from
    the query/key head dim, with a learned position bias added to the scores, and subsampling attention."""
    config = transformers.LevitConfig(
        image_size=image_size, hidden_sizes=list(hidden_sizes), num_attention_heads=list(heads), depths=[1, 1, 1],
        key_dim=list(key_dim), attention_ratio=[2, 2, 2], mlp_ratio=[2, 2, 2],
        down_ops=[["Subsample", key_dim[0], hidden_sizes[0] // key_dim[0], 4, 2, 2],
                  ["Subsample", key_dim[0], hidden_sizes[1] // key_dim[0], 4, 2, 2]])
    outputs = ("last_hidden_state",)
    axes = {name: {0: "batch"} for name in ("pixel_values", *outputs)}
    return _build("levit", transformers.LevitModel, config, seed, dtype, ("pixel_values",), outputs,
                  _image_inputs(3, image_size, dtype), axes)


class _ResBlock(torch.nn.Module):
    """A diffusion UNet's residual block: GroupNorm, SiLU, 3x3 conv, twice, plus the input (1x1 conv when the
    channel count changes)."""

    def __init__(self, channels: int, out_channels: int, groups: int):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.GroupNorm(groups, channels), torch.nn.GroupNorm(groups, out_channels)
        self.conv1 = torch.nn.Conv2d(channels, out_channels, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = torch.nn.Conv2d(channels, out_channels, 1) if channels != out_channels else torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(torch.nn.functional.silu(self.norm1(x)))
        return self.conv2(torch.nn.functional.silu(self.norm2(h))) + self.shortcut(x)


class _SpatialAttention(torch.nn.Module):
    """Self-attention over the pixels of a feature map, heads of ``head_dim`` (Stable Diffusion 1.5: 40/80/160)."""

    def __init__(self, channels: int, head_dim: int, groups: int):
        super().__init__()
        self.norm, self.heads = torch.nn.GroupNorm(groups, channels), channels // head_dim
        self.qkv, self.out = torch.nn.Linear(channels, 3 * channels), torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.qkv(tokens).chunk(3, dim=-1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return x + self.out(o).transpose(1, 2).reshape(b, c, h, w)


class _TinyUNet(torch.nn.Module):
    """conv_in, a residual block, a stride-2 downsample, a residual block with attention, nearest upsample, the
    skip concatenated, a residual block with a 1x1 shortcut, conv_out."""

    def __init__(self, channels: int, head_dim: int, groups: int):
        super().__init__()
        c = channels
        self.conv_in, self.down_block = torch.nn.Conv2d(4, c, 3, padding=1), _ResBlock(c, c, groups)
        self.down = torch.nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.mid_block, self.attention = _ResBlock(c, 2 * c, groups), _SpatialAttention(2 * c, head_dim, groups)
        self.up = torch.nn.Conv2d(2 * c, c, 3, padding=1)
        self.up_block, self.conv_out = _ResBlock(2 * c, c, groups), torch.nn.Conv2d(c, 4, 3, padding=1)

    def forward(self, sample: torch.Tensor) -> dict[str, torch.Tensor]:
        skip = self.down_block(self.conv_in(sample))
        h = self.attention(self.mid_block(self.down(skip)))
        h = self.up(torch.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest"))
        return {"out_sample": self.conv_out(self.up_block(torch.cat([h, skip], dim=1)))}


def unet(channels: int = 20, head_dim: int = 40, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """A tiny diffusion UNet (plain torch: the diffusers package is not a dependency): residual blocks whose adds
    FusedConv absorbs, spatial attention with Stable Diffusion's head dim 40, dynamic height and width."""
    torch.manual_seed(seed)
    model = _TinyUNet(channels, head_dim, groups=4)
    _randomize_affine(model, torch.Generator().manual_seed(seed + 1))
    model = TensorOutputs(model, ("sample",), ("out_sample",)).eval().to(dtype)

    def make(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        side = 2 * max(2, seq)  # even: the downsample and the upsample meet again
        return (torch.randn(batch, 4, side, side, generator=generator).to(dtype),)

    axes = {"sample": {0: "batch", 2: "height", 3: "width"}, "out_sample": {0: "batch", 2: "height", 3: "width"}}
    return Sample("unet", model, make, ("sample",), ("out_sample",), axes, dtype)


def whisper_encoder(layers: int = 2, hidden: int = 32, heads: int = 2, mel_bins: int = 8,
                    max_source_positions: int = 16, dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """WhisperEncoder (speech): two Conv1d + GELU over log-mel frames (the second stride 2), then bidirectional
    self-attention without a mask. Whisper requires exactly 2 * max_source_positions frames, so only the batch
    is dynamic."""
    config = transformers.WhisperConfig(
        d_model=hidden, encoder_layers=layers, encoder_attention_heads=heads, encoder_ffn_dim=2 * hidden,
        num_mel_bins=mel_bins, max_source_positions=max_source_positions, attn_implementation="sdpa")
    outputs = ("last_hidden_state",)

    def make(batch: int, seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, mel_bins, 2 * max_source_positions, generator=generator).to(dtype),)

    axes = {name: {0: "batch"} for name in ("input_features", *outputs)}
    return _build("whisper_encoder", transformers.models.whisper.modeling_whisper.WhisperEncoder, config, seed,
                  dtype, ("input_features",), outputs, make, axes)


class _WithoutFastPath(torch.nn.Module):
    """Runs a torch.nn transformer module off its inference fast path (aten::_transformer_encoder_layer_fwd,
    aten::_native_multi_head_attention), which neither ONNX exporter supports, and returns its output as a tuple."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor]:
        enabled = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            return (self.model(*inputs),)
        finally:
            torch.backends.mha.set_fastpath_enabled(enabled)


def torch_transformer(layers: int = 2, hidden: int = 32, heads: int = 2, batch: int = 2, seq: int = 8,
                      dtype: torch.dtype = torch.float32, seed: int = 0) -> Sample:
    """Plain torch.nn.TransformerEncoder (nn.TransformerEncoderLayer, batch_first), static shapes and no padding
    mask: the TorchScript export bakes the example batch and length into MultiheadAttention's Reshapes, and the
    dynamo export of src_key_padding_mask is an ONNX Attention whose [B, 1, 1, L] mask onnxruntime's CPU kernel
    rejects, so neither export with a mask or other sizes could be checked."""
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=0.0,
                                             activation="gelu", batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    _randomize_affine(model, torch.Generator().manual_seed(seed + 1))
    model = _WithoutFastPath(model).eval().to(dtype)

    def make(_batch: int, _seq: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, seq, hidden, generator=generator).to(dtype),)

    return Sample("torch_transformer", model, make, ("src",), ("last_hidden_state",), {}, dtype)
