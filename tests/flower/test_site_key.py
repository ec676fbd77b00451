"""A site's data MAC: keyed by a secret that stays on the site (`certs.site_key`), so the hash of its
data in the hello tells the server nothing it could test guesses against."""

from __future__ import annotations

import os
import stat

import pytest
from flower_helpers import config, site_files

from dpfl.config import load_config
from dpfl.errors import ConfigError
from dpfl.flower import certs
from dpfl.flower.node import LocalClient, NodeSettings
from dpfl.run.state import hash_tensors


def test_a_site_key_is_made_once_private_and_kept(tmp_path):
    path = tmp_path / "keys" / "site-key"
    key = certs.site_key(path)
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert certs.site_key(path) == key  # read again, not replaced
    assert certs.site_key(tmp_path / "other") != key
    assert sorted(p.name for p in path.parent.iterdir()) == ["site-key"]  # no temporary file left


def test_the_default_site_key_lives_in_the_state_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert certs.default_site_key() == tmp_path / "dpfl" / "site-key"
    assert certs.site_key() == (tmp_path / "dpfl" / "site-key").read_bytes()


@pytest.mark.parametrize("content, mode, msg", [
    (b"k" * 32, 0o644, r"can be read or written by others \(mode 644\): chmod 600 it$"),
    (b"k" * 32, 0o620, r"can be read or written by others \(mode 620\): chmod 600 it$"),
    (b"k" * 31, 0o600, r"must hold 32 bytes, it holds 31$"),
    (b"k" * 33, 0o600, r"must hold 32 bytes, it holds 33$"),
])
def test_a_bad_site_key_file_is_one_line_and_left_alone(tmp_path, content, mode, msg):
    path = tmp_path / "site-key"
    path.write_bytes(content)
    os.chmod(path, mode)
    with pytest.raises(ConfigError, match=msg) as e:
        certs.site_key(path)
    assert "\n" not in str(e.value) and path.read_bytes() == content


def test_a_site_key_behind_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.write_bytes(b"k" * 32)
    os.chmod(real, 0o600)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ConfigError, match="^site key .*link: "):
        certs.site_key(tmp_path / "link")


def test_the_data_mac_needs_the_site_key(tmp_path):
    data = config(federation={"rounds": 1, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    cfg = load_config(data=data)

    def client(i: int, key: str) -> LocalClient:
        f = files[i]
        node = NodeSettings.parse({"partition-id": i, "data-path": f["data-path"], "test-path": f["test-path"],
                                   "dpfl-seeded": True, "site-key": str(tmp_path / key),
                                   **({"data-shape": f["data-shape"]} if "data-shape" in f else {})},
                                  cfg.data.n_clients)
        return LocalClient(cfg, node)

    a, salt = client(1, "key-a"), b"s" * 32
    mac = a.data_mac(salt)
    assert len(mac) == 64 and mac == client(1, "key-a").data_mac(salt)  # the same data, key and salt: the same MAC
    assert client(1, "key-b").data_mac(salt) != mac  # another key
    assert client(2, "key-a").data_mac(salt) != mac  # other data
    assert a.data_mac(b"t" * 32) != mac  # another run's salt: the same data are not linkable
    assert mac != hash_tensors([a.x, a.y, a.x_test, a.y_test]).hexdigest()  # not the unkeyed hash


def test_node_config_site_key_must_be_a_path():
    with pytest.raises(ConfigError, match="^node config site-key must be a non-empty string, got ''$"):
        NodeSettings.parse({"partition-id": 0, "site-key": ""}, 3)


def test_a_site_key_in_a_folder_others_may_write_is_refused(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with pytest.raises(ConfigError, match=r"^folder of the site key .*shared can be written by others \(mode 777\)"):
        certs.site_key(folder / "site-key")
    assert list(folder.iterdir()) == []  # nothing made there


def test_a_site_key_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="is not a regular file$"):
        certs.site_key(tmp_path / "fifo")
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="^site key .*dir: "):
        certs.site_key(tmp_path / "dir")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the file to another user")
def test_a_site_key_of_another_user_is_refused(tmp_path):
    path = tmp_path / "site-key"
    path.write_bytes(b"k" * 32)
    os.chmod(path, 0o600)
    os.chown(path, 12345, -1)
    with pytest.raises(ConfigError, match=r"^site key .* belongs to uid 12345, not to this user \(0\)$"):
        certs.site_key(path)


def test_a_site_key_path_must_be_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="^site key keys/k: give an absolute path"):
        certs.site_key("keys/k")
    assert not (tmp_path / "keys").exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert certs.site_key("~/k") == (tmp_path / "k").read_bytes()


def test_a_site_key_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="^site key .*file/site-key: "):
        certs.site_key(tmp_path / "file" / "site-key")


def test_concurrent_first_uses_agree_on_one_key(tmp_path):
    import multiprocessing as mp

    with mp.get_context("fork").Pool(4) as pool:
        keys = pool.map(certs.site_key, [str(tmp_path / "site-key")] * 8)
    assert len(set(keys)) == 1 and keys[0] == (tmp_path / "site-key").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site-key"]
