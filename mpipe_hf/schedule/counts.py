"""Closed forms in a model's sizes: the parameters, FLOPs and saved-activation bytes of a decoder layer, the LM
head and a Qwen2.5-VL vision tower on one micro-batch (``tests/test_at_scale.py`` checks them against
``torch.utils.flop_counter`` and the meta-device counts of real HF modules).

Conventions: a FLOP is one multiply or one add (a multiply-add is 2); "forward" counts the matmuls of one
micro-batch (``2 * weights * tokens`` for a linear layer plus the attention scores and their weighted sum), the
backward twice the forward (an input gradient and a weight gradient per matmul, each the forward's size;
Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
appendix), and the *weight* part of a backward the weight-gradient matmuls alone (``2 * weights * tokens``,
what a zero-bubble schedule defers; Qi et al., 2024, "Zero Bubble Pipeline Parallelism", ICLR). Norms, rotary
tables, activations, the embedding lookup and the loss's softmax are left out: memory-bound kernels whose time
the compute efficiency absorbs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shapes import TextShape, VisionShape


@dataclass(frozen=True)
class Flops:
    """FLOPs of one block on one micro-batch: ``forward``, ``backward`` (input and weight gradients) and
    ``weight``, the weight-gradient part of the backward."""

    forward: float
    backward: float
    weight: float


def decoder_layer_matmul_params(text: TextShape) -> int:
    """Weights one token multiplies by in a decoder layer: q, k, v, o projections and the gated MLP
    (``gate``, ``up``, ``down``)."""
    h, d = text.hidden, text.dim
    return 2 * h * text.heads * d + 2 * h * text.kv_heads * d + 3 * h * text.intermediate


def decoder_layer_params(text: TextShape) -> int:
    """Parameters of one decoder layer: the matmul weights, the q/k/v biases and the two RMSNorm weights."""
    bias = (text.heads + 2 * text.kv_heads) * text.dim if text.qkv_bias else 0
    return decoder_layer_matmul_params(text) + bias + 2 * text.hidden


def attention_flops(width: int, lengths: list[int], causal: bool) -> float:
    """Scores ``Q K^T`` and their weighted sum ``P V`` over sequences of ``lengths`` tokens, ``width`` the
    query heads times the head width: ``4 * width * L**2`` per sequence, half of it when ``causal`` (what a
    causal FlashAttention kernel computes; an eager, masked kernel computes all of it)."""
    return sum(4.0 * width * n * n for n in lengths) * (0.5 if causal else 1.0)


def decoder_layer_flops(text: TextShape, seq_len: int, batch: int = 1, causal: bool = True) -> Flops:
    """One decoder layer on ``batch`` sequences of ``seq_len`` tokens (causal attention over each)."""
    linear = 2.0 * decoder_layer_matmul_params(text) * seq_len * batch
    forward = linear + attention_flops(text.heads * text.dim, [seq_len] * batch, causal)
    return Flops(forward, 2 * forward, linear)


def head_params(text: TextShape) -> int:
    """The final RMSNorm and the LM head (``hidden x vocab``; counted even when tied, since pipeline stages keep
    their own copy)."""
    return text.hidden + text.hidden * text.vocab


def embedding_params(text: TextShape) -> int:
    """The token embedding, ``vocab x hidden``."""
    return text.vocab * text.hidden


def head_flops(text: TextShape, tokens: int) -> Flops:
    """The LM head's matmul over ``tokens`` tokens: ``2 * hidden * vocab`` per token forward."""
    forward = 2.0 * text.hidden * text.vocab * tokens
    return Flops(forward, 2 * forward, forward)


def vision_matmul_params(vision: VisionShape) -> tuple[int, int, int]:
    """``(patch embedding per patch, one block per patch, merger per output token)``: the weights each
    multiplies by (Conv3d kernel; qkv, proj and the gated MLP; the merger's two linear layers)."""
    w, i, unit = vision.hidden, vision.intermediate, vision.merge**2
    embed = vision.in_channels * vision.temporal_patch * vision.patch**2 * w
    block = 3 * w * w + w * w + 3 * w * i
    merger = unit * w * unit * w + unit * w * vision.out_hidden
    return embed, block, merger


def vision_params(vision: VisionShape) -> int:
    """Parameters of the tower: patch embedding (no bias), every block (two RMSNorms, qkv and proj with
    biases, the MLP with biases), the merger (RMSNorm, two linear layers with biases). The rotary table has
    no parameters."""
    w, i, unit = vision.hidden, vision.intermediate, vision.merge**2
    embed, block, merger = vision_matmul_params(vision)
    block += 2 * w + 3 * w + w + 2 * i + w
    merger += w + unit * w + vision.out_hidden
    return embed + vision.depth * block + merger


def window_lengths(vision: VisionShape, grid: tuple[int, int, int]) -> list[int]:
    """Patches in each attention window of one image of ``grid`` patches: windows of
    ``window // merge // patch`` merged tokens on a side, the last row and column of windows cut to the image,
    per frame (``transformers.vision_utils.get_vision_window_index``)."""
    frames, rows, cols = grid
    side = vision.window // vision.merge // vision.patch
    merged_rows, merged_cols = rows // vision.merge, cols // vision.merge
    out = []
    for _ in range(frames):
        for r in range(0, merged_rows, side):
            for c in range(0, merged_cols, side):
                out.append(min(side, merged_rows - r) * min(side, merged_cols - c) * vision.merge**2)
    return out


