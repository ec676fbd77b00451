"""Compact feature storage is cast once, in one place, to the model's dtype."""

import torch

from dpfl.data.dataset import as_model_input


def test_compact_features_become_the_model_dtype_and_others_are_untouched():
    for dt in (torch.uint8, torch.float16, torch.bfloat16):
        x = torch.tensor([[0, 1, 2]], dtype=dt)
        assert as_model_input(x).dtype == torch.float32
        assert as_model_input(x, torch.float64).dtype == torch.float64
        assert torch.equal(as_model_input(x), x.to(torch.float32))
    f = torch.randn(2, 3)
    assert as_model_input(f, torch.float64) is f  # already a model input: no copy, no cast
    i = torch.tensor([1, 2])
    assert as_model_input(i) is i  # token ids (IMDB) stay integers
