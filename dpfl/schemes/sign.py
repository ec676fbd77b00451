"""FL-SIGN (thesis Alg. 3) and signSGD: 1-bit updates and an unweighted majority vote.

Chain: FL-SIGN = [SignStep(γ)] | PlainTransport(SignCodec()) | SumAggregator;
       signSGD = [SignStep(γ, one_bit_downstream=True)], all clients, one local mini-batch.
"""

from __future__ import annotations

import torch

from dpfl.compression.bits import SignCodec, random_sign, random_sign_rows
from dpfl.errors import ConfigError
from dpfl.schemes.base import RoundContext, SetupContext, Step


def _sign(x: torch.Tensor, rng) -> torch.Tensor:
    return torch.from_numpy(random_sign(x.detach().cpu().numpy(), rng)).to(x.device)


class SignStep(Step):
    """Client: s_k = sign(Δw_k) ∈ {−1, +1}ⁿ (int8; random sign for exact zeros).
    Server: γ·sign(Σ_k s_k), ties broken by a random sign as well (the thesis's sign has no 0).

    With `one_bit_downstream` (signSGD) the server broadcasts only the vote: the downstream is
    the size of that vote's 1-bit payload instead of the full model.
    """

    name = "sign"

    def __init__(self, gamma: float = 0.001, one_bit_downstream: bool = False):
        if not gamma > 0:
            raise ConfigError(f"FL-SIGN server step γ must be > 0 (thesis: 0.001 to 0.005), got {gamma}")
        self.gamma = float(gamma)
        self.one_bit_downstream = one_bit_downstream
        self._vote_nbytes: int | None = None

    def setup(self, ctx: SetupContext) -> None:
        if self.one_bit_downstream:  # the vote's payload size does not depend on its values
            vote = torch.ones(1, ctx.n_params, dtype=torch.int8)
            self._vote_nbytes = int(SignCodec().encode(vote).per_client_nbytes()[0])

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        # ties drawn per client (row i is client ctx.cohort[i]): a deployed client holding its
        # own row draws what the simulator draws for it
        if not len(ctx.cohort):
            return u.to(torch.int8)
        return random_sign_rows(u.detach(), lambda i: ctx.numpy_rng("sign", "client-zeros", int(ctx.cohort[i])))

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        vote = _sign(agg, ctx.numpy_rng("sign", "server-ties"))
        return vote.to(torch.float32) * self.gamma

    def downstream_bytes(self, ctx: RoundContext) -> int | None:
        return self._vote_nbytes if self.one_bit_downstream else None

    def describe(self) -> str:
        return f"sign(γ={self.gamma}{', 1-bit downstream' if self.one_bit_downstream else ''})"
