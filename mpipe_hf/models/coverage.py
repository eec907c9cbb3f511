"""Every model type transformers maps to ``AutoModelForImageTextToText``: split exactly, or refused with the reason
in the user's terms (issue 38). ``docs/models.md``'s table is generated from here (``scripts/model_table.py``).

A type is *declared* when :data:`~.registry.FAMILIES` has its declaration; it is *refused* with the reason
:data:`REFUSED` gives (the architecture in a few words: why there is no decoder stack to cut, or what it would need
that the splitter has not). A type that is neither is refused as not declared yet.
"""

from __future__ import annotations

from .families_llava_like import REFUSED as _LLAVA_LIKE
from .families_new import REFUSED as _NEW
from .families_qwen_like import REFUSED as _QWEN_LIKE

_ENCODER_DECODER = "encoder-decoder: the text is decoded by a decoder that cross-attends to an encoder, so there is " \
                   "no decoder-only stack to pipeline"
_OWN = {
    "blip": "BLIP's text decoder is a BERT model that cross-attends to the image in every layer",
    "blip-2": "not declared: the Q-Former's queries feed an OPT or Flan-T5 language model (OPT: learned positions "
              "under decoder.layers; Flan-T5: encoder-decoder)",
    "instructblip": "not declared: as blip-2, the Q-Former also reads the instruction; OPT or Flan-T5 language model",
    "instructblipvideo": "not declared: as instructblip, on video frames",
    "chameleon": "images are VQ-VAE codes in the text vocabulary (no vision tower: the image tokenizer runs in the "
                 "data path); not declared",
    "emu3": "images are VQ-VAE codes in the text vocabulary (no vision tower: the image tokenizer runs in the data "
            "path); not declared",
    "evolla": "a protein-text model: the input is a protein sequence, not an image",
    "florence2": _ENCODER_DECODER + " (BART)",
    "git": "image and text tokens run through one BERT-style stack with learned positions and a prefix mask "
           "built from the image; no decoder-layer stack with the masks the splitter builds",
    "idefics": "gated cross-attention layers read the image at every few layers (Flamingo): every stage would need "
               "the image features",
    "kosmos-2": "not declared: its text model (sinusoidal positions, image features by an image-embeds position "
                "mask) has no declaration here",
    "kosmos-2.5": "not declared: as kosmos-2, with a Pix2Struct-style tower",
    "mllama": "cross-attention layers read the image at every few layers: every stage would need the image "
              "features",
    "pi0": "a robot action head: a flow-matching action expert beside the VLM, trained on actions, not tokens",
    "pi05": "a robot action head: a flow-matching action expert beside the VLM, trained on actions, not tokens",
    "pix2struct": _ENCODER_DECODER,
    "pp_formulanet": _ENCODER_DECODER,
    "t5gemma2": _ENCODER_DECODER + " (T5Gemma 2)",
    "udop": _ENCODER_DECODER + " (T5 with layout embeddings)",
    "vision-encoder-decoder": _ENCODER_DECODER,
}
REFUSED: dict[str, str] = {**_OWN, **_LLAVA_LIKE, **_QWEN_LIKE, **_NEW}
"""``model_type`` -> why it is refused, in the user's terms."""

NOTES: dict[str, str] = {
    "gemma4": "per-layer inputs and shared keys and values relayed across stages; the chained split equals the "
              "unsplit model bit for bit on one process (tests/test_families_new.py), but after 2 AdamW steps on "
              "2 ranks the parameters differ by up to 9e-5 (fp32 order near AdamW's eps), so no CI case yet; "
              "audio and video refused by name",
}
"""``model_type`` -> what a declared type without a CI case has been checked for."""

NOT_DECLARED = "not declared yet: no family declaration reads this architecture"


def image_text_types() -> dict[str, str]:
    """``{model_type: model class name}`` of the installed transformers' ``AutoModelForImageTextToText`` map."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    return dict(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def refusal(model_type: str) -> str | None:
    """Why ``model_type`` is refused (``None`` when it has a declaration)."""
    from .registry import FAMILIES
    if model_type in FAMILIES:
        return None
    return REFUSED.get(model_type, NOT_DECLARED)
