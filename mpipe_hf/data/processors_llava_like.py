"""The data path of the llava_like families added in issue 38 (:class:`~.family_data.FamilyData` each): the stock
processor class over a PIL image processor (no torchvision), the family's chat template and its image markers.

Every processor is the stock class (through :func:`~.processors_vlm.conversation_class`, which accepts
``video_processor=None`` and saves what a hub snapshot holds) over :func:`~.processors_vlm.named_tokenizer`'s copy
of the tokenizer, the markers the family reads from it named after the config's ids or the Qwen2 special tokens
standing in (``tokens``). ShieldGemma 2's own processor writes its policy prompts and ignores the text it is given,
so its conversations go through Gemma 3's processor, whose encoding it reuses ("the same techniques as
``Gemma3Processor``", its docstring).

The templates (Jinja, for transformers' environment) follow the hub formats: VipLLaVA's ``###Human: <image>\\n...
###Assistant: ...``; Aya Vision's Cohere turns ``<|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|>``
(the turn markers stood in by ChatML's, the role tokens plain text); Gemma 3's for ShieldGemma 2; Vicuna's ``USER:
<image>\\n... ASSISTANT: ...</s>`` for LLaVA-NeXT-Video and Video-LLaVA; ChatML for Qianfan-OCR and LightOnOCR;
DeepSeek-VL's and Janus's ``User: <image_placeholder>...\\n\\nAssistant: ...``; GOT-OCR2's ChatML with its system
message (PP-Chart2Table's too: the same model, whose stock processor takes no conversation, so GOT-OCR2's serves);
Idefics2's ``User:<image>...<end_of_utterance>\\nAssistant: ...`` (Idefics3's without a BOS: Mistral's tokenizer
writes it). DeepSeek-OCR-2 has no hub template (its examples prompt ``<image>\\nFree OCR.``), so the format of its
DeepSeek-VL2 lineage serves: ``<|User|>: <image>\\n...\\n\\n<|Assistant|>: answer`` and the eos.
Where the hub writes nothing after an answer, the eos is written (as :mod:`.templates` does for GLM-4V), so the
encoder labels the turn's end.
"""

from __future__ import annotations

from transformers import (AriaProcessor, AyaVisionProcessor, DeepseekOcr2Processor, DeepseekVLHybridProcessor,
                          DeepseekVLProcessor, Gemma3Processor, GotOcr2Processor, Idefics2Processor, JanusProcessor,
                          LightOnOcrProcessor, LlavaNextVideoProcessor, LlavaProcessor, QianfanOCRProcessor,
                          VideoLlavaProcessor)
from transformers.processing_utils import ProcessorMixin

from .family_data import FamilyData
from .processors_vlm import _patch, _side, conversation_class, named_tokenizer
from .templates import BOS, CONTENT, _GEMMA3, GENERATION, chatml, _idefics

IMAGE = {"image_token": ("<image>", "<|image_pad|>")}




def _square(config) -> dict:
    return {"height": _side(config), "width": _side(config)}


def _roles(user: str, assistant: str, system: str, user_end: str, assistant_end: str, image: str, prompt: str,
           start: str = "") -> str:
    """A template of role headers (Jinja string expressions): ``start``, then per message its header, content
    (``image`` for each image part) and end; ``prompt`` as the generation prompt."""
    return (start +
            "{%- for message in messages -%}"
            "{%- if message['role'] == 'assistant' -%}{{- " + assistant + " -}}"
            "{%- elif message['role'] == 'system' -%}{{- " + system + " -}}"
            "{%- else -%}{{- " + user + " -}}{%- endif -%}" + CONTENT.replace("IMAGE", image) +
            "{%- if message['role'] == 'assistant' -%}{{- " + assistant_end + " -}}"
            "{%- else -%}{{- " + user_end + " -}}{%- endif -%}"
            "{%- endfor -%}" + GENERATION.replace("PROMPT", prompt))


# VipLLaVA (vip-llava-*-hf): "###Human: <image>\n... ###Assistant: answer"; the eos after each answer.
_VIPLLAVA = _roles("'###Human: '", "'###Assistant: '", "''", "''", "eos_token", "'IMAGE_TOKEN\\n'",
                   "'###Assistant:'")
