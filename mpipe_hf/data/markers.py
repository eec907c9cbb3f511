"""A family's image markers named on the tokenizer (``tokenizer.image_token``, Gemma 3's ``boi_token``...), as a
checkpoint's ``tokenizer_config.json`` names them, for the stock processor classes that read them from the tokenizer.

Each marker is the token the config's id names where the config has one, else the hub token where the vocabulary
has it, else the Qwen2 special token that stands in for it (the family's :class:`~.family_data.FamilyData`
``tokens`` and ``config_ids``; the tiny configs use the same stand-ins). No token is ever added to the vocabulary.
"""

from __future__ import annotations

import copy

from ..families.registry import family_data


def token_of(tokenizer, config, model_type: str, name: str) -> str:
    """The token ``tokenizer.<name>`` should be (:mod:`mpipe_hf.data.markers`), for ``config.model_type == model_type``.

    Raises:
        ValueError: neither the hub token nor its stand-in is in the vocabulary.
    """
    declared = family_data(model_type)
    attr = declared.config_ids.get(name)
    token_id = getattr(config, attr, None) if attr else None
    if token_id is not None:
        return tokenizer.convert_ids_to_tokens(int(token_id))
    own = getattr(tokenizer, "_special_tokens_map", {}).get(name)
    if own is not None:
        return str(own)
    hub, stand_in = declared.tokens[name]
    vocab = tokenizer.get_vocab()
    for token in (hub, stand_in):
        if token in vocab:
            return token
    raise ValueError(f"{model_type}: the tokenizer has neither {hub!r} nor {stand_in!r} for its {name}")


def named_tokenizer(tokenizer, config):
    """``tokenizer`` with the image markers of ``config.model_type`` named (``tokenizer.image_token``,
    ``tokenizer.image_token_id``, ...; the family's ``FamilyData.tokens``), as a checkpoint's tokenizer names them in its
    ``tokenizer_config.json``. A copy when a name is missing or differs, else ``tokenizer`` itself; no token is
    added to the vocabulary (every name maps to a token already in it).

    Raises:
        ValueError: a marker has no token in the vocabulary (:func:`token_of`).
    """
    model_type = config.model_type
    declared = family_data(model_type)
    markers = declared.tokens if declared is not None else {}
    names = {name: token_of(tokenizer, config, model_type, name) for name in markers}
    current = getattr(tokenizer, "_special_tokens_map", {})
    if all(str(current.get(name)) == token for name, token in names.items()):
        return tokenizer
    named = copy.deepcopy(tokenizer)
    named._set_model_specific_special_tokens(names)
    return named

