"""Per-token compute of a decoder from its Hugging Face text config: the weights each token multiplies by.

A token's matmul FLOPs in a layer are ``2 x`` the weights it multiplies by (forward), so counting those weights
per layer ranks layers by compute. What a layer counts depends on its kind, read from the config fields the
transformers 5.24 modeling files build each layer from:

- softmax attention (``layer_types`` ``full_attention``, ``sliding_attention``, ``chunked_attention``, or none):
  ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (``LlamaAttention``); the query projection is twice as wide in
  the gated attention of ``Qwen3NextAttention`` / ``Qwen3_5Attention`` (query and output gate in one matmul);
- multi-head latent attention when the config sets ``kv_lora_rank`` (``DeepseekV3Attention``, DeepSeek-V2 paper
  section 2.1): ``q_a_proj`` + ``q_b_proj`` (or one ``q_proj`` without ``q_lora_rank``), ``kv_a_proj_with_mqa``,
  ``kv_b_proj``, ``o_proj``;
- Gated DeltaNet (``linear_attention``; ``Qwen3_5GatedDeltaNet``, Yang et al. 2024): ``in_proj_qkv``,
  ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, the depthwise ``conv1d`` over the query/key/value channels and
  ``out_proj``;
- the MLP: a gated MLP (``gate_proj``, ``up_proj``, ``down_proj``) of ``intermediate_size``, or on a sparse
  layer a mixture of experts: the router (``num_experts x hidden``), ``num_experts_per_tok`` routed experts of
  ``moe_intermediate_size``, and the shared expert (``shared_expert_intermediate_size`` with its sigmoid gate,
  as Qwen2-MoE / Qwen3.5-MoE; or ``n_shared_experts x moe_intermediate_size``, as DeepSeek-V3 / GLM-4.5V).
  Which layers are sparse: ``first_k_dense_replace`` (DeepSeek-V3, GLM-4.5V), else ``mlp_only_layers`` and
  ``decoder_sparse_step`` (Qwen2-MoE, Qwen3-MoE, Qwen3-VL-MoE, Qwen3-Next), else every layer (Qwen3.5-MoE).

Attention scores, norms, biases, the routing softmax and the loss are left out (a profile measures them).
These are *active* weights: for memory, every expert counts (the plan sums the meta model's parameters).
"""

from __future__ import annotations

from .decoder import layer_types

# MiniMax-M3's block-sparse layers (their small indexer aside) and Unlimited-OCR's reference sliding-window
# layers multiply by the weights of softmax attention
SOFTMAX_ATTENTION = ("full_attention", "sliding_attention", "chunked_attention", "minimax_m3_sparse",
                     "reference_sliding_attention",
                     "hybrid", "hybrid_sliding")  # Inkling's full and sliding layers (bias and convolutions: small)
LINEAR_ATTENTION = "linear_attention"
# text model types whose softmax attention projects query and output gate together (q_proj is 2x wide)
GATED_ATTENTION = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
                             "muse_glimmer_text", "muse_spark_text"})  # Muse: a gate_proj as wide as q_proj
EXPERT_COUNT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")


def _head_dim(c) -> int:
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def softmax_attention_cost(c) -> int:
    """Weights of ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``: ``hidden x (q + 2 kv) x head_dim`` plus
    ``heads x head_dim x hidden``; ``q`` doubled for :data:`GATED_ATTENTION` types."""
    h, heads, d = c.hidden_size, c.num_attention_heads, _head_dim(c)
    kv = getattr(c, "num_key_value_heads", None) or heads
    gate = 2 if getattr(c, "model_type", "") in GATED_ATTENTION else 1
    return h * heads * d * gate + 2 * h * kv * d + heads * d * h


def latent_attention_cost(c) -> int:
    """Multi-head latent attention's weights (``DeepseekV3Attention``): the query through the ``q_lora_rank``
    bottleneck (or one projection), keys and values through ``kv_lora_rank`` plus the shared rope key, and the
    output from ``heads x v_head_dim``."""
    h, n = c.hidden_size, c.num_attention_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    rank = getattr(c, "q_lora_rank", None)
    query = h * n * qk if rank is None else h * rank + rank * n * qk
    kv = h * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank * n * (c.qk_nope_head_dim + c.v_head_dim)
    return query + kv + n * c.v_head_dim * h


