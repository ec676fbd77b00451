import pytest
import torch

from dpfl.data.images import find_mnist_dir


def pytest_collection_modifyitems(config, items):
    """Tests marked `fashion_mnist` (they read the real files) skip, saying why, where the Debian
    package dataset-fashion-mnist is not installed; CI installs it and fails if it cannot."""
    if find_mnist_dir("fashion-mnist", None)[0]:
        return
    skip = pytest.mark.skip(reason="needs Fashion-MNIST: apt-get install dataset-fashion-mnist (or DPFL_DATA_DIR)")
    for item in items:
        if "fashion_mnist" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests use small tensors: one intra-op thread is faster, and two test processes sharing a
    2-core machine do not oversubscribe it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _site_keys(tmp_path_factory):
    """Sites started by the tests (and their SuperNodes' workers) keep their site key
    (`dpfl.flower.certs.site_key`) in a temporary state directory, not the user's."""
    import os

    was = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    if was is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = was
