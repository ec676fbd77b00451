"""`dpfl attacks ...`: membership inference on a finished run, and the lists of attacks and defences."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from dpfl.errors import DpflError

app = typer.Typer(help="Membership inference and attack tools.", no_args_is_help=True)
console = Console()


@app.command()
def membership(
    run_dir: Path = typer.Argument(..., help="A finished run directory (config.toml + checkpoint.pt)."),
    samples: int = typer.Option(5000, help="Members and non-members drawn (each)."),
    seed: int = typer.Option(0, help="Seed of the member / non-member draw."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Loss-threshold membership inference (Yeom et al.) on the run's final global model."""
    from dpfl.attacks.membership import membership_advantage
    from dpfl.run.final_model import load_final_model

    try:
        model, fed, cfg = load_final_model(run_dir)  # the members: the clients' original data
        res = membership_advantage(model, fed, samples, seed, cfg.eval.batch_size)
    except DpflError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    if json_out:
        console.print_json(json.dumps(res.as_dict()))
        return
    t = Table(title=f"membership inference (loss threshold): {run_dir}")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for label, v in (("members / non-members", f"{res.members} / {res.non_members}"),
                     ("threshold τ (mean member loss)", f"{res.threshold:.4f}"),
                     ("mean loss: members / non-members", f"{res.member_loss:.4f} / {res.non_member_loss:.4f}"),
                     ("TPR / FPR at τ", f"{res.tpr:.4f} / {res.fpr:.4f}"),
                     ("advantage TPR − FPR", f"{res.advantage:.4f} ± {res.advantage_se:.4f}"),
                     ("best-threshold advantage (optimistic)", f"{res.best_advantage:.4f}"),
                     ("AUC of −loss", f"{res.auc:.4f}")):
        t.add_row(label, v)
    console.print(t)


@app.command("list")
def list_() -> None:
    """Malicious behaviours and robust aggregators."""
    from dpfl.attacks.registry import attack_options, list_attacks
    from dpfl.schemes.robust import RULES

    for name, desc in list_attacks().items():
        console.print(f"[bold]{name:16s}[/bold] {desc}  [dim]options: {', '.join(attack_options(name))}[/dim]")
    console.print("aggregators (scheme.aggregator): " + ", ".join(RULES))
