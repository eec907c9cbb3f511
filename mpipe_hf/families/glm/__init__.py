"""GLM-4.xV and its kin: Qwen-VL's split (``model.visual`` sized by ``image_grid_thw``, M-RoPE positions computed
on the host) over a GLM decoder, whose video tokens are image tokens told apart by ``mm_token_type_ids``, so a
micro-batch never holds both images and videos. Types: ``glm4v`` (GLM-4.1V), ``glm4v_moe`` (GLM-4.5V), ``glm46v``
(GLM-4.6V), ``glm_ocr``, ``glmga`` (image-only), and ``glm5_next`` (refused)."""
