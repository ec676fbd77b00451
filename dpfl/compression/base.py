"""Wire payloads and the codec contract.

A `Payload` holds the exact buffers one cohort would send, with a leading client axis on
every array (row i is client i's message). Bytes on the wire are the buffers' sizes:
`per_client_nbytes()` — never a formula. Headers (scheme name, shapes, round) are small
constants the thesis does not count either; they are reported separately when needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where a codec runs: payloads alone need only NumPy
    import torch


@dataclass
class Payload:
    arrays: dict[str, np.ndarray]  # each shape [k, ...], exact dtype as sent
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def k(self) -> int:
        return next(iter(self.arrays.values())).shape[0] if self.arrays else 0

    def per_client_nbytes(self) -> np.ndarray:
        k = self.k
        total = np.zeros(k, dtype=np.int64)
        for a in self.arrays.values():
            total += a[0].nbytes if k else 0
        return total

    def row(self, i: int) -> Payload:
        return Payload({name: a[i : i + 1] for name, a in self.arrays.items()}, dict(self.meta))


class Codec:
    """Encodes a batch of rows [k, d] into a Payload and decodes it back."""

    name = "codec"
    bits_per_value: int = 32  # bits one value takes in the payload

    def encode(self, rows: torch.Tensor, rng: np.random.Generator | None = None) -> Payload:
        raise NotImplementedError

    def decode(self, payload: Payload, d: int) -> torch.Tensor:
        raise NotImplementedError


class Float32Codec(Codec):
    """Plain 32-bit floats: 4 bytes per value."""

    name = "float32"

    def encode(self, rows: torch.Tensor, rng: np.random.Generator | None = None) -> Payload:
        import torch

        return Payload({"values": rows.detach().to("cpu", torch.float32).contiguous().numpy()})

    def decode(self, payload: Payload, d: int) -> torch.Tensor:
        import torch

        v = payload.arrays["values"]
        if v.ndim != 2 or v.shape[1] != d or v.dtype != np.float32:
            raise ValueError(f"float32 payload must have shape [k, {d}] float32, got {v.shape} {v.dtype}")
        return torch.from_numpy(v)
