import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests use small tensors: one intra-op thread is faster, and two test processes sharing a
    2-core machine do not oversubscribe it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
