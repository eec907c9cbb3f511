"""Every model type transformers maps to ``AutoModelForImageTextToText``: split exactly, or refused with the reason
in the user's terms (issue 38). ``docs/models.md``'s table is generated from here (``scripts/report/model_table.py``).

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
    "inkling2": "every layer attends over a growing stack of earlier block outputs (block_states, (B, L, k, H), "
                "read by its block attention residual) and the final input mixes the whole stack: a stage boundary "
                "would carry k + 1 hidden-state streams, not one",
    "inkling2_loop": "a looped block: layers loop_layer_index_start to loop_layer_index_end run loop_num_passes "
                     "times per forward, each pass reading the last: the same layers run more than once per token, "
                     "so no contiguous cut into stages exists",
    "apertus1p5": "images are discrete tokens: a frozen VQ image tokenizer (argmax over a codebook) turns them into "
                  "ids that the text embedding reads, so there is no trainable vision tower or projector to put in "
                  "the preprocess (as chameleon and emu3)",
    "mistral_large4": "its decoder layers pass state to later layers: 'shared' indexer layers reuse an earlier "
                      "layer's top-k token indices, 'reuse' layers read another layer's latent keys and values, and "
                      "the rotary embedding has a learned parameter (rotary_emb.alpha) that every layer reads",
    "granite4_vision": "projected features of several vision layers are added before deep decoder layers (12, 15, "
                       "18 and 21 by default) and the image-token embeddings are zeroed; the splitter relays "
                       "features into the first decoder layers only (DeepStack), not into chosen deep ones",
    "granite_docling": "optional DeepStack features and a tile-routing input (tile_fine_mask: 4 x the tokens per "
                       "tile) with a density-router loss on the tower, and Granite's embedding and logit scaling; "
                       "the tiling and router paths are not declared yet",
    "cohere_compass": "its no-RoPE layer types have no rope parameters and its rotary module raises for them, while "
                      "the splitter's stages compute rotary embeddings for every layer type; not declared yet",
    "dots3_note": "its DeepSeek-style indexed attention layers need a causal mask that is never skipped and a cost "
                  "model, which the splitter lacks; not declared yet",
}
REFUSED: dict[str, str] = {**_OWN, **_LLAVA_LIKE, **_QWEN_LIKE, **_NEW}
"""``model_type`` -> why it is refused, in the user's terms."""

NOTES: dict[str, str] = {
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
