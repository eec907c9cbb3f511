"""Idefics and SmolVLM: a SigLIP-style tower ``model.vision_model`` over the tiles of an image (padded tiles are
zero and dropped), a ``model.connector`` (Idefics3 / SmolVLM: pixel shuffle and a projection; Idefics2: an MLP
and a Perceiver resampler to a fixed number of latents) and a ``model.text_model`` decoder. Types:
``idefics2``, ``idefics3``, ``smolvlm``."""
