"""dpfl/schemes/index.py lists exactly the schemes the modules build, each under its own module."""

import importlib

import pytest

from dpfl.schemes import registry
from dpfl.schemes.index import SCHEMES, list_schemes


def test_index_matches_registrations():
    for module in {m for m, _ in SCHEMES.values()}:
        importlib.import_module(module)
    assert set(registry._REGISTRY) == set(SCHEMES)
    for name, fn in registry._REGISTRY.items():
        assert fn.__module__ == SCHEMES[name][0], name
    assert list(list_schemes()) == sorted(SCHEMES)


def test_register_refuses_unlisted_names_and_modules():
    with pytest.raises(ValueError, match="no-such-scheme"):
        registry.register("no-such-scheme")(lambda: None)
    with pytest.raises(ValueError, match="dpfl.schemes.catalog"):
        registry.register("fl-sign")(lambda: None)  # listed under dpfl.schemes.catalog, defined here
    assert "no-such-scheme" not in registry._REGISTRY


def test_build_unknown_scheme_names_the_choices():
    from dpfl.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown scheme 'nope'; allowed: .*fl-std-dp"):
        registry.build_scheme("nope", {}, {})
