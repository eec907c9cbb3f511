"""The recipe's ``model`` section (:class:`ModelSource`): a checkpoint directory, or a config for random
initialisation, and the tokenizer's directory; checked against the file system on construction.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

WEIGHT_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME)  # each rank reads its own tensors from safetensors
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: a checkpoint, or a config for random initialisation.

    Attributes:
        name_or_path: a local Hugging Face checkpoint directory (``save_pretrained`` output or a hub snapshot):
            config, safetensors weights, tokenizer and, for a vision-language model, the image processor.
        config: a ``config.json`` file, or a directory holding one, for a randomly initialised model (``seed``).
        tokenizer: the directory with the tokenizer files; defaults to ``name_or_path``, or to ``config``'s
            directory. The image processor is the checkpoint's own (``name_or_path``) when it saved one, else it is
            built from the config.

    Raises:
        ValueError: a value that is not a non-empty string or null; not exactly one of ``name_or_path`` and
            ``config``; a path that does not exist; a checkpoint without ``config.json`` or weights; a ``tokenizer``
            that is not a directory (and, from :meth:`check_tokenizer`, a tokenizer directory without tokenizer
            files).
    """

    name_or_path: str | None = None
    config: str | None = None
    tokenizer: str | None = None

    def __post_init__(self):
        for key in ("name_or_path", "config", "tokenizer"):  # before the file system: os.path takes 5 for a descriptor
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"model.{key} must be a path (a non-empty string) or null, got {value!r}")
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("model needs exactly one of name_or_path (a checkpoint directory) and config (a "
                             "config.json for random initialisation)")
        if self.name_or_path is not None and not os.path.isdir(self.name_or_path):
            raise ValueError(f"model.name_or_path {self.name_or_path!r} is not a checkpoint directory")
        if self.name_or_path is not None:
            missing = [n for n, names in (("config.json", [CONFIG_NAME]), ("weights", WEIGHT_FILES))
                       if not any(os.path.isfile(os.path.join(self.name_or_path, f)) for f in names)]
            if missing:
                raise ValueError(f"model.name_or_path {self.name_or_path!r} has no {' and no '.join(missing)} "
                                 f"(weights: one of {WEIGHT_FILES}; a .bin checkpoint converts with "
                                 f"from_pretrained(...).save_pretrained(dir)); for random weights use model.config")
        if self.config is not None and not os.path.exists(self.config):
            raise ValueError(f"model.config {self.config!r} does not exist (a config.json or a directory with one)")
        if self.tokenizer is not None and not os.path.isdir(self.tokenizer):
            raise ValueError(f"model.tokenizer {self.tokenizer!r} is not a directory")

    def check_tokenizer(self) -> None:
        """Raise ``ValueError`` naming the field when the tokenizer directory holds no tokenizer (training needs
        one; ``mpipe-hf plan`` does not)."""
        if not any(os.path.isfile(os.path.join(self.tokenizer_dir, f)) for f in TOKENIZER_FILES):
            field = "model.tokenizer" if self.tokenizer or self.name_or_path is None else "model.name_or_path"
            raise ValueError(f"{field}: {self.tokenizer_dir!r} holds no tokenizer (none of {TOKENIZER_FILES}); set "
                             f"model.tokenizer to the directory with the tokenizer files")

    @property
    def tokenizer_dir(self) -> str:
        """Where the tokenizer and image-processor files are read from."""
        if self.tokenizer is not None:
            return self.tokenizer
        if self.name_or_path is not None:
            return self.name_or_path
        return self.config if os.path.isdir(self.config) else os.path.dirname(os.path.abspath(self.config))

    @classmethod
    def parse(cls, value) -> "ModelSource":
        """A recipe's ``model`` value: a checkpoint path, or ``{name_or_path | config, tokenizer}``.

        Raises:
            ValueError: another type, or unknown keys (the message lists the allowed ones).
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(name_or_path=value)
        allowed = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, dict) or set(value) - set(allowed):
            raise ValueError(f"model must be a checkpoint path or a mapping with keys {allowed}, got {value!r}")
        return cls(**value)
