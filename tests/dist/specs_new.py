"""CI cases of the new families (issue 38): (config name, preprocess, text_layers, layers_per_stage)."""

SPECS: list[tuple] = []
