"""mpipe_hf: exact MPipe Transpose pipeline-parallel fine-tuning of Hugging Face vision-language models.

Layers (imports point down only): ``schedule`` (pure Python) -> ``runtime`` (torch.distributed)
-> ``models`` / ``data`` -> ``train``. See ../shared/SPEC.md for the method.
"""

__version__ = "0.1.0"