def vision_flops(vision: VisionShape, grids: list[tuple[int, int, int]]) -> Flops:
    """The tower on images of ``grids`` patches: the patch embedding, every block's matmuls and attention (full
    attention per frame in ``full_blocks``, window attention elsewhere), and the merger. The backward counts
    twice the forward and the weight part every matmul's forward once (the patch embedding's input gradient,
    which nothing needs, is counted too: an upper bound by one Conv3d)."""
    embed, block, merger = vision_matmul_params(vision)
    patches = sum(t * h * w for t, h, w in grids)
    linear = 2.0 * (patches * (embed + vision.depth * block) + patches // vision.merge**2 * merger)
    frames = [h * w for t, h, w in grids for _ in range(t)]
    windows = [n for g in grids for n in window_lengths(vision, g)]
    full = len([b for b in vision.full_blocks if b < vision.depth])
    attention = (full * attention_flops(vision.hidden, frames, False)
                 + (vision.depth - full) * attention_flops(vision.hidden, windows, False))
    forward = linear + attention
    return Flops(forward, 2 * forward, linear)


def decoder_layer_activation_bytes(text: TextShape, tokens: int, dtype_bytes: int = 2) -> float:
    """What one decoder layer saves for its backward on ``tokens`` tokens, with activations of ``dtype_bytes``
    and a fused attention kernel (FlashAttention keeps q, k, v, its output and a float32 log-sum-exp per row
    and head, not the ``L x L`` probabilities). Counted tensor by tensor from the HF ``Qwen2`` layer:

    - each RMSNorm (2): the float32 copy of its input (``pow`` and the ``rsqrt`` product), the float32
      ``rsqrt`` per token, the normalised input in ``dtype`` (the weight product) and its output (the next
      matmul's input): ``4h + 4 + 2 * b * h``;
    - attention: q (``heads * dim``), k and v (``kv_heads * dim`` each), the rotary ``cos`` and ``sin``
      (``dim`` each), the kernel's output (``o_proj``'s input), all ``b`` bytes, and the log-sum-exp;
    - the MLP: ``gate`` and ``up`` outputs, SiLU's output and the product (``down``'s input), ``4 * b * I``.

    With ``dtype_bytes = 4`` this is exactly what ``mpipe_hf.train.plan_estimate.meta_activation_bytes`` counts on the
    meta device (``tests/test_at_scale.py``; Korthikanti et al., 2022, "Reducing Activation Recomputation in
    Large Transformer Models", count the same way for GPT: ``34 * s * b * h`` with dropout masks and a 4h MLP).
    With ``dtype_bytes = 2`` it is the list under this project's bf16 policy (autocast over fp32 weights and an
    fp32 residual stream), exactly what ``meta_activation_bytes(..., bf16=True)`` counts: each norm keeps its
    fp32 input, ``rsqrt`` and normalised output (``8h + 4``) and every matmul reading that output its own bf16
    cast (three after the attention norm, two after the MLP norm); q and k are bf16 casts of fp32 rotary
    products, v and the kernel's output bf16, ``cos`` and ``sin`` fp32; the MLP as above at 2 bytes. The
    weights' bf16 copies are one per step, not per micro-batch, and are not counted here.
    """
    h, d, b = text.hidden, text.dim, dtype_bytes
    if b == 4:
        norms = 2 * (4 * h + 4 + 2 * b * h)
        attention = b * (text.heads * d + 2 * text.kv_heads * d + 2 * d + text.heads * d) + 4 * text.heads
    else:  # bf16 autocast on the fp32 residual stream: fp32 norms, a bf16 cast per matmul reading one (3 + 2)
        norms = (8 * h + 4 + 3 * b * h) + (8 * h + 4 + 2 * b * h)
        attention = b * (2 * text.heads * d + 2 * text.kv_heads * d) + 8 * d + 4 * text.heads  # fp32 cos, sin
    return float(tokens * (norms + attention + 4 * b * text.intermediate))


def head_activation_bytes(text: TextShape, tokens: int, dtype_bytes: int = 2) -> float:
    """What the final norm, the LM head and the loss save on ``tokens`` tokens: the norm's (as in a layer), the
    float32 log-softmax over the vocabulary that the cross-entropy keeps (HF's loss upcasts the logits), its int64
    targets, and three float32 scalars (the reduction's); exact against ``meta_activation_bytes`` at
    ``dtype_bytes = 4`` and, in bf16 (the fp32 norm and one bf16 cast for the head), with ``bf16=True``."""
    h, b = text.hidden, dtype_bytes
    norm = 4 * h + 4 + 2 * b * h if b == 4 else 8 * h + 4 + b * h  # bf16: the fp32 norm and the head's cast
    return float(tokens * (norm + 4 * text.vocab + 8) + 12)


def vision_activation_bytes(vision: VisionShape, patches: int, dtype_bytes: int = 2) -> float:
    """What the tower saves for its backward on ``patches`` patches (a trainable tower's graph): per block the
    decoder layer's list (:func:`decoder_layer_activation_bytes`) at the tower's width with full multi-head
    attention, and the merger's input, hidden and GELU output. An estimate: the tower's rotary upcasts q and k
    to float32, which this does not count."""
    shape = TextShape(hidden=vision.hidden, intermediate=vision.intermediate, layers=vision.depth,
                      heads=vision.heads, kv_heads=vision.heads, vocab=0)
    merger = patches * dtype_bytes * vision.hidden * 3
    return vision.depth * decoder_layer_activation_bytes(shape, patches, dtype_bytes) + merger