def gated_deltanet_cost(c) -> int:
    """Gated DeltaNet's weights (``Qwen3_5GatedDeltaNet``): ``in_proj_qkv`` to ``2 x keys + values`` channels,
    ``in_proj_z`` to the values, ``in_proj_b`` and ``in_proj_a`` to one scalar per value head, the depthwise
    convolution (``linear_conv_kernel_dim`` taps per channel) and ``out_proj``."""
    h = c.hidden_size
    keys = c.linear_num_key_heads * c.linear_key_head_dim
    values = c.linear_num_value_heads * c.linear_value_head_dim
    channels = 2 * keys + values
    return h * channels + h * values + 2 * h * c.linear_num_value_heads + channels * c.linear_conv_kernel_dim \
        + values * h


def num_experts(c) -> int:
    """Routed experts per sparse layer (``num_experts``, ``n_routed_experts`` or ``num_local_experts``); 0 for a
    dense model."""
    return next((int(v) for f in EXPERT_COUNT_FIELDS if (v := getattr(c, f, None))), 0)


def is_sparse(c, layer: int) -> bool:
    """Whether decoder layer ``layer`` has a mixture-of-experts MLP (the rules of the module docstring)."""
    if not num_experts(c):
        return False
    kinds = getattr(c, "mlp_layer_types", None)  # ERNIE 4.5 VL: "dense" / "sparse" per layer
    if getattr(c, "moe_layers", None) is not None:  # Llama 4: the sparse layers' ids
        return layer in c.moe_layers
    if kinds:
        return kinds[layer] == "sparse"
    first_dense = getattr(c, "first_k_dense_replace", None)
    if first_dense is not None:
        return layer >= first_dense
    if layer in (getattr(c, "mlp_only_layers", None) or []):
        return False
    return (layer + 1) % (getattr(c, "decoder_sparse_step", None) or 1) == 0


def mlp_cost(c, layer: int) -> int:
    """Active MLP weights of decoder layer ``layer``: ``3 x hidden x intermediate_size`` when dense (Gemma 3n's
    ``intermediate_size`` is a list: the layer's entry); else the
    router, ``num_experts_per_tok`` experts and the shared expert. Llama 4's dense layers are
    ``intermediate_size_mlp`` wide, its experts and its one shared expert ``intermediate_size``; Muse Spark's
    experts work at ``moe_hidden_size``, projected to it and back.

    Raises:
        ValueError: a sparse layer whose config has no ``moe_intermediate_size`` (an MoE layout this module
            does not know, e.g. Llama 4's), rather than a wrong count.
    """
    h = c.hidden_size
    llama4 = getattr(c, "intermediate_size_mlp", None)
    dense = getattr(c, "dense_intermediate_size", None)  # MiniMax-M3: experts and a shared expert intermediate_size
    if dense and getattr(c, "shared_intermediate_size", None):  # wide, dense layers dense_intermediate_size
        if not is_sparse(c, layer):
            return 3 * h * dense
        return h * num_experts(c) + (c.num_experts_per_tok * 3 * h * c.intermediate_size
                                     + 3 * h * c.shared_intermediate_size)
    if not is_sparse(c, layer):
        width = llama4 or c.intermediate_size
        return 3 * h * (width[layer] if isinstance(width, (list, tuple)) else width)  # Gemma 3n: one per layer
    if llama4:
        return h * num_experts(c) + (c.num_experts_per_tok + 1) * 3 * h * c.intermediate_size
    inner = getattr(c, "moe_hidden_size", None)  # Muse Spark: experts of moe_hidden_size between two projections
    if inner:
        return h * num_experts(c) + 2 * h * inner + c.num_experts_per_tok * 3 * inner * c.moe_intermediate_size
    width = getattr(c, "moe_intermediate_size", None)
    if width is None:
        raise ValueError(f"{getattr(c, 'model_type', type(c).__name__)}: an MoE config without "
                         f"moe_intermediate_size; mpipe_hf.models.costs does not know its expert layout")
    if isinstance(width, (list, tuple)):  # ERNIE 4.5 VL: [text experts, vision experts]; text tokens dominate
        width = width[0]
    cost = h * num_experts(c) + c.num_experts_per_tok * 3 * h * width
    shared = getattr(c, "shared_expert_intermediate_size", None)
    if shared:  # Qwen2-MoE style: one shared expert and its sigmoid gate (hidden -> 1)
        cost += 3 * h * shared + h
    cost += 3 * h * width * (getattr(c, "n_shared_experts", None) or 0)  # DeepSeek style
    return cost


