"""Cost profiles at scale from published hardware figures (issue 18): what one micro-batch of a Qwen2.5-VL-style
vision-language model costs on one GPU class, counted from the model's shapes, as a :class:`~.tune.Profile`.

Pure Python, no torch: the FLOPs, parameter counts and activation bytes are closed forms in the HF config's
sizes (``tests/test_at_scale.py`` checks them against ``torch.utils.flop_counter`` and the meta-device counts of
real HF modules), and the times are FLOPs over an assumed share of the datasheet peak. Every figure's source is
in the docstring of the field that holds it; every assumption says so.

Conventions: a FLOP is one multiply or one add (a multiply-add is 2); "forward" counts the matmuls of one
micro-batch (``2 * weights * tokens`` for a linear layer plus the attention scores and their weighted sum), the
backward twice the forward (an input gradient and a weight gradient per matmul, each the forward's size;
Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
appendix), and the *weight* part of a backward the weight-gradient matmuls alone (``2 * weights * tokens``,
what a zero-bubble schedule defers; Qi et al., 2024, "Zero Bubble Pipeline Parallelism", ICLR). Norms, rotary
tables, activations, the embedding lookup and the loss's softmax are left out: memory-bound kernels whose time
the compute efficiency absorbs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .tune import Profile

GIB = 2**30


@dataclass(frozen=True)
class Cluster:
    """One GPU class and its links. Published figures, unless the attribute says "assumption".

    Attributes:
        name: for the report.
        peak_flops: dense bf16 tensor-core peak per GPU, FLOP/s. H100 SXM5: 989.4 TFLOPS (1,979 with 2:4
            sparsity, which dense training does not use); NVIDIA H100 Tensor Core GPU datasheet.
        compute_efficiency: assumption: the share of ``peak_flops`` that a decoder layer's or the tower's
            forward and backward reach, counted as model FLOPs over time (so it absorbs the memory-bound kernels
            left out of the count). 0.5: above end-to-end MFU reports, which also lose the pipeline bubbles
            and the communication this simulation adds back (38-43% bf16 MFU for Llama 3 405B on 8K-16K H100s;
            Dubey et al., 2024, "The Llama 3 Herd of Models", table 4), and below the peak, since attention,
            the norms and the other memory-bound kernels run slower than dense GEMMs.
        memory_bytes: device memory. 80 GB HBM3 (datasheet), taken as 80 GiB, as ``mpipe-hf plan`` does.
        memory_headroom: assumption: the share of ``memory_bytes`` kept free (allocator fragmentation, the CUDA
            context, NCCL buffers); 0.1, as :meth:`~mpipe_hf.train.plan.Plan.fits`.
        gpus_per_node: 8, an HGX/DGX H100 baseboard (NVIDIA DGX H100 user guide).
        nvlink_bytes_per_s: NVLink 4 per GPU and direction: 450 GB/s (900 GB/s total, both directions, over 18
            links of 25 GB/s each way; datasheet), through NVSwitch to any GPU of the node.
        nvlink_efficiency: assumption: the share of ``nvlink_bytes_per_s`` one NCCL P2P transfer or ring
            collective reaches, 0.8 (about 360 GB/s).
        nvlink_latency_s: assumption: the fixed cost of one NCCL send/recv or ring step within a node, 10 us
            (kernel launch plus protocol handshake; NCCL's small-message latencies are a few us).
        ib_bytes_per_s: InfiniBand NDR, 400 Gb/s = 50 GB/s per GPU and direction: one ConnectX-7 400G NIC per
            GPU on DGX H100 (DGX H100 user guide; NVIDIA ConnectX-7 datasheet).
        ib_efficiency: assumption: 0.8 of line rate (about 40 GB/s) for a transfer or a ring collective
            crossing nodes.
        ib_latency_s: assumption: 20 us per transfer or ring step across nodes (the NIC, one switch hop, NCCL's
            proxy).
    """

    name: str = "H100 SXM5 80GB, NVLink 4 + NDR InfiniBand"
    peak_flops: float = 989.4e12
    compute_efficiency: float = 0.5
    memory_bytes: float = 80 * GIB
    memory_headroom: float = 0.1
    gpus_per_node: int = 8
    nvlink_bytes_per_s: float = 450e9
    nvlink_efficiency: float = 0.8
    nvlink_latency_s: float = 10e-6
    ib_bytes_per_s: float = 50e9
    ib_efficiency: float = 0.8
    ib_latency_s: float = 20e-6

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s: ``peak_flops * compute_efficiency``."""
        return self.peak_flops * self.compute_efficiency

    @property
    def memory_budget_bytes(self) -> float:
        """What a rank may hold: ``memory_bytes * (1 - memory_headroom)``."""
        return self.memory_bytes * (1 - self.memory_headroom)

    def link(self, within_node: bool) -> tuple[float, float]:
        """``(latency s, achieved bytes/s)`` of one link: NVLink within a node, else InfiniBand."""
        if within_node:
            return self.nvlink_latency_s, self.nvlink_bytes_per_s * self.nvlink_efficiency
        return self.ib_latency_s, self.ib_bytes_per_s * self.ib_efficiency

    def pipeline_link(self, pp_size: int) -> tuple[float, float]:
        """The link of a pipeline's P2P transfers, with each pipeline on consecutive GPUs: NVLink when it fits
        in a node, else InfiniBand for every transfer (one simulator link; conservative, since only the hops
        that cross a node boundary take InfiniBand)."""
        return self.link(pp_size <= self.gpus_per_node)

    def ring_seconds(self, nbytes: float, ranks: int, within_node: bool) -> float:
        """One ring reduce-scatter or all-gather of ``nbytes`` (the full buffer) over ``ranks`` GPUs:
        ``(ranks - 1) * (latency + nbytes / ranks / bandwidth)`` (each GPU sends ``(ranks - 1) / ranks`` of the
        buffer; Patarasuk and Yuan, 2009, "Bandwidth optimal all-reduce algorithms for clusters of
        workstations"). Across nodes the ring's slowest link, a NIC, sets the pace."""
        if ranks <= 1:
            return 0.0
        latency, bandwidth = self.link(within_node)
        return (ranks - 1) * (latency + nbytes / ranks / bandwidth)


@dataclass(frozen=True)
class TextShape:
    """The decoder's sizes (the HF text config's ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``vocab_size``, ``tie_word_embeddings``).
    ``qkv_bias``: the q, k and v projections carry a bias (Qwen2 and Qwen2.5 do)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0
    tied: bool = False
    qkv_bias: bool = True

    @property
    def dim(self) -> int:
        """Per-head width: ``head_dim``, else ``hidden // heads``."""
        return self.head_dim or self.hidden // self.heads


@dataclass(frozen=True)
class VisionShape:
    """The Qwen2.5-VL vision tower's sizes (``Qwen2_5_VLVisionConfig``): ``depth`` blocks of width ``hidden``
    with a gated MLP of ``intermediate``, ``heads`` heads; Conv3d patches of ``temporal_patch x patch x patch``
    over ``in_channels``; blocks in ``full_blocks`` attend over a whole image, the others within windows of
    ``window`` pixels; the merger folds ``merge x merge`` patches into one token of ``out_hidden``."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch: int
    temporal_patch: int
    merge: int
    window: int
    full_blocks: tuple[int, ...]
    out_hidden: int
    in_channels: int = 3


def shapes_from_config(config) -> tuple[TextShape, VisionShape | None]:
    """The shapes of an HF config object (``Qwen2_5_VLConfig``, or a text-only config: no tower)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    shape = TextShape(hidden=text.hidden_size, intermediate=text.intermediate_size, layers=text.num_hidden_layers,
                      heads=text.num_attention_heads,
                      kv_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
                      vocab=text.vocab_size, head_dim=getattr(text, "head_dim", None) or 0,
                      tied=bool(getattr(config, "tie_word_embeddings", False)
                                or getattr(text, "tie_word_embeddings", False)),
                      qkv_bias=bool(getattr(text, "attention_bias", True)))
    v = getattr(config, "vision_config", None)
    if v is None:
        return shape, None
    return shape, VisionShape(depth=v.depth, hidden=v.hidden_size, intermediate=v.intermediate_size,
                              heads=v.num_heads, patch=v.patch_size, temporal_patch=v.temporal_patch_size,
                              merge=v.spatial_merge_size, window=v.window_size,
                              full_blocks=tuple(v.fullatt_block_indexes), out_hidden=v.out_hidden_size,
                              in_channels=v.in_channels)


@dataclass(frozen=True)
class Workload:
    """What one sample is, and how a step batches samples (assumptions the caller states).

    Attributes:
        tokens: sequence length of one sample, image tokens included.
        images: images per sample, each ``image_height x image_width`` pixels (a multiple of ``patch * merge``,
            as Qwen2.5-VL's processor resizes to).
        micro_batch: samples per micro-batch.
        global_batch: samples per optimizer step, over all data-parallel replicas.
    """

    tokens: int = 4096
    images: int = 4
    image_height: int = 448
    image_width: int = 448
    micro_batch: int = 1
    global_batch: int = 128

    def grids(self, vision: VisionShape) -> list[tuple[int, int, int]]:
        """``(frames, rows, columns)`` of patches of every image of one micro-batch (a still image is one
        frame, copied ``temporal_patch`` times into the Conv3d's depth, as the processor does).

        Raises:
            ValueError: an image side that is not a multiple of ``patch * merge``, or more image tokens than
                ``tokens``.
        """
        step = vision.patch * vision.merge
        if self.image_height % step or self.image_width % step:
            raise ValueError(f"image_height and image_width must be multiples of patch * merge = {step}, got "
                             f"{self.image_height} x {self.image_width}")
        grid = (1, self.image_height // vision.patch, self.image_width // vision.patch)
        out = [grid] * (self.images * self.micro_batch)
        if self.image_tokens(vision) > self.tokens * self.micro_batch:
            raise ValueError(f"{self.images} images of {self.image_height} x {self.image_width} make "
                             f"{self.image_tokens(vision) // self.micro_batch} image tokens, more than tokens = "
                             f"{self.tokens}")
        return out

    def patches(self, vision: VisionShape) -> int:
        """Vision patches of one micro-batch."""
        step = vision.patch
        return self.images * self.micro_batch * (self.image_height // step) * (self.image_width // step)

    def image_tokens(self, vision: VisionShape) -> int:
        """Image tokens of one micro-batch: its patches over ``merge**2``."""
        return self.patches(vision) // vision.merge**2

    def num_micro(self, dp_size: int) -> int:
        """``M`` per replica: ``global_batch / (dp_size * micro_batch)``.

        Raises:
            ValueError: the global batch does not split evenly.
        """
        if self.global_batch % (dp_size * self.micro_batch):
            raise ValueError(f"global_batch = {self.global_batch} is not a multiple of dp_size * micro_batch = "
                             f"{dp_size * self.micro_batch}")
        return self.global_batch // (dp_size * self.micro_batch)


@dataclass(frozen=True)
class Flops:
    """FLOPs of one block on one micro-batch: ``forward``, ``backward`` (input and weight gradients) and
    ``weight``, the weight-gradient part of the backward."""

    forward: float
    backward: float
    weight: float


def decoder_layer_matmul_params(text: TextShape) -> int:
    """Weights one token multiplies by in a decoder layer: q, k, v, o projections and the gated MLP
    (``gate``, ``up``, ``down``)."""
    h, d = text.hidden, text.dim
    return 2 * h * text.heads * d + 2 * h * text.kv_heads * d + 3 * h * text.intermediate


def decoder_layer_params(text: TextShape) -> int:
    """Parameters of one decoder layer: the matmul weights, the q/k/v biases and the two RMSNorm weights."""
    bias = (text.heads + 2 * text.kv_heads) * text.dim if text.qkv_bias else 0
    return decoder_layer_matmul_params(text) + bias + 2 * text.hidden


def attention_flops(width: int, lengths: list[int], causal: bool) -> float:
    """Scores ``Q K^T`` and their weighted sum ``P V`` over sequences of ``lengths`` tokens, ``width`` the
    query heads times the head width: ``4 * width * L**2`` per sequence, half of it when ``causal`` (what a
    causal FlashAttention kernel computes; an eager, masked kernel computes all of it)."""
    return sum(4.0 * width * n * n for n in lengths) * (0.5 if causal else 1.0)


def decoder_layer_flops(text: TextShape, seq_len: int, batch: int = 1, causal: bool = True) -> Flops:
    """One decoder layer on ``batch`` sequences of ``seq_len`` tokens (causal attention over each)."""
    linear = 2.0 * decoder_layer_matmul_params(text) * seq_len * batch
    forward = linear + attention_flops(text.heads * text.dim, [seq_len] * batch, causal)
    return Flops(forward, 2 * forward, linear)


def head_params(text: TextShape) -> int:
    """The final RMSNorm and the LM head (``hidden x vocab``; counted even when tied, since pipeline stages keep
    their own copy)."""
    return text.hidden + text.hidden * text.vocab


def embedding_params(text: TextShape) -> int:
    """The token embedding, ``vocab x hidden``."""
    return text.vocab * text.hidden


def head_flops(text: TextShape, tokens: int) -> Flops:
    """The LM head's matmul over ``tokens`` tokens: ``2 * hidden * vocab`` per token forward."""
    forward = 2.0 * text.hidden * text.vocab * tokens
    return Flops(forward, 2 * forward, forward)


def vision_matmul_params(vision: VisionShape) -> tuple[int, int, int]:
    """``(patch embedding per patch, one block per patch, merger per output token)``: the weights each
    multiplies by (Conv3d kernel; qkv, proj and the gated MLP; the merger's two linear layers)."""
    w, i, unit = vision.hidden, vision.intermediate, vision.merge**2
    embed = vision.in_channels * vision.temporal_patch * vision.patch**2 * w
    block = 3 * w * w + w * w + 3 * w * i
    merger = unit * w * unit * w + unit * w * vision.out_hidden
    return embed, block, merger


def vision_params(vision: VisionShape) -> int:
    """Parameters of the tower: patch embedding (no bias), every block (two RMSNorms, qkv and proj with
    biases, the MLP with biases), the merger (RMSNorm, two linear layers with biases). The rotary table has
    no parameters."""
    w, i, unit = vision.hidden, vision.intermediate, vision.merge**2
    embed, block, merger = vision_matmul_params(vision)
    block += 2 * w + 3 * w + w + 2 * i + w
    merger += w + unit * w + vision.out_hidden
    return embed + vision.depth * block + merger


def window_lengths(vision: VisionShape, grid: tuple[int, int, int]) -> list[int]:
    """Patches in each attention window of one image of ``grid`` patches: windows of
    ``window // merge // patch`` merged tokens on a side, the last row and column of windows cut to the image,
    per frame (``transformers.vision_utils.get_vision_window_index``)."""
    frames, rows, cols = grid
    side = vision.window // vision.merge // vision.patch
    merged_rows, merged_cols = rows // vision.merge, cols // vision.merge
    out = []
    for _ in range(frames):
        for r in range(0, merged_rows, side):
            for c in range(0, merged_cols, side):
                out.append(min(side, merged_rows - r) * min(side, merged_cols - c) * vision.merge**2)
    return out


def vision_flops(vision: VisionShape, grids: list[tuple[int, int, int]]) -> Flops:
    """The tower on images of ``grids`` patches: the patch embedding, every block's matmuls and attention (full
    attention per frame in ``full_blocks``, window attention elsewhere), and the merger. The backward counts
    twice the forward and the weight part every matmul's forward once (the patch embedding's input gradient,
    which nothing needs, is counted too: an upper bound by one Conv3d)."""
    embed, block, merger = vision_matmul_params(vision)
    patches = sum(t * h * w for t, h, w in grids)
    linear = 2.0 * (patches * (embed + vision.depth * block) + patches // vision.merge**2 * merger)
    frames = [h * w for t, h, w in grids for _ in range(t)]
    windows = [n for g in grids for n in window_lengths(vision, g)]
    full = len([b for b in vision.full_blocks if b < vision.depth])
    attention = (full * attention_flops(vision.hidden, frames, False)
                 + (vision.depth - full) * attention_flops(vision.hidden, windows, False))
    forward = linear + attention
    return Flops(forward, 2 * forward, linear)


def decoder_layer_activation_bytes(text: TextShape, tokens: int, dtype_bytes: int = 2) -> float:
    """What one decoder layer saves for its backward on ``tokens`` tokens, with activations of ``dtype_bytes``
    and a fused attention kernel (FlashAttention keeps q, k, v, its output and a float32 log-sum-exp per row
    and head, not the ``L x L`` probabilities). Counted tensor by tensor from the HF ``Qwen2`` layer:

    - each RMSNorm (2): the float32 copy of its input (``pow`` and the ``rsqrt`` product), the float32
      ``rsqrt`` per token, the normalised input in ``dtype`` (the weight product) and its output (the next
      matmul's input): ``4h + 4 + 2 * b * h``;
    - attention: q (``heads * dim``), k and v (``kv_heads * dim`` each), the rotary ``cos`` and ``sin``
      (``dim`` each), the kernel's output (``o_proj``'s input), all ``b`` bytes, and the log-sum-exp;
    - the MLP: ``gate`` and ``up`` outputs, SiLU's output and the product (``down``'s input), ``4 * b * I``.

    With ``dtype_bytes = 4`` this is exactly what ``mpipe_hf.train.plan.meta_activation_bytes`` counts on the
    meta device (``tests/test_at_scale.py``); in bf16 it is the same list at 2 bytes, the norms' float32 copies
    kept (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models", count the
    same way for GPT: ``34 * s * b * h`` with dropout masks and a 4h MLP).
    """
    h, d, b = text.hidden, text.dim, dtype_bytes
    norms = 2 * (4 * h + 4 + 2 * b * h)
    attention = b * (text.heads * d + 2 * text.kv_heads * d + 2 * d + text.heads * d) + 4 * text.heads
    return float(tokens * (norms + attention + 4 * b * text.intermediate))


def head_activation_bytes(text: TextShape, tokens: int, dtype_bytes: int = 2) -> float:
    """What the final norm, the LM head and the loss save on ``tokens`` tokens: the norm's (as in a layer), the
    float32 log-softmax over the vocabulary that the cross-entropy keeps (HF's loss upcasts the logits), its int64
    targets, and three float32 scalars (the reduction's); exact against ``meta_activation_bytes`` at
    ``dtype_bytes = 4``."""
    h, b = text.hidden, dtype_bytes
    return float(tokens * (4 * h + 4 + 2 * b * h + 4 * text.vocab + 8) + 12)


def vision_activation_bytes(vision: VisionShape, patches: int, dtype_bytes: int = 2) -> float:
    """What the tower saves for its backward on ``patches`` patches (a trainable tower's graph): per block the
    decoder layer's list (:func:`decoder_layer_activation_bytes`) at the tower's width with full multi-head
    attention, and the merger's input, hidden and GELU output. An estimate: the tower's rotary upcasts q and k
    to float32, which this does not count."""
    shape = TextShape(hidden=vision.hidden, intermediate=vision.intermediate, layers=vision.depth,
                      heads=vision.heads, kv_heads=vision.heads, vocab=0)
    merger = patches * dtype_bytes * vision.hidden * 3
    return vision.depth * decoder_layer_activation_bytes(shape, patches, dtype_bytes) + merger


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


def zero1_state_bytes(trained_params: float, dp_size: int, frozen_params: float = 0.0,
                      grad_params: float | None = None) -> float:
    """Bytes one rank holds for its parameters under mixed-precision AdamW with ZeRO stage 1 (optimizer states
    sharded over the ``dp_size`` replicas; Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward
    Training Trillion Parameter Models", section 3.1 and figure 1: ``2 + 2 + K / N_d`` bytes per parameter,
    ``K = 12``: fp32 master weight, momentum and variance): bf16 weights and gradients of ``trained_params``, their
    optimizer states over ``dp_size``, bf16 weights of ``frozen_params``, and a bf16 gradient buffer for
    ``grad_params`` replicas that backprop without an optimizer (``None``: none)."""
    return (trained_params * (4 + 12 / dp_size) + 2 * frozen_params
            + (2 * grad_params if grad_params else 0.0))


def zero1_sync_seconds(grad_params: float, dp_size: int, cluster: Cluster, within_node: bool) -> float:
    """The data-parallel exchange of one step under ZeRO stage 1, after the pipeline: a ring reduce-scatter of
    the bf16 gradients, each replica updating its shard, then a ring all-gather of the updated bf16 weights;
    the volume of one all-reduce (Rajbhandari et al., 2020, section 7: ZeRO-DP's stage 1 moves ``2 * Psi``
    per step, as plain data parallelism does). ``grad_params`` is the rank's
    trained parameter count; nothing overlaps with compute (an upper bound: frameworks overlap the
    reduce-scatter with the last backwards)."""
    nbytes = 2.0 * grad_params
    return 2 * cluster.ring_seconds(nbytes, dp_size, within_node)


def dp_group_within_node(pp_size: int, dp_size: int, gpus_per_node: int) -> bool:
    """Whether a data-parallel group (pipeline rank ``r`` of every replica, GPUs ``d * pp_size + r``) lies in
    one node when the replicas' pipelines fill consecutive GPUs."""
    return math.ceil(pp_size * dp_size / gpus_per_node) <= 1 or dp_size == 1
