"""The sizes the closed forms of :mod:`.counts` read: a decoder's (:class:`TextShape`) and a Qwen2.5-VL vision
tower's (:class:`VisionShape`), taken from an HF config by :func:`shapes_from_config`, and what one sample and one
step are (:class:`Workload`).

Pure Python, no torch: ``shapes_from_config`` only reads the config's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextShape:
    """The decoder's sizes (the HF text config's ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``vocab_size``, ``tie_word_embeddings``).
    ``qkv_bias``: the q, k and v projections carry a bias (Qwen2 and Qwen2.5 do). A mixture-of-experts decoder's
    ``intermediate`` is the gated-MLP width a token runs through (:func:`token_mlp_width`)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0
    tied: bool = False
    qkv_bias: bool = True

    @property
    def dim(self) -> int:
        """Per-head width: ``head_dim``, else ``hidden // heads``."""
        return self.head_dim or self.hidden // self.heads


@dataclass(frozen=True)
class VisionShape:
    """The Qwen2.5-VL vision tower's sizes (``Qwen2_5_VLVisionConfig``): ``depth`` blocks of width ``hidden``
    with a gated MLP of ``intermediate``, ``heads`` heads; Conv3d patches of ``temporal_patch x patch x patch``
    over ``in_channels``; blocks in ``full_blocks`` attend over a whole image, the others within windows of
    ``window`` pixels; the merger folds ``merge x merge`` patches into one token of ``out_hidden``."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch: int
    temporal_patch: int
    merge: int
    window: int
    full_blocks: tuple[int, ...]
    out_hidden: int
    in_channels: int = 3


def token_mlp_width(text) -> int:
    """The gated-MLP width one token runs through in a decoder layer of the HF text config ``text``: its
    ``intermediate_size``; for a mixture-of-experts config with no dense width (Qwen3.5-MoE's), the routed
    experts' ``moe_intermediate_size`` times the experts a token picks (``num_experts_per_tok``) plus the shared
    expert's ``shared_expert_intermediate_size``: the same multiply-adds per token.

    Raises:
        AttributeError: a config with neither.
    """
    dense = getattr(text, "intermediate_size", None)
    if dense:
        return int(dense)
    shared = getattr(text, "shared_expert_intermediate_size", None) or 0
    return int(text.moe_intermediate_size * text.num_experts_per_tok + shared)


def shapes_from_config(config) -> tuple[TextShape, VisionShape | None]:
    """The shapes of an HF config object (``Qwen2_5_VLConfig``, or a text-only config: no tower)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    shape = TextShape(hidden=text.hidden_size, intermediate=token_mlp_width(text), layers=text.num_hidden_layers,
                      heads=text.num_attention_heads,
                      kv_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
                      vocab=text.vocab_size, head_dim=getattr(text, "head_dim", None) or 0,
                      tied=bool(getattr(config, "tie_word_embeddings", False)
                                or getattr(text, "tie_word_embeddings", False)),
                      qkv_bias=bool(getattr(text, "attention_bias", True)))
    v = getattr(config, "vision_config", None)
    if v is None:
        return shape, None
    return shape, VisionShape(depth=v.depth, hidden=v.hidden_size, intermediate=v.intermediate_size,
                              heads=v.num_heads, patch=v.patch_size, temporal_patch=v.temporal_patch_size,
                              merge=v.spatial_merge_size, window=v.window_size,
                              full_blocks=tuple(v.fullatt_block_indexes), out_hidden=v.out_hidden_size,
                              in_channels=v.in_channels)


@dataclass(frozen=True)
class Workload:
    """What one sample is, and how a step batches samples (assumptions the caller states).

    Attributes:
        tokens: sequence length of one sample, image tokens included.
        images: images per sample, each ``image_height x image_width`` pixels (a multiple of ``patch * merge``,
            as Qwen2.5-VL's processor resizes to).
        micro_batch: samples per micro-batch.
        global_batch: samples per optimizer step, over all data-parallel replicas.
    """

    tokens: int = 4096
    images: int = 4
    image_height: int = 448
    image_width: int = 448
    micro_batch: int = 1
    global_batch: int = 128

    def grids(self, vision: VisionShape) -> list[tuple[int, int, int]]:
        """``(frames, rows, columns)`` of patches of every image of one micro-batch (a still image is one
        frame, copied ``temporal_patch`` times into the Conv3d's depth, as the processor does).

        Raises:
            ValueError: an image side that is not a multiple of ``patch * merge``, or more image tokens than
                ``tokens``.
        """
        step = vision.patch * vision.merge
        if self.image_height % step or self.image_width % step:
            raise ValueError(f"image_height and image_width must be multiples of patch * merge = {step}, got "
                             f"{self.image_height} x {self.image_width}")
        grid = (1, self.image_height // vision.patch, self.image_width // vision.patch)
        out = [grid] * (self.images * self.micro_batch)
        if self.image_tokens(vision) > self.tokens * self.micro_batch:
            raise ValueError(f"{self.images} images of {self.image_height} x {self.image_width} make "
                             f"{self.image_tokens(vision) // self.micro_batch} image tokens, more than tokens = "
                             f"{self.tokens}")
        return out

    def patches(self, vision: VisionShape) -> int:
        """Vision patches of one micro-batch."""
        step = vision.patch
        return self.images * self.micro_batch * (self.image_height // step) * (self.image_width // step)

    def image_tokens(self, vision: VisionShape) -> int:
        """Image tokens of one micro-batch: its patches over ``merge**2``."""
        return self.patches(vision) // vision.merge**2

    def num_micro(self, dp_size: int) -> int:
        """``M`` per replica: ``global_batch / (dp_size * micro_batch)``.

        Raises:
            ValueError: the global batch does not split evenly.
        """
        if self.global_batch % (dp_size * self.micro_batch):
            raise ValueError(f"global_batch = {self.global_batch} is not a multiple of dp_size * micro_batch = "
                             f"{dp_size * self.micro_batch}")
        return self.global_batch // (dp_size * self.micro_batch)
