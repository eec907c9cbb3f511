"""Refusals of model types that no family group holds: architectures with no decoder-only stack to cut (encoder-
decoders, cross-attention every few layers), images as codes in the text vocabulary, and the splitter gaps of a few
newer types. A group's own refusals live in its ``split.py`` (:mod:`.registry`)."""

from __future__ import annotations

_ENCODER_DECODER = "encoder-decoder: the text is decoded by a decoder that cross-attends to an encoder, so there is " \
                   "no decoder-only stack to pipeline"
REFUSED: dict[str, str] = {
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
    "apertus1p5": "images are discrete tokens: a frozen VQ image tokenizer (argmax over a codebook) turns them into "
                  "ids that the text embedding reads, so there is no trainable vision tower or projector to put in "
                  "the preprocess (as chameleon and emu3)",
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
"""``model_type`` -> why it is refused, in the user's terms."""
