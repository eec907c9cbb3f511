"""CI cases of the qwen_like families (issue 38): (config name, preprocess, text_layers, layers_per_stage)."""

SPECS: list[tuple] = []
