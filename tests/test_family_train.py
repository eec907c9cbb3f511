"""``mpipe-hf train`` on a tiny model of every generic-splitter family, built from its real config class, on the demo's
conversations (photos and captions), equals the unsplit model on one process: the losses and gradient norms of 2
steps, and the checkpoint reloads with ``from_pretrained`` to the one-process logits.

CI trains the demo (Qwen2.5-VL), the shipped Qwen3-VL-MoE recipe (tests/test_train.py) and the tiny recipes of
Gemma 3, GLM-4.1V, Idefics3 and Aria (tests/test_tiny_models.py) through ``mpipe-hf train``, and checks every
family's splitter exactly in tests/test_numerics.py; the whole list here runs with ``MPIPE_HF_FULL=1``.
"""

import os

import pytest

from mpipe_hf.families.glm import tiny as glm_tiny
from mpipe_hf.families.registry import tiny_config
from mpipe_hf.families.qwen import tiny as qwen_tiny
from train_common import train_tiny_family_like_one_process

FAMILIES = {"qwen3_5_moe": lambda tok: qwen_tiny.tiny_qwen3_5_config(tok, moe=True),
            "glm4v": glm_tiny.tiny_glm4v_config, "glm4v_moe": lambda tok: glm_tiny.tiny_glm4v_config(tok, moe=True),
            **{t: tiny_config(t) for t in ("gemma3", "paligemma", "internvl", "mistral3", "llava_next",
                                           "llava_onevision", "idefics3", "smolvlm")}}
FULL = os.environ.get("MPIPE_HF_FULL") == "1"


@pytest.mark.skipif(not FULL, reason="the full suite (MPIPE_HF_FULL=1); CI trains the demo, the Qwen3-VL-MoE "
                                     "recipe and the tiny Gemma 3, GLM-4.1V, Idefics3 and Aria recipes through "
                                     "mpipe-hf train, and checks every family's split in test_numerics.py")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_trains_through_the_cli_like_one_process(demo, tmp_path, family):
    train_tiny_family_like_one_process(demo, tmp_path, family, FAMILIES[family])
