"""Credentials for a local federation, made with `cryptography`:

    ca.crt, ca.key          a self-signed certificate authority (EC P-256)
    server.pem, server.key  the SuperLink's TLS certificate, signed by the CA, valid for the
                            given hosts (IP or DNS subject alternative names)
    node-<i>, node-<i>.pub  SuperNode authentication keys (EC P-384, OpenSSH format): the
                            SuperNode signs its requests with node-<i>; the SuperLink only
                            accepts nodes whose node-<i>.pub was registered
                            (`flwr supernode register node-<i>.pub <connection>`)
    peers.toml              the same public keys by partition id, `"<i>" = "ecdsa-sha2-nistp384
                            AAAA..."`: the operator-approved list every site's `peers` node
                            config points to (signed secure rounds, docs/threat-model.md)

The node key also binds the site's per-run signing key of the secure sum (`bind`,
`check_binding`): an ECDSA P-384/SHA-384 signature over a domain-separated statement.

For local use and tests: a real deployment's certificate comes from the organisation's CA,
and each node generates its own key and hands over only the public half. Private keys are
written with mode 0600.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import os
import re
import stat
import struct
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpfl.errors import ConfigError

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"
PEERS = "peers.toml"
BINDING_DOMAIN = b"dpfl-secagg-signing-key"
BINDING_MAX_BYTES = 120  # a DER ECDSA P-384 signature has at most 104


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
    """Write node-<i> (private) and node-<i>.pub (public) for i < n, and peers.toml listing the
    public keys by partition id; returns the pairs of paths."""
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
    write_peers(d / PEERS, {i: pub.read_text() for i, (_, pub) in enumerate(out)})
    return out


# ---------------------------------------------------------------- the peers file and the node key


def _p384_public(text: str, what: str) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_ssh_public_key(text.strip().encode())
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ConfigError(f"{what}: not an OpenSSH public key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise ConfigError(f"{what}: must be an EC P-384 key (ecdsa-sha2-nistp384), as `dpfl flower certs` and "
                          "`ssh-keygen -t ecdsa -b 384` make")
    return key


def ssh_line(key: ec.EllipticCurvePublicKey) -> str:
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def write_peers(path: str | Path, keys: dict[int, str]) -> Path:
    """peers.toml: client id → OpenSSH public key line (checked, comments dropped)."""
    lines = []
    for cid, text in sorted(keys.items()):
        key = _p384_public(text, f"client {cid}: public key")
        lines.append(f'"{int(cid)}" = "{ssh_line(key)}"')
    Path(path).write_text("# operator-approved SuperNode keys by partition id (dpfl signed secure rounds)\n"
                          + "\n".join(lines) + "\n")
    return Path(path)


def read_peers(path: str | Path) -> dict[int, ec.EllipticCurvePublicKey]:
    """The peers file: client id → its registered EC P-384 public key; ConfigError naming the problem."""
    what = f"peers file {path}"
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{what}: cannot read it ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: not valid TOML ({e})") from None
    out: dict[int, ec.EllipticCurvePublicKey] = {}
    seen: dict[tuple[int, int], int] = {}
    for cid, text in data.items():
        if not re.fullmatch(r"0|[1-9][0-9]{0,9}", cid) or not isinstance(text, str):
            raise ConfigError(f'{what}: entries must be "<partition id>" = "ecdsa-sha2-nistp384 AAAA...", got {cid!r}')
        key = out[int(cid)] = _p384_public(text, f"{what}, client {cid}")
        nums = key.public_numbers()
        if (nums.x, nums.y) in seen:
            raise ConfigError(f"{what}: clients {seen[nums.x, nums.y]} and {cid} have the same key")
        seen[nums.x, nums.y] = int(cid)
    if not out:
        raise ConfigError(f"{what}: lists no keys")
    return out


def load_node_key(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """A SuperNode's EC P-384 private key (OpenSSH format, unencrypted: the file given to
    `flower-supernode --auth-supernode-private-key`)."""
    what = f"node config signing-key {path}"
    try:
        key = serialization.load_ssh_private_key(Path(path).read_bytes(), None)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read it ({e.strerror})") from None
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise ConfigError(f"{what}: not an unencrypted OpenSSH private key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp384r1":
        raise ConfigError(f"{what}: must be an EC P-384 key, as `dpfl flower certs` and `ssh-keygen -t ecdsa -b 384` "
                          "make")
    return key


def signing_files(node_config: Mapping[str, Any]) -> tuple[str, str] | None:
    """Node config `signing-key` and `peers` (paths; both or neither): a node that signs its
    secure rounds and accepts no unsigned one. ConfigError for half of the pair."""
    key, peers = node_config.get("signing-key"), node_config.get("peers")
    for name, v in (("signing-key", key), ("peers", peers)):
        if v is not None and (not isinstance(v, str) or not v):
            raise ConfigError(f"node config {name} must be a non-empty path, got {v!r}")
    if (key is None) != (peers is None):
        raise ConfigError("node config signing-key and peers go together: the site's OpenSSH private key "
                          "(--auth-supernode-private-key) and the operator's peers.toml")
    return None if key is None else (key, peers)


SITE_KEY_BYTES = 32


def default_site_key() -> Path:
    """Where a site keeps its site key without node config `site-key`: $XDG_STATE_HOME/dpfl/site-key
    (~/.local/state/dpfl/site-key)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    if not os.path.isabs(base):
        raise ConfigError(f"no absolute state directory for the site key (XDG_STATE_HOME or HOME gives {base!r}): "
                          "set node config site-key to an absolute path")
    return Path(base) / "dpfl" / "site-key"


