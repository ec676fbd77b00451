"""Secure aggregation over Z_(2^b): X25519 key agreement, AES-256 counter-mode masks, Shamir dropout recovery
(Bonawitz et al. 2017; the sparse SecAgg+ graph of Bell et al. 2020). The protocol only: its `Transport`
for the schemes is `dpfl.schemes.secure_sum.SecAggTransport`."""

from dpfl.secagg.protocol import RoundAborted
from dpfl.secagg.ring import (
    centred_lift,
    decode_fixed,
    encode_fixed,
    encode_int,
    fixed_point_bits,
    gaussian_clip_range,
    sign_dp_bits,
)
from dpfl.secagg.simulate import secure_sum

__all__ = [
    "RoundAborted",
    "centred_lift",
    "decode_fixed",
    "encode_fixed",
    "encode_int",
    "fixed_point_bits",
    "gaussian_clip_range",
    "secure_sum",
    "sign_dp_bits",
]
