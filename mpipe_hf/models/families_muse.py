"""Muse Glimmer: a MoonViT-style tower (Qwen-style temporal patches, a resampled learned position grid, window and
full attention blocks, a 2 x 2 pixel shuffle), its adapter, projection and weightless norm in the preprocess; a text
model whose every fourth layer (counted from the last) has no rotary embedding (``layer_rope_theta[i] == 0``: its
``forward`` hands that layer ``position_embeddings=None``) and attends globally, the others sliding; logits scaled
by ``output_multiplier`` and soft-capped. Its stock image processor needs torchvision; its model code does not.
"""

from __future__ import annotations

from torch import nn

from .decoder import DecoderStage
from .families import validate_counted_micro
from .family import Family
from .tiny import qwen_special_ids, text_keys
from .tiny import VISION


class NoRopeStage(DecoderStage):
    """A :class:`~.decoder.DecoderStage` whose layers with ``layer_rope_theta == 0`` get ``position_embeddings
    = None``, as the text model's ``forward`` hands them."""

    def layer_kwargs(self, layer_id: int, state) -> dict:
        return {} if self.text_config.layer_rope_theta[layer_id] else {"position_embeddings": None}


def _muse_tokens(model: nn.Module):
    """Muse Glimmer: each image's patches (``image_grid_thw``'s product) over ``merge_size ** 2``."""
    merge = model.config.vision_config.merge_size
    return lambda raw: int(raw["image_grid_thw"].prod(-1).sum()) // merge ** 2


MUSE_GLIMMER = Family(vision=("model.vision_tower", "model.vision_adapter", "model.vision_projection",
                              "model.perception_emb_norm"),
                      image_inputs=("pixel_values", "image_grid_thw"), softcap=True, logit_scale="output_multiplier",
                      stage=lambda model: NoRopeStage, validate=validate_counted_micro(_muse_tokens))


def tiny_muse_glimmer_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``MuseGlimmerConfig``: a 2-layer tower of width 32 (14-px patches, 2 frames a patch, a 4 x 4 learned
    position grid, window attention then full attention, 2 x 2 pixel shuffle to 128), the adapter (128 -> 64) and
    projection; a text model of ``num_layers`` (4 heads of 16, 2 key-value heads; every fourth from the last
    global without rotary embedding, the others 16-token sliding), logits times ``output_multiplier`` soft-capped
    at 20; untied embeddings, as the real model. Images are ``<|image_pad|>`` x (patches / 4).

    ``qk_scale_factor`` 1.0 (the real model's 3.87): the queries and keys are RMS-normalised without a learned
    scale, so this factor alone sets the attention's temperature, and a random model at 3.87 has logits spread
    by 3.87, each softmax nearly one-hot over near-ties: one AdamW step's fp32 rounding (a split's sums in another
    order) then moved the step-2 gradients by 2e-4 of their largest (Muse Spark's by 6.7e-3), against 8e-6 (4e-5)
    at 1.0 (:func:`~.tiny.usual_temperature` gives Gemma 4 the same start)."""
    from transformers import MuseGlimmerConfig
    text = text_keys(tokenizer, num_layers, hidden_size, head_dim=hidden_size // 4, sliding_window=16,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, qk_scale_factor=1.0)
    vision = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, max_position_embeddings=16, patch_temporal=2,
                  merge_size=2, layer_types=["window_attention", "full_attention"], **VISION)
    ids = qwen_special_ids(tokenizer)
    return MuseGlimmerConfig(text_config=text, vision_config=vision, out_hidden_size=4 * VISION["hidden_size"],
                             projector_hidden_size=hidden_size, tie_word_embeddings=False,
                             image_token_id=ids["image_token_id"], video_token_id=ids["video_token_id"])


def tiny_muse_spark_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``MuseSparkConfig``: :func:`tiny_muse_glimmer_config`'s tower, adapter and text attention, every MLP but
    the first a mixture of 4 experts (2 active, sigmoid routing) of width 32 between a projection to 32 and back,
    residual gates; a 2-stage audio tower (the split leaves it unused: audio rows are refused)."""
    from transformers import MuseSparkConfig
    glimmer = tiny_muse_glimmer_config(tokenizer, num_layers, hidden_size).to_dict()
    text = {k: v for k, v in glimmer["text_config"].items() if k not in ("model_type", "layer_types",
                                                                         "layer_rope_theta")}
    text.update(moe_intermediate_size=hidden_size // 2, moe_hidden_size=hidden_size // 2, num_local_experts=4,
                num_experts_per_tok=2, mlp_layer_types=["dense"] + ["sparse"] * (num_layers - 1))
    vision = {k: v for k, v in glimmer["vision_config"].items() if k != "model_type"}
    audio = dict(patch_sizes=[4, 2], hidden_sizes=[16, 32], depths=[1, 1], num_hidden_layers=2,
                 out_hidden_size=hidden_size)
    return MuseSparkConfig(text_config=text, vision_config=vision, audio_config=audio,
                           out_hidden_size=glimmer["out_hidden_size"], projector_hidden_size=hidden_size,
                           tie_word_embeddings=False, image_token_id=glimmer["image_token_id"],
                           video_token_id=glimmer["video_token_id"],
                           audio_token_id=tokenizer.convert_tokens_to_ids("<|quad_start|>"))
