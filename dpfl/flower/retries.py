"""Flower's requests to the SuperLink, kept going through its server errors.

Flower 1.41 retries a request to the SuperLink on a lost connection and on HTTP 502-504 only. On an
HTTP 500 (the SuperLink's SQLite database locked past its 5 s busy timeout, say), 408 or 429 it gives
up: a SuperNode's loop ends and its process stays up, out of the federation; the ServerApp's grid
raises. The heartbeat threads of both die on such an answer.
`patient` retries those answers as 502-504 are, until `PATIENCE` s of them in a row (a server that
keeps answering 500 is broken, not busy); `steady_heartbeats` keeps a process's heartbeat threads
beating through any error but a 401. `check` (callers run it first) raises FlowerChanged where
Flower's retries differ. Used by dpfl-supernode (launcher.py) and the ServerApp (server.py); imports
Flower only when called.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import httpx

PATIENCE = 300.0
SERVER_ERRORS = (408, 429, 500)


class FlowerChanged(RuntimeError):
    """This Flower's retries or heartbeat are not the ones changed here."""


def patient(inv):
    """`inv` (Flower's HTTP retries, a RetryInvoker), changed in place to retry 500, 408 and 429 as it
    retries 502-504, until PATIENCE s have passed since the first of a streak with no success in the
    same thread (a ServerApp's heartbeat and log uploads share its grid's retries)."""
    flower_giveup, flower_success = inv.should_giveup, inv.on_success
    streak = threading.local()

    def should_giveup(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in SERVER_ERRORS:
            since = getattr(streak, "since", None)
            if since is None:
                streak.since = since = time.monotonic()
            return time.monotonic() - since > PATIENCE
        return flower_giveup(exc) if flower_giveup is not None else False

    def on_success(state) -> None:
        streak.since = None
        if flower_success is not None:
            flower_success(state)

    inv.should_giveup, inv.on_success = should_giveup, on_success
    return inv


def patient_invoker():
    """Flower's HTTP retries for a SuperLink client, made `patient`."""
    from flwr.supercore.retry import make_simple_http_retry_invoker

    return patient(make_simple_http_retry_invoker())


def check() -> None:
    """Raise FlowerChanged unless a `patient` invoker retries a 500 and the heartbeat is the one
    `steady_heartbeats` changes: callers check before they change anything."""
    try:
        from flwr.supercore import heartbeat

        inv = patient_invoker()
        with open(heartbeat.__file__, encoding="utf-8") as f:
            beats = f.read()
        known = (beats.count("self._retry_invoker.invoke(self._heartbeat)") == 1
                 and beats.count("HeartbeatFailure,  # The only exception we want to retry on") == 1
                 and callable(getattr(heartbeat.HeartbeatSender, "_heartbeat", None)))
    except (ImportError, AttributeError, OSError):
        known = False
    if known:
        inv.wait_function = lambda seconds: None
        inv.on_success = inv.on_backoff = inv.on_giveup = None
        answers: list[int] = []

        def answer() -> bool:
            answers.append(1)
            if len(answers) == 1:
                req = httpx.Request("POST", "https://superlink/")
                raise httpx.HTTPStatusError("500", request=req, response=httpx.Response(500, request=req))
            return True

        try:
            known = inv.invoke(answer) is True and len(answers) == 2
        except Exception:  # noqa: BLE001
            known = False
    if not known:
        raise FlowerChanged(f"the retries of Flower {_version()} are not the ones dpfl changes")


def _version() -> str:
    import flwr

    return flwr.__version__


def say(line: str) -> None:
    """`line` on stderr, flushed; nothing where stderr is closed."""
    with contextlib.suppress(Exception):
        print(line, file=sys.stderr, flush=True)


def steady_heartbeats() -> None:
    """Every HeartbeatSender of this process, those already beating included, keeps beating through
    any error but a 401 (Flower's threads end on an error they do not expect); after `check`."""
    from flwr.supercore import heartbeat

    sender = heartbeat.HeartbeatSender
    flower_heartbeat = sender._heartbeat
    if getattr(flower_heartbeat, "dpfl", False):
        return

    def steady(self) -> None:
        """HeartbeatSender._heartbeat, with every error but a 401 retried as a failed beat (one line
        per streak); after a 401 (on which Flower ends a SuperNode) it beats no more."""
        try:
            flower_heartbeat(self)
        except heartbeat.HeartbeatFailure:
            raise
        except Exception as e:
            if isinstance(e, httpx.HTTPStatusError) and e.response.status_code == 401:
                self._stop_event.wait()
                return
            if not getattr(self, "_dpfl_failing", False):
                say(f"dpfl: a heartbeat to the SuperLink failed ({type(e).__name__}: {e}); retrying")
            self._dpfl_failing = True
            raise heartbeat.HeartbeatFailure from e
        if getattr(self, "_dpfl_failing", False) and not self._stop_event.is_set():
            say("dpfl: heartbeats answered again")
        self._dpfl_failing = False

    steady.dpfl = True
    sender._heartbeat = steady
