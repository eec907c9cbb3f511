"""Inkling (thinkingmachines): a text model without rotary embeddings (a relative-position bias from each layer's
hidden states), ``hybrid`` and ``hybrid_sliding`` attention layers with short convolutions, routed experts, and a
patch tower of linear layers (one image token a patch); its audio tower is never run. Types: ``inkling_mm_model``,
and ``inkling2``, ``inkling2_loop`` (refused)."""
