"""The LLaVA group: a vision tower (CLIP, SigLIP, a timm ViT or FastViT, or the family's own), a projector, and a
decoder-only text model, the projected image features written at the image tokens of the prompt (LLaVA's layout,
``model.vision_tower`` and ``model.multi_modal_projector``, or the family's own names for them).

Types: ``llava``, ``llava_next``, ``llava_next_video``, ``llava_onevision``, ``vipllava``, ``video_llava``,
``aya_vision``, ``cohere2_vision``, ``aria``, ``fast_vlm``, ``perception_lm`` (timm towers), ``llama4``, ``lfm2_vl``,
``molmo2``, ``step3p7``, ``minimax_m3_vl``; refused: ``fuyu``, ``ovis2`` (:mod:`.split`).
"""
