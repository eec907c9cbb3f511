"""Model families, one package per group of shared architecture (``qwen``, ``glm``, ``gemma``, ``llava``...): each
holds its types' split declarations, data path, tiny configs and refusals (docs/adding_a_family.md), found through
:mod:`.registry`."""
