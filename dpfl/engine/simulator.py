"""The simulator: the driver of a `Run` (dpfl.run.state) whose clients train in this process —
rounds of selection → local training → client chain → transport → aggregation → server chain →
model update, then what every round ends with (`Run.end_round`, evaluation, metrics, checkpoints).

`simulate(Run(cfg, out))` runs it to its end; `simulate(Run.resume(out))` continues it. Callers read
the run's state from the `Run`; the driver holds none of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Self

import numpy as np
import torch

from dpfl.errors import BudgetExceededError, ConfigError, RunStopped
from dpfl.run.state import Run, available_memory
from dpfl.schemes.base import RoundContext, Step
from dpfl.schemes.round import (
    batch_plan,
    can_stream,
    local_plan,
    run_round,
)
from dpfl.schemes.sampling import local_positions, poisson_positions
from dpfl.training.trainer import ClientDP


class StopRequest:
    """While active (main thread only), the first SIGINT or SIGTERM is noted instead of killing the run,
    which then ends its round, saves a checkpoint and stops; a second one acts as usual."""

    def __init__(self):
        self.signal: str | None = None
        self._old: dict[int, Any] = {}

    def _note(self, signum, frame) -> None:
        import signal

        self.signal = signal.Signals(signum).name
        for s, h in self._old.items():  # a second signal stops at once
            signal.signal(s, h)
        os.write(2, f"\n{self.signal}: finishing this round, then saving a checkpoint (again to stop now)\n".encode())

    def __enter__(self) -> Self:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                old = signal.signal(s, self._note)
                self._old[s] = signal.SIG_DFL if old is None else old  # None: not set from Python
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for s, h in self._old.items():
            signal.signal(s, h)


Updates = Callable[[RoundContext, "torch.Tensor | None", bool], torch.Tensor]


class Simulator:
    """Drives `run` with its clients trained in this process (`simulate` runs it to its end).

    `wrap`: given the driver's local training (`client_updates`), returns the one the rounds use,
    e.g. an audit's that replaces its canaries' rows and trains the others as usual."""

    def __init__(self, run: Run, wrap: Callable[[Updates], Updates] | None = None):
        self.run = run
        self._updates: Updates = self.client_updates if wrap is None else wrap(self.client_updates)
        self._check_cohort_memory()

    def dp_round(self, r: int, cohort: np.ndarray) -> tuple[torch.Tensor, ClientDP, np.ndarray]:
        """Poisson batches [k, T, M] (global record indices), the round's ClientDP and q [k]."""
        run = self.run
        dp = run.cfg.train.dpsgd
        sizes = run.fed.sizes[cohort]
        samplers = [run.seeds.crypto("round", r, "dpsgd-sample", int(c)) for c in cohort]
        pos, weight, q = poisson_positions(sizes, run.local.steps, run.local.batch_size, samplers)
        idx = np.stack([run.fed.clients[c][p] for c, p in zip(cohort, pos)])
        per_example = pos.shape[2] * run.flat.n  # gradient values per client row and step
        cdp = ClientDP(dp.clip, run.record_sigma, torch.from_numpy(weight).to(run.device),
                       torch.from_numpy(q * sizes).to(run.device),
                       [run.seeds.crypto("round", r, "dpsgd-noise", int(c)) for c in cohort],
                       chunk=max(1, _DP_GRAD_VALUES // per_example))
        return torch.from_numpy(idx).to(run.device), cdp, q

    def _check_record_budget(self, r: int, cohort: np.ndarray) -> None:
        run = self.run
        dp = run.cfg.train.dpsgd
        if run.record is None or dp.target_epsilon is None or not len(cohort):
            return
        q = np.minimum(1.0, run.local.batch_size / run.fed.sizes[cohort].astype(np.float64))
        eps = run.record.epsilon_after(cohort, q, run.local.steps, dp.delta)
        if eps.max() > dp.target_epsilon:
            c = int(cohort[int(eps.argmax())])
            raise BudgetExceededError(f"round {r} would exceed train.dpsgd.target_epsilon = {dp.target_epsilon} "
                                      f"(record-level; client {c} would reach {eps.max():.4g})")

    @property
    def piece(self) -> int:
        """Clients trained and sent at a time when the round streams (`Scheme.streams`, run.max_cohort, no
        attack, no record-level DP); 0: the whole cohort at once."""
        m = self.run.cfg.run.max_cohort
        return m if m and self._can_stream() else 0

    def _can_stream(self) -> bool:
        run = self.run
        return can_stream(run.scheme) and run.attack is None and run.cfg.train.dpsgd is None

    def _check_cohort_memory(self) -> None:
        """A cohort trained in one piece holds at least one float32 [k, n] tensor. Refuse at start what
        cannot fit in the memory available (the kernel would kill the run without a word)."""
        run = self.run
        k = run.cfg.data.n_clients if run.scheme.all_clients else run.cfg.cohort_size()
        if self.piece:  # a streamed round holds one piece's rows; otherwise the pieces are put back together
            k = min(k, self.piece)
        avail = available_memory() if run.device.type == "cpu" else None
        need = 4 * k * run.flat.n
        if avail is not None and need > avail:
            fit = max(1, avail // (16 * run.flat.n))  # a quarter of what is available per piece
            how = (f"split the cohort with --set run.max_cohort={fit}" if self._can_stream() else
                   "this scheme's round needs every client's row at once (run.max_cohort only splits local "
                   "training): use fewer clients a round or a machine with more memory")
            raise ConfigError(f"training {k:,} clients at once needs at least {need / 1e9:.1f} GB (a float32 copy "
                              f"of the {run.flat.n:,} parameters per client) and {avail / 1e9:.1f} GB are "
                              f"available: {how}")

    def batches(self, r: int, cohort: np.ndarray) -> torch.Tensor:
        """Round r's local batches of `cohort`: rows of the training data, int64 [k, T, B]."""
        run = self.run
        sizes = run.fed.sizes[cohort]
        steps, batch = batch_plan(run.scheme, run.local, sizes)
        pos = local_positions(sizes, steps, batch, run.seeds.numpy("round", r, "batches"))
        idx = np.stack([run.fed.clients[c][p] for c, p in zip(cohort, pos)])
        return torch.from_numpy(idx).to(run.device)

    def client_updates(self, ctx: RoundContext, batches: torch.Tensor | None = None, seed: bool = True) -> torch.Tensor:
        """Local training of the answering cohort: Δw [k, n] (hook point for attacks). A streamed round
        passes each piece's rows of the whole cohort's `batches`, and seeds torch only for its first piece."""
        run = self.run
        mask, plan = local_plan(run.scheme, ctx)
        w, hook = run.w, None
        if plan is not None:
            w = run.w if plan.start is None else plan.start
            hook = plan.grad_hook
        dp = None
        if run.record is not None:
            if hook is not None:
                raise ConfigError(f"train.dpsgd does not combine with scheme {run.scheme.name!r}: it sets "
                                  "its own gradient corrections, which would bypass DP-SGD")
            batches, dp, _ = self.dp_round(ctx.round, ctx.cohort)
        elif batches is None:
            batches = self.batches(ctx.round, ctx.cohort)
        if seed:
            torch.manual_seed(run.seeds.seed("round", ctx.round, "torch"))  # dropout layers
        train = run.trainer.train if run.cfg.run.engine == "vectorized" else run.trainer.train_sequential
        u = train(w, run.fed.x, run.fed.y, batches, mask, grad_hook=hook, dp=dp)
        if run.attack is not None:
            u = run.attack.tamper(run.attack.train(run, ctx, u), ctx)
        return u

    def client_statistics(self, step: Step, ctx: RoundContext) -> torch.Tensor:
        """The answering clients' rows of `step`'s round statistic [k, n] (`Step.client_statistic`),
        one client at a time under the sequential engine, as a deployed client computes its own."""
        fed = self.run.fed
        rows = [fed.clients[c] for c in ctx.cohort]
        if self.run.cfg.run.engine == "vectorized":
            return step.client_statistic(ctx, fed.x, fed.y, rows)
        return torch.cat([step.client_statistic(ctx, fed.x, fed.y, [r]) for r in rows])

    def step_round(self) -> dict[str, Any]:
        """Run one round of `run` and return its metrics (not yet written)."""
        run = self.run
        run.setup()
        r = run.round + 1
        t0 = time.perf_counter()
        cohort, dropped = run.select(r)
        ctx = run.context(r, cohort, len(cohort) + len(dropped))
        if run.attack is not None:
            ctx.malicious = run.attack.select(ctx)
        trained = cohort[:0]
        extra = {"train_seconds": 0.0}

        rows_of, whole = {}, None  # a streamed round: each client's row of the whole cohort's batches

        def train(ctx: RoundContext) -> torch.Tensor:
            nonlocal trained, rows_of, whole
            self._check_record_budget(r, ctx.cohort)
            if self.piece and len(ctx.cohort) < ctx.k():  # train_seconds: the pieces' training only
                first, t = whole is None, time.perf_counter()
                if first:
                    whole = self.batches(r, cohort)
                    rows_of = {int(c): i for i, c in enumerate(cohort)}
                rows = torch.tensor([rows_of[int(c)] for c in ctx.cohort], device=whole.device)
                u = self._updates(ctx, whole[rows], first)
                extra["train_seconds"] = round(extra["train_seconds"] + time.perf_counter() - (t0 if first else t), 4)
            else:
                u = self._updates(ctx, None, True)
                extra["train_seconds"] = round(time.perf_counter() - t0, 4)
            if run.record is not None:  # they trained: their records are spent whatever happens next
                trained = ctx.cohort
                q = np.minimum(1.0, run.local.batch_size / run.fed.sizes[trained].astype(np.float64))
                run.record.add(trained, q, run.local.steps)
            return u

        out = run_round(run.scheme, ctx, run.accounting(), train=train,
                        send=lambda u, ctx: run.scheme.transport.transmit(u, ctx),
                        after_chain=None if run.attack is None else run.attack.after_chain,
                        gather=self.client_statistics,
                        totals=run.cum, n_clients=run.cfg.data.n_clients, sampling_rate=run.cfg.sampling_rate(),
                        extra=extra, piece=self.piece)
        rec_m = run.end_round(r, out, trained)
        if run.eval_due(r):
            t1 = time.perf_counter()
            rec_m.update(run.evaluate_global())
            if run.attack is not None:
                rec_m.update(run.attack.evaluate(run))
            rec_m["eval_seconds"] = round(time.perf_counter() - t1, 4)
            run.update_best(rec_m)
        rec_m["round_seconds"] = round(time.perf_counter() - t0, 4)
        return rec_m


def simulate(run: Run, on_round: Callable[[dict[str, Any]], None] | None = None,
             wrap: Callable[[Updates], Updates] | None = None, until: int | None = None) -> dict[str, Any]:
    """Train `run`'s remaining rounds (up to round `until`, else its last) in this process, calling
    `on_round` with each round's metrics, and return its summary. A first SIGINT/SIGTERM ends the
    round, saves a checkpoint and raises RunStopped. `wrap`: see `Simulator`."""
    sim = Simulator(run, wrap)
    run.setup()
    run.start_files()
    if run.ledger is not None:
        run.log(run.accounting_note())
    total = run.cfg.federation.rounds
    with StopRequest() as stop:
        while run.round < (total if until is None else min(total, until)):
            try:
                m = sim.step_round()
            except BudgetExceededError as e:
                run.stopped_reason = str(e)
                run.log(f"stopping: {e}")
                break
            run.write_round(m)
            if on_round:
                on_round(m)
            if stop.signal and run.round < total:
                if run.out:
                    run.save_checkpoint()
                where = (f"checkpoint saved; resume with `dpfl run --resume {run.out}`" if run.out
                         else "no run directory: nothing saved")
                raise RunStopped(f"stopped by {stop.signal} after round {run.round} of {total}; {where}")
    return run.finish()


_DP_GRAD_VALUES = 2**28  # per-example gradient values held at once by record-level DP-SGD (1 GiB float32)
