import numpy as np
import pytest
import torch

from dpfl.rng import Seeds
from dpfl.schemes.base import RoundContext, SetupContext


@pytest.fixture
def contexts():
    """Factory: (setup_ctx, round_ctx(r, k)) for a flat model of n parameters."""

    def make(n, seed=0, w0=None, **setup_kw):
        seeds = Seeds(seed)
        w0 = torch.zeros(n) if w0 is None else w0
        sctx = SetupContext(n_params=n, seeds=seeds, device=torch.device("cpu"), initial_params=w0.clone(),
                            **setup_kw)

        def round_ctx(r, k=4, w=None):
            return RoundContext(round=r, n_params=n, cohort=np.arange(k), n_selected=k,
                                weights=torch.ones(k), seeds=seeds, device=torch.device("cpu"),
                                global_params=w0.clone() if w is None else w)

        return sctx, round_ctx

    return make
