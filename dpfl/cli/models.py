"""`dpfl models list`: the models, their parameter counts and the thesis's."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from dpfl.models import THESIS_PARAMS, build_model, count_params, list_models

app = typer.Typer(help="The thesis's models.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """The thesis's models."""


@app.command("list")
def list_cmd() -> None:
    """Model names with measured and thesis parameter counts."""
    t = Table("model", "parameters", "thesis", "description")
    for name, desc in list_models().items():
        if name in THESIS_PARAMS:
            n = count_params(build_model(name, seed=0))
            t.add_row(name, f"{n:,}", f"{THESIS_PARAMS[name]:,}", desc)
        else:
            t.add_row(name, "(depends on options)", "-", desc)
    Console().print(t)
