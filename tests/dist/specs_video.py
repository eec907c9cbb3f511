"""The video cases: micro-batches of rows mixing images and videos (``common.make_video_pool``: real clips
made from the scikit-image photos, encoded with PyAV) through Qwen2.5-VL (``vl``), Qwen2-VL, Qwen3-VL and Qwen3.5
(per-frame timestamps; Qwen3-VL's DeepStack features of videos and images joined), their MoE models
(Qwen3-VL-MoE, Qwen3.5-MoE), and GLM-4.1V / GLM-4.6V
(per-temporal-patch times; micro-batches of videos and of images, never both: ``common.VIDEO_APART``), against the
unsplit model on one process: frozen, trainable (``T`` 0 and 1) and identity towers, the ViT frozen with the merger
trained (``freeze_vit``), padded and packed. ``R = 2``, ``V = 2``, ``M = 3``, 2 AdamW steps, every gradient
checked per tensor at the first and the last step (``matrix.check_case``)."""

from matrix import family_cases

VIT = {"freeze_vit": True}
# the configs whose video pools the fixture builds
VIDEO_CONFIGS = ("vl", "qwen2_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe",
                 "glm46v", "llava_onevision")
# (config, preprocess, T, Trainable keywords, case options)
VIDEO_SPECS = [
    ("vl", "frozen", 0, {}, {}), ("vl", "trainable", 1, {}, {}), ("vl", "trainable", 0, VIT, {}),
    ("vl", "identity", 0, {}, {}), ("vl", "frozen", 0, {}, {"packed": True}),
    ("vl", "trainable", 0, {}, {"packed": True}), ("qwen2_vl", "trainable", 0, {}, {}),
    ("qwen2_vl", "frozen", 1, {}, {"packed": True}),
    # Qwen3-VL (DeepStack: the videos' features joined to the images'; per-frame timestamps) and Qwen3.5
    ("qwen3_vl", "trainable", 0, {}, {}), ("qwen3_vl", "frozen", 1, {}, {"packed": True}),
    ("qwen3_vl", "trainable", 0, VIT, {"packed": True}), ("qwen3_5", "frozen", 0, {}, {}),
    # the MoE text models of the same towers: the experts' routing over video tokens
    ("qwen3_vl_moe", "trainable", 0, {}, {}), ("qwen3_5_moe", "frozen", 1, {}, {}),
    # GLM-4.1V and GLM-4.6V (a video's tokens are image tokens, typed 2 in mm_token_type_ids; each temporal patch
    # its own M-RoPE grid after its time)
    ("glm4v", "trainable", 0, {}, {}), ("glm4v", "frozen", 1, {}, {"packed": True}),
    ("glm46v", "trainable", 1, {}, {"packed": True}), ("glm4v_moe", "frozen", 0, {}, {}),
    # LLaVA-OneVision (each frame's features pooled 2 x 2, image_newline after each video; 4 frames a clip)
    ("llava_onevision", "frozen", 0, {}, {}), ("llava_onevision", "trainable", 1, {}, {"packed": True}),
    ("llava_onevision", "trainable", 0, VIT, {}),
]
# the negative control: the host drops Qwen2.5-VL's second_per_grid_ts (controls.py), so the videos' temporal
# M-RoPE positions are spaced as at one second a temporal patch; the check must fail
VIDEO_CONTROLS = [("vl", "frozen", 0, {}, {"no_video_time": True})]
# the second: Qwen3-VL's video DeepStack features after the images' (not in the tokens' order); must fail too
VIDEO_CONTROLS += [("qwen3_vl", "frozen", 0, {}, {"deepstack_apart": True})]


def video_cases(specs=None) -> list[dict]:
    """The cases of ``specs`` (default :data:`VIDEO_SPECS`) on the ``video-<config>`` pools."""
    cases = []
    for config, preprocess, text_layers, freeze, options in VIDEO_SPECS if specs is None else specs:
        case = family_cases([(config, preprocess, text_layers, None)], **options)[0]
        case.update(data=f"video-{config}", reload=False, name="video-" + case["name"].removeprefix("family-"))
        if freeze:
            case.update(freeze=freeze, name=case["name"] + "-" + "-".join(sorted(freeze)))
        cases.append(case)
    return cases
