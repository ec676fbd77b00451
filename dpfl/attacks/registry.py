"""Attacks by name: `build_attack(cfg.attack, env)` is what the simulator calls."""

from __future__ import annotations

import inspect
from typing import Any

from dpfl.attacks.backdoor import InBackdoor, OutBackdoor
from dpfl.attacks.base import Attack
from dpfl.attacks.malicious import Boosting, GradientAscent, Malicious, RandomUpdate, SignInversion
from dpfl.errors import ConfigError

ATTACKS: dict[str, type[Malicious]] = {c.name: c for c in (
    RandomUpdate, GradientAscent, SignInversion, InBackdoor, OutBackdoor, Boosting)}


def list_attacks() -> dict[str, str]:
    """Attack names and one-line descriptions."""
    return {name: (cls.__doc__ or "").strip().splitlines()[0] for name, cls in sorted(ATTACKS.items())}


def attack_options(name: str) -> list[str]:
    """The `[attack] options` keys behaviour `name` accepts."""
    params: dict[str, inspect.Parameter] = {}
    for cls in reversed(ATTACKS[name].__mro__):
        if "__init__" in vars(cls):
            params.update(inspect.signature(cls.__init__).parameters)
    return [k for k, p in params.items()
            if k not in ("self", "fraction", "mode") and p.kind is inspect.Parameter.KEYWORD_ONLY]


def build_attack(cfg: Any, env: dict[str, Any] | None = None) -> Attack:
    """Build the attack of an `AttackConfig` (name, fraction, mode, options)."""
    if cfg.name not in ATTACKS:
        raise ConfigError(f"unknown attack {cfg.name!r}; allowed: none, {', '.join(sorted(ATTACKS))}")
    allowed = attack_options(cfg.name)
    unknown = sorted(set(cfg.options) - set(allowed))
    if unknown:
        raise ConfigError(f"attack {cfg.name!r}: unknown option(s) {unknown}; allowed: {', '.join(allowed)}")
    try:
        return ATTACKS[cfg.name](cfg.fraction, cfg.mode, **cfg.options)
    except TypeError as e:  # a required option is missing
        raise ConfigError(f"attack {cfg.name!r}: {e}; allowed options: {', '.join(allowed)}") from None
