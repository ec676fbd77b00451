"""Credentials for a local federation, made with `cryptography`:

    ca.crt, ca.key          a self-signed certificate authority (EC P-256)
    server.pem, server.key  the SuperLink's TLS certificate, signed by the CA, valid for the
                            given hosts (IP or DNS subject alternative names)
    node-<i>, node-<i>.pub  SuperNode authentication keys (EC P-384, OpenSSH format): the
                            SuperNode signs its requests with node-<i>; the SuperLink only
                            accepts nodes whose node-<i>.pub was registered
                            (`flwr supernode register node-<i>.pub <connection>`)

For local use and tests: a real deployment's certificate comes from the organisation's CA,
and each node generates its own key and hands over only the public half. Private keys are
written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpfl.errors import ConfigError

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, fmt: serialization.PrivateFormat) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_tls(out_dir: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), days: int = 365) -> Path:
    """Write ca.crt/ca.key and server.pem/server.key for `hosts`; returns the directory."""
    if not hosts:
        raise ConfigError("give at least one host name or IP address for the server certificate")
    if not 1 <= days <= 3650:
        raise ConfigError(f"certificate lifetime must be 1..3650 days, got {days}")
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dpfl local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / CA_CERT).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / SERVER_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(d / CA_KEY, ca_key, serialization.PrivateFormat.PKCS8)
    _write_key(d / SERVER_KEY, key, serialization.PrivateFormat.PKCS8)
    return d


def make_node_keys(out_dir: str | Path, n: int) -> list[tuple[Path, Path]]:
    """Write node-<i> (private) and node-<i>.pub (public) for i < n; returns the pairs of paths."""
    if n < 1:
        raise ConfigError(f"number of node keys must be ≥ 1, got {n}")
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        priv, pub = d / f"node-{i}", d / f"node-{i}.pub"
        _write_key(priv, key, serialization.PrivateFormat.OpenSSH)
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                      serialization.PublicFormat.OpenSSH) + b"\n")
        out.append((priv, pub))
    return out