# Vicuna (LLaVA-NeXT-Video, Video-LLaVA): "USER: <image>\n... ASSISTANT: answer</s>".
_VICUNA = _roles("'USER: '", "'ASSISTANT: '", "''", "' '", "eos_token", "'IMAGE_TOKEN\\n'", "'ASSISTANT:'")
# Aya Vision (CohereLabs/aya-vision-*): <BOS_TOKEN>, <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|>,
# <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>...<|END_OF_TURN_TOKEN|>; the turn markers are ChatML's in the Qwen2
# vocabulary (<|im_start|>, <|im_end|>), the role tokens plain text.
_AYA = _roles("'<|im_start|><|USER_TOKEN|>'", "'<|im_start|><|CHATBOT_TOKEN|>'", "'<|im_start|><|SYSTEM_TOKEN|>'",
              "'<|im_end|>'", "'<|im_end|>'", "'IMAGE_TOKEN'", "'<|im_start|><|CHATBOT_TOKEN|>'", BOS)
# DeepSeek-VL (deepseek-vl-*-chat-hf): "User: <image_placeholder>...\n\nAssistant: answer<｜end▁of▁sentence｜>".
_DEEPSEEK_VL = _roles("'User: '", "'Assistant: '", "''", "'\\n\\n'", "eos_token + '\\n\\n'", "'IMAGE_TOKEN'",
                      "'Assistant:'", BOS)

# DeepSeek-OCR-2 (DeepSeek-VL2's "deepseek" format): "<|User|>: <image>\n...\n\n<|Assistant|>: answer<eos>";
# <|User|> and <|Assistant|> plain text in the Qwen2 vocabulary.
_DEEPSEEK_VL2 = _roles("'<|User|>: '", "'<|Assistant|>: '", "''", "'\\n\\n'", "eos_token", "'IMAGE_TOKEN\\n'",
                       "'<|Assistant|>:'", BOS)


def _llava(config, tokenizer, image_processor):
    """VipLLaVA's processor (the hub's ``LlavaProcessor``): ``image_seq_length`` tokens an image, CLS dropped."""
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(LlavaProcessor, config.model_type)(
        image_processor, tok, patch_size=_patch(config), vision_feature_select_strategy="default",
        image_token=tok.image_token, num_additional_image_tokens=1)


def _clip_images(config, min_pixels, max_pixels):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    return CLIPImageProcessorPil(size={"shortest_edge": _side(config)}, crop_size=_square(config))


def _gemma3_images(config, min_pixels, max_pixels):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    return Gemma3ImageProcessorPil(size=_square(config))


def _gemma3(config, tokenizer, image_processor):
    return conversation_class(Gemma3Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), image_seq_length=config.mm_tokens_per_image)


def _tiles(config, min_pixels, max_pixels, max_patches: int = 4):
    """GOT-OCR2's tiling (Aya Vision, Qianfan-OCR): up to ``max_patches`` tower-side tiles and a thumbnail."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    return GotOcr2ImageProcessorPil(size=_square(config), crop_to_patches=True, min_patches=1,
                                    max_patches=max_patches)


def _aya(config, tokenizer, image_processor):
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(AyaVisionProcessor, config.model_type)(
        image_processor, tok, patch_size=_patch(config), img_size=_side(config),
        downsample_factor=config.downsample_factor, image_token="<image>", start_of_img_token=tok.start_of_img_token,
        end_of_img_token=tok.end_of_img_token, img_patch_token=tok.image_token,
        img_line_break_token=tok.img_line_break_token)


def _qianfan(config, tokenizer, image_processor):
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(QianfanOCRProcessor, config.model_type)(
        image_processor, tok, image_seq_length=config.image_seq_length,
        image_placeholder_token=tok.context_image_token)


class _ConversationGotOcr2Processor(GotOcr2Processor):
    """GOT-OCR2's processor for conversations: the image token the tokenizer names (the stock one reads
    ``<imgpad>``), ``image_seq_length`` tokens a tile (as the hub's ``processor_config.json`` sets
    ``num_image_tokens``), and rows without images accepted (the stock call builds its own OCR prompt and requires
    images). Images batched per row are taken in order, as one list (the stock call nests them for multi-page
    OCR only)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, image_seq_length: int = 256,
                 **kwargs):
        super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.image_seq_length = image_seq_length

    def __call__(self, images=None, text=None, **kwargs):
        if isinstance(images, (list, tuple)) and images and isinstance(images[0], (list, tuple)):
            images = [image for row in images for image in row] or None
        return super().__call__(images=images, text=text, num_image_tokens=self.image_seq_length, **kwargs)

    def prepare_inputs_layout(self, images=None, text=None, **kwargs):
        if images is None:
            return ProcessorMixin.prepare_inputs_layout(self, images=images, text=text, **kwargs)
        return super().prepare_inputs_layout(images=images, text=text, **kwargs)


