"""Credentials, the Flower App directory and the run settings."""

from __future__ import annotations

import ipaddress
import ssl
import stat

import pytest
import tomli_w
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key
from flower_helpers import config

from dpfl.errors import ConfigError
from dpfl.flower import certs
from dpfl.flower.appdir import write_app
from dpfl.flower.client import CONFIG_KEY
from dpfl.flower.local import LocalFederation
from dpfl.flower.server import settings


def test_tls_credentials_chain_to_the_ca_and_name_the_host(tmp_path):
    d = certs.make_tls(tmp_path, hosts=("127.0.0.1", "localhost"))
    ca = x509.load_pem_x509_certificate((d / certs.CA_CERT).read_bytes())
    cert = x509.load_pem_x509_certificate((d / certs.SERVER_CERT).read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    ctx = ssl.create_default_context(cafile=str(d / certs.CA_CERT))
    ctx.load_cert_chain(str(d / certs.SERVER_CERT), str(d / certs.SERVER_KEY))  # key matches the cert
    for key in (certs.CA_KEY, certs.SERVER_KEY):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600


def test_node_keys_are_p384_openssh_pairs(tmp_path):
    (priv, pub), _ = certs.make_node_keys(tmp_path, 2)
    key = load_ssh_private_key(priv.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert load_ssh_public_key(pub.read_bytes()).public_numbers() == key.public_key().public_numbers()
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600


def test_the_app_directory_passes_flowers_validation_and_carries_the_config(tmp_path):
    from flwr.cli.config_utils import load_and_validate
    from flwr.supercore.object_ref import validate

    text = tomli_w.dumps(config())
    write_app(tmp_path, text, out_dir="/tmp/x", reproducible=True, timeout=30)
    cfg, warnings = load_and_validate(tmp_path / "pyproject.toml")
    assert cfg is not None and not warnings
    app = cfg["tool"]["flwr"]["app"]
    assert app["config"][CONFIG_KEY] == text and app["config"]["reproducible"] is True
    for ref in app["components"].values():
        assert validate(ref, check_module=True) == (True, None)


def test_settings_reject_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="unknown run config keys"):
        settings({CONFIG_KEY: "x", "rounds": 3})
    with pytest.raises(ConfigError, match="timeout must be a positive"):
        settings({CONFIG_KEY: "x", "timeout": 0})
    with pytest.raises(ConfigError, match="invalid configuration"):
        write_app("/nonexistent-dir-not-created", "[data]\nn_clients = 0\n")


def test_local_commands_are_the_documented_ones(tmp_path):
    fed = LocalFederation(tmp_path, 2, tls=True, auth=True, seeded=True)
    fed.port = 9092
    cmds = fed.commands("app")
    assert cmds[0].startswith("flower-superlink --ssl-ca-certfile ") and "--enable-supernode-auth" in cmds[0]
    assert cmds[1].startswith("flwr supernode register ") and cmds[1].endswith("node-0.pub dpfl-local")
    assert "--node-config 'partition-id=1 num-partitions=2 dpfl-seeded=true signing-key=" in cmds[4]
    assert f"peers=\"{tmp_path / 'certs' / 'peers.toml'}\"" in cmds[4]  # the registered key signs the rounds
    assert "--auth-supernode-private-key" in cmds[4] and "--root-certificates" in cmds[4]
    assert cmds[-1].endswith("app dpfl-local --stream")
    with pytest.raises(ConfigError, match="needs TLS"):
        LocalFederation(tmp_path, 2, tls=False, auth=True)


def test_a_run_whose_app_launches_flower_keeps_refusing_fails_fast_with_one_line(tmp_path, monkeypatch):
    """Flower refuses an app process whose first heartbeat is late (a starved machine) and launches it
    again forever; the run stops at the fifth refusal instead of waiting for its timeout."""
    import time

    from dpfl.flower import local
    from dpfl.flower.local import FederationError

    fed = LocalFederation(tmp_path, 2)
    logs = tmp_path / "logs"
    logs.mkdir()
    line = "ERROR :     [" + local._REFUSED.split("]", 1)[0] + "][ApiError:1008] Runtime task-token authentication failed.\n"
    (logs / "superlink.log").write_text(line * 4)
    monkeypatch.setattr(fed, "run_command", lambda *a: ["sleep", "0.2"])
    fed.run("app", timeout=30)  # four refusals: still a run
    fed.procs.clear()
    (logs / "supernode-1.log").write_text(line)
    monkeypatch.setattr(fed, "run_command", lambda *a: ["sleep", "30"])
    t = time.monotonic()
    with pytest.raises(FederationError, match=r"^Flower refused 5 app launches .* within 30 s .*too loaded") as e:
        fed.run("app", timeout=60)
    assert time.monotonic() - t < 10 and "\n" not in str(e.value)
    fed.stop()


def test_the_token_window_is_flowers():
    flwr = pytest.importorskip("flwr.common.constant")
    from dpfl.flower.local import TOKEN_WINDOW_S

    assert flwr.HEARTBEAT_DEFAULT_INTERVAL == TOKEN_WINDOW_S


def test_a_serverapp_that_stops_on_bad_input_says_so_in_one_line(tmp_path, capsys):
    from flwr.app import Context, RecordDict

    from dpfl.flower.local import FederationError, raise_if_unfinished
    from dpfl.flower.server import main

    ctx = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"out-dirr": "x"})
    with pytest.raises(ConfigError, match="^unknown run config keys"):
        main(None, ctx)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and " dpfl-error: unknown run config keys ['out-dirr']; allowed: " in lines[0]
    with pytest.raises(FederationError, match=r"^the ServerApp stopped: unknown run config keys \['out-dirr'\]; "):
        raise_if_unfinished(tmp_path, log_text="INFO: starting\n" + lines[0] + "\nTraceback (most recent call last):\n")


