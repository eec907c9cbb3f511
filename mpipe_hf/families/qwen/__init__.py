"""Qwen-VL and its kin: a Qwen2-style decoder with M-RoPE (three position rows, computed on the host by the
model's ``get_rope_index``) and a windowed or DeepStack vision tower ``model.visual`` sized by ``image_grid_thw``.
Types: ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_vl_moe``, ``qwen3_5``, ``qwen3_5_moe``, the Omni
thinkers ``qwen2_5_omni_thinker`` and ``qwen3_omni_moe_thinker`` (image path only), and ``qwen4_exp`` (refused)."""
