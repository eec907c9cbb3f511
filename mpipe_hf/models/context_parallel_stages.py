"""Context parallelism put on a rank's stages: each :class:`~.decoder.DecoderStage` cuts its micro-batches'
sequence over the CP group and its layers attend through the Ulysses wrapper (:mod:`.sequence_split` holds the cut
itself, :mod:`mpipe_hf.runtime.context_parallel` the attention), and what a stage cannot cut yet is refused by name.
"""

from __future__ import annotations

from torch.distributed.fsdp import FSDPModule

from ..runtime.context_parallel import use_ulysses
from .decoder import DecoderStage
from .sequence_split import CUTS_WITH_SEQUENCE


# where a stage class can hand its layers per-token inputs: the two hooks, and the layer loops it may override
# (ERNIE 4.5-VL's loop hands every layer the whole sequence's token types)
HOOKS = ("after_layer", "layer_kwargs", "run_layers", "_layers")


def check_splittable(stage) -> None:
    """Raise NotImplementedError, naming the stage class, for what a stage cannot cut yet: per-token inputs between
    layers, from hooks (``after_layer``, ``layer_kwargs``) or layer loops (``run_layers``, ``_layers``) of a class that does not declare, in its own body, that
    they cut with the sequence (:data:`~.sequence_split.CUTS_WITH_SEQUENCE`: Qwen3-VL's DeepStack and Gemma 4's
    per-layer inputs do; Gemma 3n's AltUp streams do not). The MoE router sums are cut
    with the sequence and summed over the CP group before the load-balancing term (:func:`~.moe.aux_loss`)."""
    cls = type(stage)
    if issubclass(cls, FSDPModule):  # fully_shard's FSDP<class>: the stage's own class is the one it wraps
        cls = next(base for base in cls.__bases__ if base is not FSDPModule)
    hooks = [name for name in HOOKS if getattr(cls, name) is not getattr(DecoderStage, name)]
    if vars(cls).get(CUTS_WITH_SEQUENCE):  # declared by the class itself: a subclass may change what travels
        hooks = []
    if hooks:
        raise NotImplementedError(f"context parallelism does not cut {cls.__name__}'s "
                                  f"{', '.join(hooks)} yet; set parallel.cp_size: 1")


def split_sequences(stages, group) -> int:
    """Put every :class:`~.decoder.DecoderStage` inside ``stages`` (a rank's stage modules) under context
    parallelism over CP ``group``: each cuts its micro-batches' sequence and its layers attend through the Ulysses
    wrapper of the model's own attention (:func:`~mpipe_hf.runtime.context_parallel.use_ulysses`). Returns how
    many stages it set. Raises NotImplementedError for an attention the wrapper does not take (FlashAttention) and
    for what :func:`check_splittable` refuses."""
    count = 0
    for module in stages:
        for sub in module.modules():
            if isinstance(sub, DecoderStage):
                check_splittable(sub)
                sub.sequence_group = group
                use_ulysses(sub.text_config)
                count += 1
    return count

