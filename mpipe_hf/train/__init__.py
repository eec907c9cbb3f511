"""Training: recipes, the trainer loop and checkpoints."""

from .recipe import Recipe, load_recipe

__all__ = ["Recipe", "load_recipe"]