def _got_images(config, min_pixels, max_pixels):
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    return GotOcr2ImageProcessorPil(size=_square(config), crop_to_patches=False)


def _got(config, tokenizer, image_processor):
    return conversation_class(_ConversationGotOcr2Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), image_seq_length=config.image_seq_length)


def _llava_next_images(config, min_pixels, max_pixels):
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    return LlavaNextImageProcessorPil(size={"shortest_edge": _side(config)}, crop_size=_square(config),
                                      image_grid_pinpoints=config.image_grid_pinpoints)


def _llava_next_video(config, tokenizer, image_processor):
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(LlavaNextVideoProcessor, config.model_type)(
        None, image_processor, tok, patch_size=_patch(config), image_token=tok.image_token,
        video_token=tok.video_token, vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=1)


def _deepseek_images(config, min_pixels, max_pixels):
    from transformers.models.deepseek_vl.image_processing_pil_deepseek_vl import DeepseekVLImageProcessorPil
    return DeepseekVLImageProcessorPil(size=_square(config))


def _deepseek(config, tokenizer, image_processor):
    return conversation_class(DeepseekVLProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), num_image_tokens=(_side(config) // _patch(config)) ** 2)


def _janus_images(config, min_pixels, max_pixels):
    from transformers.models.janus.image_processing_pil_janus import JanusImageProcessorPil
    return JanusImageProcessorPil(size=_square(config))


class _JanusProcessor(JanusProcessor):
    """Janus's processor with ``image_token_id`` (the id of its image token, which the stock one does not set)."""

    def __init__(self, image_processor, tokenizer, **kwargs):
        super().__init__(image_processor, tokenizer, **kwargs)
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)


def _janus(config, tokenizer, image_processor):
    return conversation_class(_JanusProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), num_image_tokens=config.vision_config.num_image_tokens)


def _hybrid_images(config, min_pixels, max_pixels):
    from transformers.models.deepseek_vl_hybrid.image_processing_pil_deepseek_vl_hybrid import \
        DeepseekVLHybridImageProcessorPil
    side = config.high_res_vision_config.image_size
    return DeepseekVLHybridImageProcessorPil(size=_square(config), high_res_size={"height": side, "width": side})


def _hybrid(config, tokenizer, image_processor):
    return conversation_class(DeepseekVLHybridProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), num_image_tokens=(_side(config) // _patch(config)) ** 2)


def _aria_images(config, min_pixels, max_pixels):
    from transformers.models.aria.image_processing_pil_aria import AriaImageProcessorPil
    side = _side(config)
    return AriaImageProcessorPil(max_image_size=side, min_image_size=side // 2, split_image=False)


class _AriaProcessor(AriaProcessor):
    """Aria's processor with the crop side its image processor sets (``max_image_size``; the stock class pins the
    hub's 980 px in its call defaults)."""

    images_kwargs = {"split_image": False}


def _aria(config, tokenizer, image_processor):
    queries = {_side(config): q for q in config.projector_patch_to_query_dict.values()}
    return conversation_class(_AriaProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), size_conversion=queries)


def _pixtral_images(config, min_pixels, max_pixels):
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
    return PixtralImageProcessorPil(size={"longest_edge": _side(config)},
                                    patch_size={"height": _patch(config), "width": _patch(config)})


def _lighton(config, tokenizer, image_processor):
    return conversation_class(LightOnOcrProcessor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), patch_size=_patch(config),
        spatial_merge_size=config.spatial_merge_size)


def _video_llava_images(config, min_pixels, max_pixels):
    from transformers.models.video_llava.image_processing_video_llava import VideoLlavaImageProcessor
    return VideoLlavaImageProcessor(size={"shortest_edge": _side(config)}, crop_size=_square(config))


class _VideoLlavaImages(VideoLlavaProcessor):
    """Video-LLaVA's processor with its images under the name its model's ``forward`` and
    ``get_image_features`` take (``pixel_values``; the stock call writes ``pixel_values_images``, which the model
    accepts as a deprecated alias)."""

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if "pixel_values_images" in out:
            out["pixel_values"] = out.pop("pixel_values_images")
        return out


