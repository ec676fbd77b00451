"""`dpfl bench cli`: wall time of light commands, each run as a fresh process, against the floor of a bare
`python -c pass`; the CPU time of each (user + system, less sensitive than wall time to other load on
the machine); and whether each imports torch or dp-accounting (read from `python -X importtime`). The
median wall time of `dpfl privacy epsilon --accountant all` is set against the 1 s target of issue 40 as
a ratio. Every number printed is measured here."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

_EPS = ["privacy", "epsilon", "--sigma", "1", "--q", "0.01", "--steps", "1000"]
CASES: list[tuple[str, list[str] | None]] = [  # label, dpfl arguments (None: `python -c pass`)
    ("python -c pass", None),
    ("dpfl --help", ["--help"]),
    ("dpfl schemes", ["schemes"]),
    ("dpfl privacy epsilon", _EPS),  # the default accountant: rdp
    ("dpfl privacy epsilon --accountant all", [*_EPS, "--accountant", "all"]),  # every accountant, pld included
]
TARGET = ("dpfl privacy epsilon --accountant all", 1.0)  # issue 40: under 1 s in a fresh process


def _argv(args: list[str] | None, importtime: bool = False) -> list[str]:
    flags = ["-X", "importtime"] if importtime else []
    if args is None:
        return [sys.executable, *flags, "-c", "pass"]
    return [sys.executable, *flags, "-m", "dpfl.cli.main", *args]


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds of one run, and the finished process."""
    c, t = _cpu_children(), time.perf_counter()
    p = subprocess.run(argv, check=False, capture_output=True, text=True)
    return time.perf_counter() - t, _cpu_children() - c, p


def imported_modules(args: list[str] | None) -> list[str]:
    """The modules one run of the command imports, from `python -X importtime`."""
    *_, p = _run(_argv(args, importtime=True))
    return [ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")][1:]


def run_bench(reps: int = 5, console: Console | None = None) -> dict:
    console = console or Console()
    load_before = os.getloadavg()[0]
    for _, args in CASES:  # once untimed: byte-compile, warm the file cache, check each command works
        *_, p = _run(_argv(args))
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(_argv(args))} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    wall: dict[str, list[float]] = {label: [] for label, _ in CASES}
    cpu: dict[str, list[float]] = {label: [] for label, _ in CASES}
    for _ in range(reps):  # round robin, so that a change of load affects every command alike
        for label, args in CASES:
            w, c, _ = _run(_argv(args))
            wall[label].append(w)
            cpu[label].append(c)
    load_after = os.getloadavg()[0]

    result = {"reps": reps, "cpus": os.cpu_count(), "load_1min_before": load_before, "load_1min_after": load_after,
              "commands": {}}
    table = Table(title=f"CLI start-up in seconds, fresh process each, {reps} reps; {os.cpu_count()} CPUs, "
                        f"1-min load average {load_before:.1f} before, {load_after:.1f} after")
    for col in ("command", "wall med", "wall min", "wall max", "CPU med", "modules", "torch", "dp-accounting"):
        table.add_column(col, justify="left" if col == "command" else "right")
    for label, args in CASES:
        mods = imported_modules(args)
        w, c = wall[label], cpu[label]
        torch, dpa = "torch" in mods, "dp_accounting" in mods
        result["commands"][label] = {"argv": _argv(args)[1:], "wall_median_s": statistics.median(w),
                                     "wall_min_s": min(w), "wall_max_s": max(w), "cpu_median_s": statistics.median(c),
                                     "modules_imported": len(mods), "imports_torch": torch, "imports_dp_accounting": dpa}
        table.add_row(label, f"{statistics.median(w):.3f}", f"{min(w):.3f}", f"{max(w):.3f}",
                      f"{statistics.median(c):.3f}", str(len(mods)), "yes" if torch else "no", "yes" if dpa else "no")
    console.print(table)
    label, target = TARGET
    got, floor = result["commands"][label], result["commands"]["python -c pass"]
    result["target"] = {"command": label, "target_s": target, "wall_median_s": got["wall_median_s"],
                        "ratio": got["wall_median_s"] / target, "met": got["wall_median_s"] < target,
                        "above_python_s": got["wall_median_s"] - floor["wall_median_s"]}
    t = result["target"]
    console.print(f"target (issue 40): `{label}` under {target:g} s in a fresh process: {t['wall_median_s']:.3f} s "
                  f"median wall = {t['ratio']:.2f} x the target, {'met' if t['met'] else 'NOT met'} "
                  f"({t['above_python_s']:.3f} s above `python -c pass`; 1-min load {load_before:.1f} before, "
                  f"{load_after:.1f} after, {os.cpu_count()} CPUs)", highlight=False)
    console.print(f"dpfl ARGS runs as: {sys.executable} -m dpfl.cli.main ARGS; "
                  f"privacy epsilon: {' '.join(_EPS[2:])} [--accountant all]")
    return result
