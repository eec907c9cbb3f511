"""Nemotron-H Omni: a RADIO vision tower and a pixel-shuffle MLP projector before a Nemotron-H text model whose
blocks each hold one mixer (Mamba-2, attention without rotary embedding, an MLP or routed experts); its audio tower
is never run. Types: ``nemotron_h_omni``."""
