"""The split declarations of the Mistral group.

Mistral 3 and LightOnOCR keep the Pixtral tower and its projector as ``P``'s vision part, fed ``pixel_values``
and ``image_sizes``; the load-time check counts an image's ``[IMG]`` tokens from its size
(:func:`pixtral_tokens`). ``mistral4`` is what transformers maps it to, ``Mistral4ForCausalLM``: a decoder-only LM
(multi-head latent attention, DeepSeek-style routed and shared experts, YaRN rotary), ``Family(text="model")``;
``output_router_logits`` stays off, as its loss adds no load-balancing term.
"""

from __future__ import annotations

from torch import nn

from ...models.family import Family
from ...models.image_tokens import validate_counted_micro

TOWER = ("model.vision_tower", "model.multi_modal_projector")


def pixtral_tokens(model: nn.Module):
    """Mistral 3, LightOnOCR: ``(h // (patch * merge)) * (w // (patch * merge))`` [IMG] tokens per image, over the
    ``image_sizes`` ``(images, 2)`` of a micro-batch."""
    step = model.config.vision_config.patch_size * model.config.spatial_merge_size
    return lambda raw: int(((raw["image_sizes"] // step).prod(-1)).sum())


FAMILIES: dict[str, Family] = {
    "mistral3": Family(vision=TOWER, image_inputs=("pixel_values", "image_sizes"),
                       validate=validate_counted_micro(pixtral_tokens)),
    "lighton_ocr": Family(vision=("model.vision_encoder", "model.vision_projection"),
                          image_inputs=("pixel_values", "image_sizes"),
                          validate=validate_counted_micro(pixtral_tokens)),
    "mistral4": Family(text="model"),
}

REFUSED: dict[str, str] = {  # model_type -> why it cannot be split, in the user's terms
    "mistral_large4": "its decoder layers pass state to later layers: 'shared' indexer layers reuse an earlier "
                      "layer's top-k token indices, 'reuse' layers read another layer's latent keys and values, and "
                      "the rotary embedding has a learned parameter (rotary_emb.alpha) that every layer reads",
}