def site_key(path: str | Path | None = None) -> bytes:
    """The site's secret that keys the MAC of its data (its hello's `data_mac`): 32 bytes read from
    `path` (absolute, `~` expanded; default `default_site_key()`), made once from the OS if the file
    is missing (mode 0600, written and synced whole before it appears; never replacing one another
    process made first). It never leaves the site; keep it to resume a run. ConfigError, one line,
    unless the file is a regular file of this user's, only this user may read or write it, of the
    right size, in a folder of this user's that no one else may write to."""
    p = Path(os.path.expanduser(str(path))) if path else default_site_key()
    if not p.is_absolute():
        raise ConfigError(f"site key {p}: give an absolute path (a relative one depends on where the SuperNode starts)")
    try:
        if not p.parent.exists():
            p.parent.mkdir(parents=True, mode=0o700)
        _check_owned(p.parent, 0o022, "folder of the site key")
        if not os.path.lexists(p):
            _create_key(p)
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"site key {p} is not a regular file")
            _check_owned(p, 0o077, "site key", st)
            data = f.read(SITE_KEY_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"site key {p}: {e.strerror or e}") from None
    if len(data) != SITE_KEY_BYTES:
        raise ConfigError(f"site key {p} must hold {SITE_KEY_BYTES} bytes, it holds {len(data)}")
    return data


def _check_owned(p: Path, forbidden: int, what: str, st: os.stat_result | None = None) -> None:
    st = os.stat(p) if st is None else st
    mode = st.st_mode & 0o777
    if st.st_uid != os.getuid():
        raise ConfigError(f"{what} {p} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if mode & forbidden:
        if forbidden == 0o022:  # a folder: /tmp and the like are shared on purpose
            raise ConfigError(f"{what} {p} can be written by others (mode {mode:o}): keep the key in a folder "
                              "only this user may write to")
        raise ConfigError(f"{what} {p} can be read or written by others (mode {mode:o}): chmod {mode & ~forbidden:o} it")


def _create_key(p: Path) -> None:
    """A new key at p, complete or not at all (a temporary file linked in, then the folder synced)."""
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(SITE_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs stays
            os.link(tmp, p)
    finally:
        os.unlink(tmp)
    d = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(d)
    finally:
        os.close(d)


def same_key(a: ec.EllipticCurvePublicKey, b: ec.EllipticCurvePublicKey) -> bool:
    return a.public_numbers() == b.public_numbers()


# ---------------------------------------------------------------- binding a signing key to the node key


def binding_statement(config_text: str, cid: int, verification_key: bytes) -> bytes:
    """What a site's node key signs: its client id's Ed25519 key for runs of this config."""
    return (BINDING_DOMAIN + hashlib.sha256(config_text.encode()).digest() + struct.pack("<I", cid)
            + verification_key)


def bind(node_key: ec.EllipticCurvePrivateKey, config_text: str, cid: int, verification_key: bytes) -> bytes:
    """ECDSA P-384/SHA-384 signature (DER) of `binding_statement`."""
    return node_key.sign(binding_statement(config_text, cid, verification_key), ec.ECDSA(hashes.SHA384()))


def check_binding(node_public: ec.EllipticCurvePublicKey, binding: bytes, config_text: str, cid: int,
                  verification_key: bytes) -> bool:
    try:
        node_public.verify(binding, binding_statement(config_text, cid, verification_key), ec.ECDSA(hashes.SHA384()))
    except (InvalidSignature, ValueError):
        return False
    return True