def _video_llava(config, tokenizer, image_processor):
    tok = named_tokenizer(tokenizer, config)
    return conversation_class(_VideoLlavaImages, config.model_type)(
        image_processor, None, tok, patch_size=_patch(config), image_token=tok.image_token,
        video_token=tok.video_token, vision_feature_select_strategy=config.vision_feature_select_strategy)


def _idefics2_images(config, min_pixels, max_pixels):
    """Idefics2's resize (aspect ratio kept, longest edge the tower's side, shortest at least half of it; the hub's
    378 to 980 px), padded to the micro-batch's largest image with a pixel mask."""
    from transformers.models.idefics2.image_processing_pil_idefics2 import Idefics2ImageProcessorPil
    return Idefics2ImageProcessorPil(size={"shortest_edge": _side(config) // 2, "longest_edge": _side(config)})


class _ConversationIdefics2Processor(Idefics2Processor):
    """Idefics2's processor for conversations: the markers the tokenizer names (the stock one adds
    ``<fake_token_around_image>``, ``<image>`` and ``<end_of_utterance>`` to it), and ``ProcessorMixin``'s call,
    which returns each image's replacement (``text_replacement_offsets``; the stock call returns none): as the
    stock call writes an image, ``<fake_token_around_image>`` then, per view (5 with ``do_image_splitting``: 4
    crops and the image), ``image_seq_len`` image tokens and ``<fake_token_around_image>``. Not done here: the
    stock call's merging of the boundary tokens of two adjacent images and its space after an image that a word
    follows, both outside an image's own replacement."""

    def __init__(self, image_processor, tokenizer=None, image_seq_len: int = 64, chat_template=None, **kwargs):
        self.fake_image_token, self.image_token = tokenizer.image_boundary_token, tokenizer.image_token
        self.image_token_id, self.end_of_utterance_token = tokenizer.image_token_id, tokenizer.end_of_utterance_token
        self.image_seq_len = image_seq_len
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, **kwargs):
        return ProcessorMixin.__call__(self, images=images, text=text, **kwargs)

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        views = 5 if self.image_processor.do_image_splitting else 1
        return self.fake_image_token + (self.image_token * self.image_seq_len + self.fake_image_token) * views


def _idefics2(config, tokenizer, image_processor):
    return conversation_class(_ConversationIdefics2Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config),
        image_seq_len=config.perceiver_config.resampler_n_latents)


