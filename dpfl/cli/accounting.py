"""`dpfl ... accounting run`: the Jayaraman & Evans accounting comparison, one PNG + one JSON.

Full grid (J&E settings on Fashion-MNIST 10k/10k): `run --out-dir out/` (hours on 2 CPU cores);
a quick look: `run --out-dir out/ --n-train 1000 --n-test 1000 --epochs 5 --epsilons 0.1,1,10,100,1000`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from dpfl.errors import ConfigError, DpflError
from dpfl.experiments.accounting_comparison import METHODS, MODELS, Config, run_comparison

app = typer.Typer(help="Accuracy loss and membership advantage vs ε under NC / AC / zCDP / RDP / PLD accounting.")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"expected comma-separated numbers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


@app.command()
def run(
    out_dir: str = typer.Option(..., help="folder for accounting_comparison.json and .png"),
    n_train: int = typer.Option(10_000, help="training records (members)"),
    n_test: int = typer.Option(10_000, help="test records (non-members)"),
    epochs: int = typer.Option(100),
    batch_size: int = typer.Option(200),
    lr: float = typer.Option(0.01, help="Adam learning rate"),
    clip: float = typer.Option(1.0, help="per-example clipping bound C"),
    delta: float = typer.Option(1e-5),
    epsilons: str = typer.Option("0.1,0.5,1,5,10,50,100,500,1000"),
    methods: str = typer.Option(",".join(METHODS), help=f"subset of {','.join(METHODS)}"),
    models: str = typer.Option(",".join(MODELS), help=f"subset of {','.join(MODELS)}"),
    repeats: int = typer.Option(1),
    seed: int = typer.Option(0),
    data_root: str = typer.Option(None, help="folder with the Fashion-MNIST IDX files (default: system paths)"),
) -> None:
    """Train LR and the 2x256 MLP at each ε under each accounting; write the plot and the numbers."""
    out = Path(out_dir)
    cfg = Config(n_train=n_train, n_test=n_test, epochs=epochs, batch_size=batch_size, lr=lr, clip=clip,
                 delta=delta, epsilons=_floats(epsilons), methods=_names(methods), models=_names(models),
                 repeats=repeats, seed=seed, data_root=data_root)
    console = Console()

    def progress(r: dict) -> None:
        console.print(f"{r['model']:>2} {r['method']:>4} ε={r['epsilon']:<7g} σ={r['sigma']:.4g} "
                      f"test acc {r['test_acc']:.3f} loss {r['accuracy_loss']:+.3f} "
                      f"adv {r['membership_advantage']:+.3f} ({r['seconds']:.1f}s)")

    try:
        result = run_comparison(cfg, out, progress=progress)
    except DpflError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(code=2) from None
    table = Table(title=f"accuracy loss / membership advantage (δ={delta})")
    table.add_column("model")
    table.add_column("method")
    for e in cfg.epsilons:
        table.add_column(f"ε={e:g}", justify="right")
    for model, by_method in result["summary"].items():
        for method, by_eps in by_method.items():
            if method == "none":
                continue
            table.add_row(model, method, *(f"{by_eps[str(e)]['accuracy_loss']:.3f} / "
                                           f"{by_eps[str(e)]['membership_advantage']:+.3f}" for e in cfg.epsilons))
    console.print(table)
    console.print(f"wrote {out / 'accounting_comparison.png'} and .json in {result['seconds']:.0f}s")
