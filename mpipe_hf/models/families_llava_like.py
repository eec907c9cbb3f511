"""The llava_like families added in issue 38: declarations (:class:`~.family.Family`), tiny configs, refusals.

Each declaration is read from transformers' own surface, as :mod:`.families` does: where the model keeps its
tower and projector, the keys its ``get_image_features`` takes, and what its ``forward`` adds around the decoder
layers. ShieldGemma 2 is Gemma 3's model class under its own config, so it takes Gemma 3's declaration.
LLaVA-NeXT-Video and Video-LLaVA are split on their image path; their video inputs are refused at load
(:func:`refuse_modalities`), and Video-LLaVA's video tower, like Janus's image-generation head (VQ-VAE,
generation embeddings, aligner and head), is a part the split never runs (``Family.unused``: frozen, saved with
stage 0). Aya Vision's conditional model scales its logits by the text config's ``logit_scale``
(``Family.logit_scale``). PP-Chart2Table is GOT-OCR2's model class under its own config.
"""

from __future__ import annotations

from dataclasses import replace

from .families import FAMILIES as _BASE, TOWER, _fixed, validate_counted_micro
from .family import Family, no_pil
from . import tiny_llava_like as tiny

Tensors = dict


def _tile_tokens(model) -> int:
    """Tokens per tile of a tower pixel-shuffled by ``downsample_factor`` (Aya Vision)."""
    config = model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    return (side // config.downsample_factor) ** 2


def refuse_modalities(keys: dict[str, str], inner=None):
    """``Family.validate`` that refuses a micro-batch carrying any of ``keys`` (``{raw key: modality}``, e.g.
    ``{"pixel_values_videos": "video"}``) with a ``ValueError`` naming the modality, then runs ``inner`` (another
    ``validate``) when given: the family's image path is what is split."""
    def build(model):
        check = inner(model) if inner is not None else None
        model_type = model.config.model_type

        def validate_micro(raw: Tensors) -> None:
            for key, modality in keys.items():
                if key in raw:
                    raise ValueError(f"{model_type}: {modality} inputs ({key!r}) are not supported; only its image "
                                     f"path is split (send images as 'pixel_values')")
            if check is not None:
                check(raw)
        return validate_micro
    return build


_SEQ = validate_counted_micro(_fixed(lambda c: c.image_seq_length))
_PATCHES = validate_counted_micro(_fixed(lambda c: (c.vision_config.image_size // c.vision_config.patch_size) ** 2))
VIDEOS = {"pixel_values_videos": "video"}

FAMILIES: dict[str, Family] = {
    "vipllava": Family(vision=TOWER, validate=_SEQ),
    "shieldgemma2": replace(_BASE["gemma3"], checkpoint=("ShieldGemma2ForImageClassification", "model")),
    "aya_vision": Family(vision=TOWER, logit_scale=True,
                         validate=validate_counted_micro(lambda m: (lambda raw, n=_tile_tokens(m):
                                                                    raw["pixel_values"].shape[0] * n))),
    "qianfan_ocr": Family(vision=TOWER, validate=_SEQ),
    "got_ocr2": Family(vision=TOWER, validate=_SEQ),
    "pp_chart2table": Family(vision=TOWER, validate=_SEQ),
    "llava_next_video": Family(vision=TOWER + ("model.image_newline",), image_inputs=("pixel_values", "image_sizes"),
                               validate=refuse_modalities(VIDEOS)),
    "video_llava": Family(vision=("model.image_tower", "model.multi_modal_projector"),
                          unused=("model.video_tower",), validate=refuse_modalities(VIDEOS, _SEQ)),
    "janus": Family(vision=("model.vision_model", "model.aligner"),
                    unused=("model.vqmodel", "model.generation_embeddings", "model.generation_aligner",
                            "model.generation_head"),
                    validate=validate_counted_micro(_fixed(lambda c: c.vision_config.num_image_tokens))),
    "deepseek_vl": Family(vision=("model.vision_model", "model.aligner"), validate=_PATCHES),
    "deepseek_vl_hybrid": Family(vision=("model.high_res_vision_model", "model.high_res_vision_neck",
                                         "model.high_res_vision_proj", "model.high_res_vision_alpha",
                                         "model.vision_model", "model.aligner"),
                                 image_inputs=("pixel_values", "high_res_pixel_values"), validate=_PATCHES),
    "aria": Family(vision=TOWER, image_inputs=("pixel_values", "pixel_mask")),
    "lighton_ocr": Family(vision=("model.vision_encoder", "model.vision_projection"),
                          image_inputs=("pixel_values", "image_sizes")),
}
# model_type -> tiny_<type>_config(tokenizer, num_layers=8, ...)
TINY: dict = {t: getattr(tiny, f"tiny_{t}_config") for t in FAMILIES}
_TIMM = ("its vision tower is a timm model (TimmWrapperModel): timm is not installed and needs torchvision, which "
         "cannot be imported here")
# model_type -> why it cannot be split, in the user's terms
REFUSED: dict[str, str] = {
    "cohere2_vision": no_pil("Cohere2VisionImageProcessor"),
    "molmo2": no_pil("Molmo2ImageProcessor"),
    "step3p7": no_pil("Step3p7ImageProcessor"),
    "unlimited_ocr": no_pil("UnlimitedOcrImageProcessor"),
    "minimax_m3_vl": no_pil("MiniMaxM3VLImageProcessor"),
    "lfm2_vl": no_pil("Lfm2VlImageProcessor") + "; its LFM2 text model also ends in 'embedding_norm', "
               "where the split reads 'norm'",
    "ovis2": "its front puts the visual embedding table's indicator embeddings at the visual indicator tokens besides "
             "the image features at the image tokens; the split's stage-0 front places image features only",
    "fuyu": "it has no vision tower: image patches are embedded by a linear layer and gathered into each row at "
            "'image_patches_indices', and its Persimmon text model ends in 'final_layernorm', not 'norm'",
    "perception_lm": _TIMM,
    "fast_vlm": _TIMM,
    "gemma3n": _TIMM + "; its text model also shares keys and values across layers (which may sit on another "
                       "stage) and takes an audio tower",
}
