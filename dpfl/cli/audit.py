"""`dpfl audit CONFIG`: train once with canaries and print the empirical ε lower bound beside the accounted ε
(heavy modules are imported inside the command)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

console = Console()


def audit_cmd(
    config: Path = typer.Argument(..., help="Run config (TOML) of a client-level DP scheme or with train.dpsgd; or a "
                                  "central DP-SGD config: `name` and a [dpsgd] table of `dpfl dpsgd train` options."),
    canaries: int = typer.Option(1000, "--canaries", help="Canaries m, each included with probability 1/2."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the lower bound (1 − β)."),
    observe: str = typer.Option("white", "--observe", help="white: score every released model update (and the "
                                "final model); black: the final model only."),
    level: str = typer.Option(None, "--level", help="client | record | central: which DP to audit (needed only "
                              "when the config has client-level DP and train.dpsgd)."),
    scale: float = typer.Option(None, "--scale", help="Client canaries: raw update norm in units of the clip "
                                "bound S (default 10)."),
    out: Path = typer.Option(None, "--out", "-o", help="Run directory (default runs/<name>-audit-<time>)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: --set federation.rounds=20"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in --out."),
) -> None:
    """Privacy audit in one training run: Steinke et al.'s ε lower bound and Andrew et al.'s estimate."""
    from dpfl.audit.central import is_central, load_central_config
    from dpfl.audit.run import audit
    from dpfl.cli.main import _fail, _resolve_config
    from dpfl.config import load_config
    from dpfl.errors import DpflError
    from dpfl.experiments.report import print_audit

    try:
        path = _resolve_config(config)
        cfg = load_central_config(path, set_) if is_central(path) else load_config(path, set_)
        if out is None:
            out = Path("runs") / f"{cfg.name}-audit-{time.strftime('%Y%m%d-%H%M%S')}"
        console.print(f"auditing {cfg.name}: {canaries} canaries, confidence {confidence}, {observe} box "
                      f"(run directory {out})", highlight=False)
        result = audit(cfg, canaries=canaries, confidence=confidence, observe=observe, level=level, out_dir=out,
                       log=console.print, overwrite=overwrite, scale=scale)
    except DpflError as e:
        _fail(e)
    print_audit(console, result, out)
