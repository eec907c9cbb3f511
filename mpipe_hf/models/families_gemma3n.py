"""Gemma 3n: its declarations (:class:`~.family.Family`) and tiny configs.

- ``gemma3n`` (``Gemma3nForConditionalGeneration``): the timm MobileNet-V5 tower (``model.vision_tower``) and
  ``model.embed_vision`` in ``P``'s vision part; ``embed_vision``'s hard-token table is read by stage 0's front
  too (:class:`~mpipe_hf.families.gemma.altup.MultimodalTokens`: the end-of-image token). The audio path is refused at load by
  name (``input_features``), so the audio tower never runs and ``model.embed_audio`` only ever embeds ids of the
  audio range, which only the audio path writes: both are ``unused`` (frozen, kept with stage 0), the front still
  applying ``embed_audio``'s table as the model's forward does. The text model runs AltUp, per-layer inputs and
  shared key/value layers across stage boundaries (:mod:`mpipe_hf.families.gemma.altup`); the logits are soft-capped. Building
  the model needs timm (and torchvision): ``scripts/check/check_timm_families.py`` checks it where both import.
- ``gemma3n_text`` (``Gemma3nForCausalLM``): the same text model alone, which CI checks without timm.
"""

from __future__ import annotations

from torch import nn

from .families import validate_counted_micro
from .family import Family
from ..families.gemma.altup import EMBED_PARTS, HEAD_PARTS, altup_stage
from .micro_checks import refuse_other_modalities
from .tiny import text_keys
from .tiny import token_id


def _gemma3n_tokens(model: nn.Module):
    """Gemma 3n: per image (``pixel_values`` ``(images, 3, H, W)``) the tower's output grid, which its multi-scale
    fusion adapter resizes to ``msfa.output_resolution`` whatever the image's size, one token a cell.

    Raises:
        ValueError: (from the count) the grid differs from ``vision_soft_tokens_per_image``, which
            ``get_image_features`` reshapes the tower's output to (it would fail there).
    """
    rows, cols = model.model.vision_tower.timm_model.msfa.output_resolution
    stated = model.config.vision_soft_tokens_per_image

    def count(raw) -> int:
        if rows * cols != stated:
            raise ValueError(f"gemma3n: the vision tower gives {rows} x {cols} tokens an image, but "
                             f"vision_soft_tokens_per_image is {stated}: get_image_features cannot reshape them")
        return raw["pixel_values"].shape[0] * rows * cols
    return count


def _audio_refused_then_counted(model: nn.Module):
    """``Family.validate``: audio (``input_features``) and video inputs refused by name, then the image-token count
    (:func:`_gemma3n_tokens`)."""
    checks = [refuse_other_modalities({"input_features": "audio", "pixel_values_videos": "video"})(model),
              validate_counted_micro(_gemma3n_tokens)(model)]

    def validate_micro(raw) -> None:
        for check in checks:
            check(raw)
    return validate_micro


_SHARED = dict(softcap=True, embed_parts=EMBED_PARTS, head_parts=HEAD_PARTS, stage=altup_stage)
GEMMA3N_TEXT = Family(text="model", **_SHARED)
GEMMA3N = Family(vision=("model.vision_tower", "model.embed_vision"), unused=("model.audio_tower", "model.embed_audio"),
                 validate=_audio_refused_then_counted, **_SHARED)


def tiny_gemma3n_text_config(tokenizer, num_layers: int = 8, hidden_size: int = 64, sliding_window: int = 16):
    """A ``Gemma3nTextConfig`` (as gemma-3n-E2B's, scaled down): ``num_layers`` layers (every third global, the
    others ``sliding_window``-token local; 16-wide heads, 2 key-value heads), AltUp over 4 streams, Laurel blocks of
    rank 8, per-layer inputs of width 8 from a table of the ids below ``<|vision_end|>`` (the real table stops where
    the image tokens start), the last third of the layers reusing the keys and values of the last earlier layer of
    their type, the first quarter's MLPs 95% sparse (the real model's first 10 of 35), logits soft-capped at 30, the
    head tied to the embedding."""
    from transformers import Gemma3nTextConfig
    types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(num_layers)]
    types[-1] = "full_attention"
    sparse = num_layers // 4
    text = text_keys(tokenizer, num_layers, hidden_size, tie=True, head_dim=hidden_size // 4, sliding_window=sliding_window,
                 layer_types=types, hidden_size_per_layer_input=8,
                 vocab_size_per_layer_input=token_id(tokenizer, "<|vision_end|>"), num_kv_shared_layers=num_layers // 3,
                 laurel_rank=8, altup_num_inputs=4, final_logit_softcapping=30.0,
                 activation_sparsity_pattern=[0.95] * sparse + [0.0] * (num_layers - sparse))
    text["intermediate_size"] = [text["intermediate_size"]] * num_layers
    return Gemma3nTextConfig(**text)


def tiny_gemma3n_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``Gemma3nConfig`` (gemma-3n-E2B's layout, scaled down): :func:`tiny_gemma3n_text_config`'s text model; the
    timm MobileNet-V5 encoder (``mobilenetv5_300m_enc`` at 1/16 of its channels) whose multi-scale fusion adapter
    gives a 2 x 2 grid of 2048 channels (4 soft tokens an image; 16 x 16 on the hub), its blocks' layer scales
    starting at 1 (at timm's 1e-5 a random tower passes its attention blocks gradients of 1e-8 of its largest: a
    degenerate test); a one-layer audio conformer of width 32 that the split never runs. The token ranges follow the
    real vocabulary's: ``<|vision_start|>`` is the start-of-image text token, the 4 ids from ``<|vision_end|>`` (the
    end-of-image token, then the image token ``<|image_pad|>``) are ``embed_vision``'s hard tokens, the 8 after them
    ``embed_audio``'s. Building the model needs timm (and so torchvision); the config does not."""
    from transformers import Gemma3nConfig
    text = tiny_gemma3n_text_config(tokenizer, num_layers, hidden_size).to_dict()
    vision_offset = token_id(tokenizer, "<|vision_end|>")
    vision = dict(architecture="mobilenetv5_300m_enc", hidden_size=2048, vocab_size=4, vocab_offset=vision_offset,
                  model_args={"channel_multiplier": 0.0625, "msfa_output_resolution": 2,
                              "layer_scale_init_value": 1.0})
    audio = dict(hidden_size=32, vocab_size=8, vocab_offset=vision_offset + 4, conf_num_hidden_layers=1,
                 conf_num_attention_heads=2, input_feat_size=16, sscp_conv_channel_size=[8, 8])
    return Gemma3nConfig(text_config=text, vision_config=vision, audio_config=audio, vision_soft_tokens_per_image=4,
                         image_token_id=token_id(tokenizer, "<|image_pad|>"),
                         boi_token_id=token_id(tokenizer, "<|vision_start|>"), eoi_token_id=vision_offset,
                         audio_token_id=vision_offset + 5, boa_token_id=token_id(tokenizer, "<|box_start|>"),
                         eoa_token_id=vision_offset + 4, tie_word_embeddings=True)
