import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one intra-op thread is faster, and fair on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
