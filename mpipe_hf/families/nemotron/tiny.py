"""The scaled-down real config of Nemotron-H Omni, for the tests."""

from __future__ import annotations

from ...models.tiny import token_id

# one of each block type, in the order of the real pattern's runs (Mamba-2 and MoE alternate, attention between)
PATTERN = ("linear_attention", "moe", "linear_attention", "full_attention", "mlp", "moe")


def tiny_nemotron_h_omni_config(tokenizer, num_layers: int = 8, hidden_size: int = 64):
    """A ``NemotronH_Omni_Reasoning_V3_Config`` (Nemotron 3 Nano Omni, scaled down, no audio tower): a 2-layer
    RADIO tower of width 32 in 16-px patches (3 class tokens, 2 registers), a 2 x 2 pixel shuffle into the
    projector, and a Nemotron-H text model of ``num_layers`` blocks in :data:`PATTERN`'s repeating order: Mamba-2
    (4 heads of 16, state 16 in 2 groups, 4-token convolution, 8-token scan chunks, so a row spans several; time
    steps drawn from [0.1, 1] rather than [0.001, 0.1]: with steps near 0.001 the decay is 1 to within 1e-4 and
    ``A_log``'s gradient fell to 1e-9 of the largest, under fp32's noise in it, so the check could not see it),
    attention (4 heads of 16, 2 key-value heads), a ReLU^2 MLP, and MoE (4 routed experts of width 32, 2 active, a
    shared expert); untied embeddings, as the real model."""
    from transformers import NemotronH_Omni_Reasoning_V3_Config
    types = [PATTERN[i % len(PATTERN)] for i in range(num_layers)]
    text = dict(model_type="nemotron_h", vocab_size=len(tokenizer), hidden_size=hidden_size, layers_block_type=types,
                num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
                intermediate_size=2 * hidden_size, mamba_num_heads=4, mamba_head_dim=hidden_size // 4,
                ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=8, time_step_min=0.1, time_step_max=1.0,
                n_routed_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=hidden_size // 2,
                moe_shared_expert_intermediate_size=hidden_size // 2, tie_word_embeddings=False,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2.0, patch_size=16,
                  image_size=64, max_img_size=256, num_cls_tokens=3, num_registers=2, video_temporal_patch_size=2)
    return NemotronH_Omni_Reasoning_V3_Config(
        text_config=text, vision_config=vision, vision_hidden_size=32, projector_hidden_size=hidden_size,
        downsample_ratio=0.5, image_token_id=token_id(tokenizer, "<|image_pad|>"),
        video_token_id=token_id(tokenizer, "<|video_pad|>"), tie_word_embeddings=False)


TINY = {"nemotron_h_omni": tiny_nemotron_h_omni_config}