def _ocr2_images(config, min_pixels, max_pixels):
    """DeepSeek-OCR-2's global view (padded square, the SAM tower's side) and, for an image larger than a tile, its
    2 to 6 tiles of 3/4 of that side (the hub's 768 px of 1,024)."""
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil
    side = config.vision_config.sam_config.image_size
    return DeepseekOcr2ImageProcessorPil(size={"height": side, "width": side}, tile_size=side * 3 // 4)


def _ocr2(config, tokenizer, image_processor):
    return conversation_class(DeepseekOcr2Processor, config.model_type)(
        image_processor, named_tokenizer(tokenizer, config), patch_size=config.vision_config.sam_config.patch_size,
        downsample_ratio=4)  # the tower's two stride-2 convolutions


GEMMA3_TOKENS = {"image_token": ("<image_soft_token>", "<|image_pad|>"),
                 "boi_token": ("<start_of_image>", "<|vision_start|>"),
                 "eoi_token": ("<end_of_image>", "<|vision_end|>")}

# GOT-OCR2 / PP-Chart2Table (no hub template; the layout their processors build): ChatML with GOT's system
# message, each image "<img>" + its tokens + "</img>\n" (<img> and </img> plain text in the Qwen2 vocabulary).
_GOT = chatml("You should follow the instructions carefully and explain your answers in detail.",
               "'<img>IMAGE_TOKEN</img>\\n'")
GOT_TOKENS = {"image_token": ("<imgpad>", "<|image_pad|>")}

# Aria (rhymes-ai/Aria): ChatML, each image "<fim_prefix><|img|><fim_suffix>", which the Qwen2 vocabulary's
# <|fim_prefix|> / <|fim_suffix|> stand in for.
_ARIA = chatml(None, "'<|fim_prefix|>IMAGE_TOKEN<|fim_suffix|>'")

DATA: dict[str, FamilyData] = {
    "aria": FamilyData(_aria_images, _aria, _ARIA, "<|img|>", tokens=IMAGE, config_ids={"image_token": "image_token_id"},
                       repeated=True),
    "got_ocr2": FamilyData(_got_images, _got, _GOT, "<imgpad>", tokens=GOT_TOKENS,
                           config_ids={"image_token": "image_token_id"}, repeated=True),
    "pp_chart2table": FamilyData(_got_images, _got, _GOT, "<imgpad>", tokens=GOT_TOKENS,
                                 config_ids={"image_token": "image_token_id"}, repeated=True),
    "vipllava": FamilyData(_clip_images, _llava, _VIPLLAVA, tokens=IMAGE, config_ids={"image_token": "image_token_id"},
                           repeated=True),
    "shieldgemma2": FamilyData(_gemma3_images, _gemma3, _GEMMA3, "<start_of_image>", tokens=GEMMA3_TOKENS,
                               config_ids={"image_token": "image_token_index", "boi_token": "boi_token_index",
                                           "eoi_token": "eoi_token_index"}),
    "aya_vision": FamilyData(_tiles, _aya, _AYA, tokens={
        "image_token": ("<|IMG_PATCH|>", "<|image_pad|>"),
        "start_of_img_token": ("<|START_OF_IMG|>", "<|vision_start|>"),
        "end_of_img_token": ("<|END_OF_IMG|>", "<|vision_end|>"),
        "img_line_break_token": ("<|IMG_LINE_BREAK|>", "<|vision_pad|>")},
        config_ids={"image_token": "image_token_id"}),
    "qianfan_ocr": FamilyData(_tiles, _qianfan, chatml(None, "'IMAGE_TOKEN\\n'"), "<IMG_CONTEXT>", tokens={
        "context_image_token": ("<IMG_CONTEXT>", "<|image_pad|>"), "start_image_token": ("<img>", "<|vision_start|>"),
        "end_image_token": ("</img>", "<|vision_end|>")}, config_ids={"context_image_token": "image_token_id"}),
    "llava_next_video": FamilyData(_llava_next_images, _llava_next_video, _VICUNA, tokens={
        **IMAGE, "video_token": ("<video>", "<|video_pad|>")},
        config_ids={"image_token": "image_token_id", "video_token": "video_token_id"}, repeated=True),
    "video_llava": FamilyData(_video_llava_images, _video_llava, _VICUNA, tokens={
        **IMAGE, "video_token": ("<video>", "<|video_pad|>")},
        config_ids={"image_token": "image_token_id", "video_token": "video_token_id"}, repeated=True),
    "deepseek_vl": FamilyData(_deepseek_images, _deepseek, _DEEPSEEK_VL, "<image_placeholder>",
                              tokens={"image_token": ("<image_placeholder>", "<|image_pad|>")},
                              config_ids={"image_token": "image_token_id"}, repeated=True),
    "deepseek_vl_hybrid": FamilyData(_hybrid_images, _hybrid, _DEEPSEEK_VL, "<image_placeholder>",
                                     tokens={"image_token": ("<image_placeholder>", "<|image_pad|>")},
                                     config_ids={"image_token": "image_token_id"}, repeated=True),
    "janus": FamilyData(_janus_images, _janus, _DEEPSEEK_VL, "<image_placeholder>", tokens={
        "image_token": ("<image_placeholder>", "<|image_pad|>"), "boi_token": ("<begin_of_image>", "<|vision_start|>"),
        "eoi_token": ("<end_of_image>", "<|vision_end|>")}, config_ids={"image_token": "image_token_id"}),
    "idefics2": FamilyData(_idefics2_images, _idefics2, _idefics(""), tokens={
        **IMAGE, "image_boundary_token": ("<fake_token_around_image>", "<|vision_start|>"),
        "end_of_utterance_token": ("<end_of_utterance>", "<|im_end|>")}, config_ids={"image_token": "image_token_id"}),
    "deepseek_ocr2": FamilyData(_ocr2_images, _ocr2, _DEEPSEEK_VL2, tokens=IMAGE,
                                config_ids={"image_token": "image_token_id"}, repeated=True),
    "lighton_ocr": FamilyData(_pixtral_images, _lighton, chatml(None, "'IMAGE_TOKEN'"), "<|image_pad|>", tokens={
        "image_token": ("<|image_pad|>", "<|image_pad|>"), "image_break_token": ("<|vision_pad|>", "<|vision_pad|>"),
        "image_end_token": ("<|vision_end|>", "<|vision_end|>")}, config_ids={"image_token": "image_token_id"}),
}
