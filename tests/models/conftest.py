import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small-op models (the LSTM loop) run far faster on one thread on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
