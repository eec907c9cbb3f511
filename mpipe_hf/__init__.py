"""mpipe_hf: exact MPipe Transpose pipeline-parallel fine-tuning of Hugging Face vision-language models.

Layers (imports point down only): ``schedule`` (pure Python) -> ``runtime`` (torch.distributed)
-> ``models`` / ``data`` -> ``train``. The method: README.md and the MPipe Transpose design it cites.
"""

__version__ = "0.1.0"


def __getattr__(name):
    """``mpipe_hf.MPipeTrainer``, ``MPipeCallback``, ``MPipeConfig`` (:mod:`mpipe_hf.train.hf`), imported on first
    use so that ``import mpipe_hf`` stays light."""
    if name in ("MPipeTrainer", "MPipeCallback", "MPipeConfig"):
        from .train import hf
        return getattr(hf, name)
    raise AttributeError(f"module 'mpipe_hf' has no attribute {name!r}")