def attention_cost(c, layer_type: str) -> int:
    """Weights of one layer's token mixer of ``layer_type``.

    Raises:
        ValueError: a layer type that is neither softmax nor linear attention.
    """
    if layer_type == LINEAR_ATTENTION:
        return gated_deltanet_cost(c)
    if layer_type == "conv":  # LFM2/LFM3's short convolution: in_proj to 3 x hidden, depthwise taps, out_proj
        return 4 * c.hidden_size * c.hidden_size + c.hidden_size * c.conv_L_cache
    if layer_type not in SOFTMAX_ATTENTION:
        raise ValueError(f"layer type {layer_type!r} has no cost model; known: "
                         f"{list(SOFTMAX_ATTENTION) + [LINEAR_ATTENTION, 'conv']}")
    return latent_attention_cost(c) if getattr(c, "kv_lora_rank", None) else softmax_attention_cost(c)


def nemotron_h_cost(c, layer_type: str) -> int:
    """Weights of one Nemotron-H block (``NemotronHBlock``: one mixer a layer, no separate MLP): Mamba-2
    (``linear_attention``: ``in_proj`` to gate, convolution channels and one ``dt`` a head, the depthwise ``conv1d``,
    ``out_proj``), attention, the ReLU^2 MLP (``up_proj``, ``down_proj``), or MoE (the router, ``top_k`` experts and
    the shared expert, each up and down, at ``moe_latent_size`` with its two projections where set)."""
    h = c.hidden_size
    if layer_type == LINEAR_ATTENTION:
        inner = c.mamba_num_heads * c.mamba_head_dim
        channels = inner + 2 * c.n_groups * c.ssm_state_size
        return h * (inner + channels + c.mamba_num_heads) + channels * c.conv_kernel + inner * h
    if layer_type == "mlp":
        return 2 * h * c.intermediate_size
    if layer_type == "moe":
        latent = c.moe_latent_size or h
        return (h * num_experts(c) + c.num_experts_per_tok * 2 * latent * c.moe_intermediate_size
                + 2 * h * c.moe_shared_expert_intermediate_size + (2 * h * latent if c.moe_latent_size else 0))
    return softmax_attention_cost(c)


def layer_costs(text_config) -> list[float]:
    """Active weights (elements) each token multiplies by in every decoder layer, in layer order: its token
    mixer (by :func:`~.decoder.layer_types`, the stages' own reading of ``layer_types``) plus its MLP. ``2 x`` that is the layer's forward
    matmul FLOPs per token.

    Raises:
        ValueError: as :func:`attention_cost` and :func:`mlp_cost`.
    """
    types = layer_types(text_config)
    if getattr(text_config, "model_type", "") == "nemotron_h":  # one mixer a block, no MLP beside it
        return [float(nemotron_h_cost(text_config, t)) for t in types]
    layers = [text_config.per_layer_config[i] if getattr(text_config, "is_heterogeneous", False) else text_config
              for i in range(len(types))]  # a layer's own head sizes where they differ (Gemma 4's global layers)
    return [float(attention_cost(c, t) + mlp_cost(c, i)) for i, (c, t) in enumerate(zip(layers, types))]


def matmul_costs(text_config) -> tuple[float, float]:
    """``(mean decoder layer, LM head)`` cost per token, as the weights each multiplies by (proportional to its
    FLOPs): the mean of :func:`layer_costs`, and ``hidden x vocab`` for the head.

    Raises:
        ValueError: as :func:`layer_costs`.
    """
    costs = layer_costs(text_config)
    return sum(costs) / len(costs), float(text_config.hidden_size * text_config.vocab_size)
