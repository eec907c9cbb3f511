"""Cost profiles at scale from published hardware figures: what one micro-batch of a Qwen2.5-VL-style
vision-language model costs on one GPU class, counted from the model's shapes, as a :class:`~.tune.Profile`.

Pure Python, no torch: the FLOPs, parameter counts and activation bytes are closed forms in the HF config's
sizes (``tests/test_at_scale.py`` checks them against ``torch.utils.flop_counter`` and the meta-device counts of
real HF modules), and the times are FLOPs over an assumed share of the datasheet peak. Every figure's source is
in the docstring of the field that holds it; every assumption says so.

The pieces live in sibling modules, and every name stays importable from here: :mod:`.cluster` (the GPU
class, its links, ZeRO stage 1's bytes and seconds), :mod:`.shapes` (the model's sizes and the workload) and
:mod:`.counts` (the closed forms and their FLOP conventions); this module puts them together into
:func:`figures_estimate`, and times expert parallelism's all-to-all (:func:`all_to_all_seconds`) and context
parallelism's (:func:`ulysses_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import GIB, Cluster, dp_group_within_node, zero1_state_bytes, zero1_sync_seconds
from .counts import (Flops, attention_flops, decoder_layer_activation_bytes, decoder_layer_flops,
                     decoder_layer_matmul_params, decoder_layer_params, embedding_params, head_activation_bytes,
                     head_flops, head_params, vision_activation_bytes, vision_flops, vision_matmul_params,
                     vision_params, window_lengths)
from .shapes import TextShape, VisionShape, Workload, shapes_from_config
from .tune import Profile

__all__ = ["GIB", "Cluster", "Estimate", "Flops", "TextShape", "VisionShape", "Workload", "attention_flops",
           "decoder_layer_activation_bytes", "decoder_layer_flops", "decoder_layer_matmul_params",
           "decoder_layer_params", "dp_group_within_node", "embedding_params", "figures_estimate",
           "head_activation_bytes", "head_flops", "head_params", "shapes_from_config", "vision_activation_bytes",
           "vision_flops", "vision_matmul_params", "vision_params", "window_lengths", "zero1_state_bytes",
           "zero1_sync_seconds", "all_to_all_seconds", "moe_all_to_all_seconds", "ulysses_seconds"]


@dataclass(frozen=True)
class Estimate:
    """A :class:`~.tune.Profile` with what it does not hold: the weight-gradient seconds of a layer, the head
    and the tower (``None``: half of the backward, the zero-bubble default), the parameter counts the memory
    check and the data-parallel reduction need, and the bytes a layer or the tower keeps under full activation
    recomputation (its input)."""

    profile: Profile
    layer_weight_s: float | None
    head_weight_s: float | None
    preprocess_weight_s: float | None
    layer_params: int
    embed_params: int
    head_params: int
    preprocess_params: int
    layer_input_bytes: float
    preprocess_input_bytes: float


def figures_estimate(text: TextShape, vision: VisionShape | None, workload: Workload, cluster: Cluster,
                     pp_size: int, dtype_bytes: int = 2) -> Estimate:
    """The profile of one micro-batch of ``workload`` on ``cluster``'s GPUs, for a pipeline of ``pp_size``
    ranks (which sets the link), with activations and transfers of ``dtype_bytes`` (bf16: 2).

    Times are FLOPs over :attr:`Cluster.flops_per_s`: a decoder layer over ``tokens * micro_batch`` tokens
    (causal attention per sample), the LM head, the tower on the micro's images; the embedding, the output
    consumer and the per-stage masks and rotary tables cost 0 (memory-bound; absorbed). Bytes: a body message
    is the hidden states (``tokens * hidden * b``), ``P``'s output the image features
    (``image_tokens * hidden * b``), the raw inputs stage 0 reads the token ids, attention mask and labels
    (int64) and the M-RoPE position ids (3 x int64) per token, and ``P``'s input the float32 pixel patches.
    ``P``'s parameters travel in bf16 (``b`` bytes).
    """
    tokens = workload.tokens * workload.micro_batch
    rate = cluster.flops_per_s
    layer = decoder_layer_flops(text, workload.tokens, workload.micro_batch)
    head = head_flops(text, tokens)
    latency, bandwidth = cluster.pipeline_link(pp_size)
    tower, patches, image_tokens, graph, tower_act, tower_params = Flops(0.0, 0.0, 0.0), 0, 0, 0.0, 0.0, 0
    if vision is not None and workload.images:
        grids = workload.grids(vision)
        tower = vision_flops(vision, grids)
        patches, image_tokens = workload.patches(vision), workload.image_tokens(vision)
        per_patch = vision.in_channels * vision.temporal_patch * vision.patch**2
        graph = 4.0 * patches * per_patch + 8.0 * 3 * len(grids)
        tower_act = vision_activation_bytes(vision, patches, dtype_bytes)
    if vision is not None:
        tower_params = vision_params(vision)
    profile = Profile(
        num_layers=text.layers, layer_forward_s=layer.forward / rate, layer_backward_s=layer.backward / rate,
        preprocess_forward_s=tower.forward / rate, preprocess_backward_s=tower.backward / rate,
        head_forward_s=head.forward / rate, head_backward_s=head.backward / rate,
        activation_bytes=float(tokens * text.hidden * dtype_bytes),
        feature_bytes=float(image_tokens * text.hidden * dtype_bytes),
        data_bytes=float(tokens * 8 * 6 + 8 * 3 * workload.images * workload.micro_batch), graph_bytes=graph,
        preprocess_param_bytes=float(tower_params * dtype_bytes),
        layer_param_bytes=float(decoder_layer_params(text) * dtype_bytes),
        layer_activation_bytes=decoder_layer_activation_bytes(text, tokens, dtype_bytes),
        head_activation_bytes=head_activation_bytes(text, tokens, dtype_bytes),
        preprocess_activation_bytes=tower_act, latency_s=latency, bandwidth_bytes_per_s=bandwidth)
    tower_input = float(vision.depth * patches * vision.hidden * dtype_bytes) if vision is not None else 0.0
    return Estimate(profile, layer.weight / rate, head.weight / rate, tower.weight / rate,
                    decoder_layer_params(text), embedding_params(text), head_params(text), tower_params,
                    float(tokens * text.hidden * dtype_bytes), tower_input)


def all_to_all_seconds(nbytes: float, ep_size: int, cluster: Cluster = Cluster(), within_node: bool = True) -> float:
    """One all-to-all over an EP group of ``ep_size`` GPUs in which every GPU holds ``nbytes`` to scatter (the
    rows it routes, the same on every GPU): ``latency + nbytes * (ep_size - 1) / ep_size / bandwidth``. Each GPU
    keeps the ``1 / ep_size`` share bound for its own experts and sends the rest while it receives as much from
    its peers (balanced routing; the links are full duplex). ``latency, bandwidth`` are :meth:`Cluster.link`'s:
    NVLink 4 at 450 GB/s per GPU and direction through NVSwitch within a node, NDR InfiniBand at 50 GB/s per GPU
    across nodes (datasheets), both at the cluster's 0.8 efficiency (an assumption). That an all-to-all reaches
    the link's rate is measured for DeepEP's dispatch and combine kernels: 153 and 158 GB/s of the ~160 GB/s
    NVLink of an H800 at EP 8 within a node, 43 to 58 GB/s of a 50 GB/s 400 Gb/s NIC at EP 16 to 64
    (deepseek-ai/DeepEP, ``docs/legacy.md``, "Normal kernels with NVLink and RDMA forwarding"); torch's
    ``all_to_all_single`` over NCCL, which the runtime runs, is assumed to reach the same 0.8 as the cluster's
    other collectives. 0 for one GPU (nothing moves)."""
    if ep_size <= 1:
        return 0.0
    latency, bandwidth = cluster.link(within_node)
    return latency + nbytes * (ep_size - 1) / ep_size / bandwidth


def moe_all_to_all_seconds(dispatch_bytes: float, ep_size: int, cluster: Cluster = Cluster(),
                           within_node: bool = True) -> tuple[float, float]:
    """``(forward, backward)`` seconds of one MoE layer's all-to-alls on one micro-batch under transformers'
    ``AllToAllEP`` (:mod:`mpipe_hf.models.expert_parallel`), ``dispatch_bytes`` being the rows a GPU routes
    (``tokens * top_k * hidden * bytes``). Forward: the per-expert counts (a latency: a few integers), the
    dispatch of the rows and the combine of the experts' outputs (the same size back); backward: the two
    all-to-alls' backwards, a combine and a dispatch of the gradients (the counts are not exchanged again). Each
    all-to-all is :func:`all_to_all_seconds`."""
    if ep_size <= 1:
        return 0.0, 0.0
    rows = all_to_all_seconds(dispatch_bytes, ep_size, cluster, within_node)
    counts = all_to_all_seconds(0.0, ep_size, cluster, within_node)
    return counts + 2 * rows, 2 * rows


def ulysses_seconds(query_bytes: float, kv_bytes: float, cp_size: int, cluster: Cluster = Cluster(),
                    within_node: bool = True) -> tuple[float, float]:
    """``(forward, backward)`` seconds of one attention layer's all-to-alls on one micro-batch under Ulysses context
    parallelism (:mod:`mpipe_hf.runtime.context_parallel`) over ``cp_size`` GPUs. Forward: the query's and the
    output's all-to-all, each GPU holding ``query_bytes`` (its slice of the sequence, every head), and the key's and
    the value's, ``kv_bytes`` (the KV heads, repeated where ``cp_size`` does not divide them); the backward runs the
    four transposed all-to-alls, of the same sizes. Each is :func:`all_to_all_seconds` (a GPU keeps ``1 /
    cp_size`` and exchanges the rest); 0 for one GPU."""
    if cp_size <= 1:
        return 0.0, 0.0
    one = 2 * (all_to_all_seconds(query_bytes, cp_size, cluster, within_node)
               + all_to_all_seconds(kv_bytes, cp_size, cluster, within_node))
    return one, one