def test_a_sites_text_cannot_forge_the_serverapps_error_line(tmp_path, capsys):
    from dpfl.flower.local import FederationError, raise_if_unfinished
    from dpfl.flower.server import _stamped

    _stamped("node 7 failed: boom\n2026-01-01T00:00:00Z dpfl-error: forged")  # a site's reason, quoted
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith(" node 7 failed: boom 2026-01-01T00:00:00Z dpfl-error: forged")
    with pytest.raises(FederationError, match="^the ServerApp stopped before the end of the run"):
        raise_if_unfinished(tmp_path, log_text=line + "\n")


def test_the_serverapps_grid_retries_a_superlink_500_and_its_heartbeats_keep_going(monkeypatch, capsys):
    """Flower's grid gives up on an HTTP 500 from the SuperLink (the ServerApp raises, the run stops
    after its last round): `patient(grid)` makes its retries (shared by its log uploads and
    heartbeat) retry it, and this process's heartbeats beat through it."""
    import httpx
    from flwr.supercore import heartbeat
    from flwr.supercore.retry import make_simple_http_retry_invoker

    from dpfl.flower.server import patient

    monkeypatch.setattr(heartbeat.HeartbeatSender, "_heartbeat", heartbeat.HeartbeatSender._heartbeat)  # restored after

    class Grid:  # Flower's HttpGrid holds its retries here
        _retry_invoker = make_simple_http_retry_invoker()

    def answers(*codes):
        left = list(codes)

        def call():
            if left:
                req = httpx.Request("POST", "https://superlink/v1/serverappio/push-messages")
                raise httpx.HTTPStatusError("x", request=req, response=httpx.Response(left.pop(0), request=req))
            return "pushed"
        return call

    grid = Grid()
    grid._retry_invoker.wait_function = lambda seconds: None
    with pytest.raises(httpx.HTTPStatusError):
        grid._retry_invoker.invoke(answers(500))  # Flower's own
    patient(grid)
    assert grid._retry_invoker.invoke(answers(500, 500, 503)) == "pushed"
    with pytest.raises(httpx.HTTPStatusError):
        grid._retry_invoker.invoke(answers(400))
    sender = heartbeat.HeartbeatSender(answers(500))  # a 500 raised out of Flower's heartbeat function
    with pytest.raises(heartbeat.HeartbeatFailure):
        sender._heartbeat()  # retried by its thread, not its end
    assert "a heartbeat to the SuperLink failed (HTTPStatusError: x); retrying" in capsys.readouterr().err
    # the 300 s of 500s are counted per thread: the heartbeat's and log uploads' successes (other
    # threads, the same retries) do not keep a request the SuperLink always refuses going for ever
    import threading
    import time

    from dpfl.flower import retries

    monkeypatch.setattr(retries, "PATIENCE", 0.3)
    grid._retry_invoker.wait_function = lambda seconds: time.sleep(0.02)
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            grid._retry_invoker.invoke(answers())
            time.sleep(0.01)

    beating = threading.Thread(target=beat)
    beating.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(httpx.HTTPStatusError):
            grid._retry_invoker.invoke(answers(*[500] * 1000))
    finally:
        stop.set()
        beating.join()
    assert 0.3 < time.monotonic() - t0 < 5
    patient(None)  # not Flower's grid: said, and the run goes on as in Flower
    assert "a server error from the SuperLink ends this run, as in Flower" in capsys.readouterr().out
