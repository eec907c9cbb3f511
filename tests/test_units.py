"""Single-process unit tests of the small pieces: shape headers, layouts, recipes."""

import pytest
import torch

from mpipe_hf.models.base import balanced_layers, check_layers_per_stage
from mpipe_hf.runtime.p2p import decode_header, encode_header


def test_header_round_trip_carries_every_shape_and_dtype():
    payload = {"hidden_states": torch.zeros(2, 37, 64, requires_grad=True), "position_ids": torch.zeros(3, 2, 37,
               dtype=torch.int64), "image_features": torch.zeros(0, 64, dtype=torch.bfloat16),
               "mask": torch.zeros(5, dtype=torch.bool), "scalar": torch.tensor(3.0)}
    entries = decode_header(encode_header(payload))
    assert entries == [(k, v.dtype, v.requires_grad, tuple(v.shape)) for k, v in payload.items()]


def test_header_rejects_unsupported_dtype():
    with pytest.raises(TypeError, match="complex"):
        encode_header({"x": torch.zeros(2, dtype=torch.complex64)})


def test_balanced_layers():
    assert balanced_layers(8, 8) == [1] * 8
    assert balanced_layers(10, 4) == [2, 3, 3, 2]
    assert balanced_layers(7, 2) == [4, 3]
    assert sum(balanced_layers(29, 6)) == 29
    with pytest.raises(ValueError, match="exceeds the model's 8 decoder layers"):
        balanced_layers(8, 16)


def test_layers_per_stage_is_checked():
    assert check_layers_per_stage([3, 1, 2, 2], 8, 4) == [3, 1, 2, 2]
    for bad in ([4, 4], [8, 0, 0, 0], [3, 3, 3, 3]):
        with pytest.raises(ValueError, match="layers_per_stage"):
            check_layers_per_stage(bad, 8, 4)
