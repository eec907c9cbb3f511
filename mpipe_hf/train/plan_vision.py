"""The vision side of the config-only cost estimate (:func:`~.plan_estimate.estimate_profile`): ``P``'s parameters per
vision part, the patches the tower encodes per image token, and a frozen ViT's smaller backward.
"""

from __future__ import annotations

import dataclasses

from ..families.registry import family
from ..schedule.tune import Profile

VISION_TOWERS = ("visual", "vision_tower", "vision_model")  # Qwen-VL, GLM-4V | LLaVA, InternVL, Gemma 3 | Idefics3
PROJECTORS = ("multi_modal_projector", "connector")  # outside the tower (LLaVA, InternVL, Gemma 3 | Idefics3)


def vision_parts(model, model_type: str | None = None) -> list[int]:
    """Parameters (elements) of ``P``'s vision parts, the tower first: the FQNs ``model_type``'s family declares
    (:attr:`~mpipe_hf.models.family.Family.vision`: tower, projector, bare parameters); for a family without
    that declaration, the outermost module named one of :data:`VISION_TOWERS` and the first named one of
    :data:`PROJECTORS` (the projector into the text model's width when the tower does not hold it).

    Raises:
        ValueError: no declared FQN and no module of ``model`` has a tower's name.
    """
    fqns = list(getattr(family(model_type), "vision", ()) or ())
    if not fqns:
        named = [(name, name.rsplit(".", 1)[-1]) for name, _ in model.named_modules()]
        towers = [name for name, last in named if last in VISION_TOWERS]
        if not towers:
            raise ValueError(f"{type(model).__name__}: no vision tower (a module named one of {VISION_TOWERS})")
        fqns = towers[:1] + [name for name, last in named if last in PROJECTORS][:1]
    params = list(model.named_parameters())
    return [sum(p.numel() for n, p in params if n == fqn or n.startswith(fqn + ".")) for fqn in fqns]


def _side(value) -> int:
    return value[0] if isinstance(value, (tuple, list)) else value


def patches_per_image_token(config) -> float:
    """How many patches the tower encodes per image token the decoder sees: ``spatial_merge_size**2`` (Qwen2-VL
    to Qwen3.5, GLM-4V merge 2x2 patches), ``1 / downsample_ratio**2`` (InternVL's pixel shuffle),
    ``scale_factor**2`` (Idefics3, SmolVLM), patches per image over ``mm_tokens_per_image`` (Gemma 3 pools), else
    1 (LLaVA: a token per patch)."""
    vision = config.vision_config
    if getattr(vision, "spatial_merge_size", None):
        return float(vision.spatial_merge_size ** 2)
    if getattr(config, "downsample_ratio", None):
        return 1.0 / config.downsample_ratio ** 2
    if getattr(config, "scale_factor", None):
        return float(config.scale_factor ** 2)
    if getattr(config, "mm_tokens_per_image", None):
        return (_side(vision.image_size) // _side(vision.patch_size)) ** 2 / config.mm_tokens_per_image
    return 1.0


def with_frozen_vit(profile: Profile, shadow, config, image_tokens: int, rate: float) -> Profile:
    """``profile`` with ``train.freeze_vit``: ``P``'s backward runs through the projector alone
    (:func:`~mpipe_hf.models.freeze.parts`' ``aligner``, ``4 * weights * image_tokens`` FLOPs), only its
    weights are broadcast and reduced, and its graph holds the projector's input and hidden per image token
    (fp32, the tower's width times the patches merged into a token, twice)."""
    from ..models.freeze import matches, parts
    aligner = parts(family(config.model_type), shadow)["aligner"]
    weights = sum(p.numel() for n, p in shadow.named_parameters() if any(matches(n, f) for f in aligner))
    vision = config.vision_config
    width = getattr(vision, "embed_dim", None) or vision.hidden_size
    graph = 2 * 4.0 * image_tokens * patches_per_image_token(config) * width if weights else 0.0
    return dataclasses.replace(profile, preprocess_backward_s=4 * weights * image_tokens / rate,
                               preprocess_param_bytes=4.0 * weights, preprocess_activation_bytes=graph)


def tower_units(vision) -> float:
    """The tower's blocks times their width, summed over its encoders (a SAM encoder and a ViT behind it are two,
    each a sub-config of ``vision``), for the plan's rough count of the tower's activations (per patch, as many
    bytes per block and hidden unit as a text layer's per token). A tower whose config gives no width or depth
    (a patch embedder) counts as one block of its embedding width (``mm_embed_dim``), else 0."""
    subs = [v for v in vars(vision).values() if hasattr(v, "to_dict") and hasattr(v, "model_type")]
    width = getattr(vision, "embed_dim", None) or getattr(vision, "hidden_size", None)
    if width is None and subs:
        return float(sum(tower_units(sub) for sub in subs))
    width = width or getattr(vision, "mm_embed_dim", None) or 0
    depth = getattr(vision, "depth", None) or getattr(vision, "num_hidden_layers", None) or 1
    return float(width * depth)
