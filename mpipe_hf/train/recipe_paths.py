"""Where a recipe file's relative paths point: the file's own folder, not the working directory.

:func:`load_recipe <mpipe_hf.train.recipe.load_recipe>` calls :func:`resolve_paths` on the mapping it read, before
any section is validated, so ``mpipe-hf train path/to/recipe.yaml`` reads the same files from any working
directory. A recipe built in code (:func:`~mpipe_hf.train.recipe.parse_recipe` of a mapping) has no file, and its
relative paths stay relative to the working directory.
"""

from __future__ import annotations

import os

# Every recipe field that names a file or a directory, by section; a value in NOT_PATHS is a keyword, not a path.
PATH_FIELDS = {"model": ("name_or_path", "config", "tokenizer"),
               "data": ("path", "eval_path", "images", "clean_rows"),
               "parallel": ("profile",), "train": ("output_dir", "resume")}
NOT_PATHS = {("train", "resume"): ("auto",)}
SHORTHANDS = {"model": "name_or_path", "data": "path"}  # `model: DIR` and `data: FILE` name one path alone


def resolve_path(value, folder: str):
    """``value`` joined to ``folder`` when it is a relative path (a non-empty string; ``~`` is expanded first),
    normalised; an absolute path, and anything that is not a non-empty string, are returned as they are (the
    section's validation names a bad value)."""
    if not isinstance(value, str) or not value:
        return value
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return expanded
    return os.path.normpath(os.path.join(folder, expanded))


def resolve_paths(raw, folder: str):
    """A copy of the recipe mapping ``raw`` (as read from YAML) whose relative path fields (:data:`PATH_FIELDS`,
    and the shorthands ``model: DIR`` and ``data: FILE``) are resolved against ``folder`` by
    :func:`resolve_path`; ``train.resume: auto`` stays a keyword. Anything that is not the expected mapping is left
    for the validation to report: ``raw`` itself when it is not a mapping, a section that is not one, a value
    that is not a string.
    """
    if not isinstance(raw, dict):
        return raw
    folder = os.path.abspath(folder)
    out = dict(raw)
    for section, keys in PATH_FIELDS.items():
        values = out.get(section)
        if isinstance(values, str) and section in SHORTHANDS:
            out[section] = resolve_path(values, folder)
        elif isinstance(values, dict):
            values = dict(values)
            for key in keys:
                if key in values and values[key] not in NOT_PATHS.get((section, key), ()):
                    values[key] = resolve_path(values[key], folder)
            if section == "data" and isinstance(values.get("sources"), list):  # each source's path and images
                values["sources"] = [{k: resolve_path(v, folder) if k in ("path", "images") else v
                                      for k, v in item.items()} if isinstance(item, dict) else item
                                     for item in values["sources"]]
            out[section] = values
    return out
