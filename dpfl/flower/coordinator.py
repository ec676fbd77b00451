"""The server side of a deployed run: the scheme's round (`dpfl.schemes.round.run_round`), with
the client work done remotely.

`Coordinator` drives a `dpfl.run.state.Run` (model, scheme, selection, ledger, evaluation, the run
directory), the object the simulator drives too, through the same round (`run_round`), with `send`
reaching the clients by messages:

    selection (the simulator's) → run_round: privacy events and budget check
    → gather (schemes whose step needs a round statistic, FSVRG): "train.statistic" → each
            client's row → the step's combination (in run_round), sent with the training message
    → send, plain:  "train" → each client's codec payload → codec.decode → Received(rows)
            secure: ["train.sa_keys": share keys, only when the last round's unmask message did not
                    carry them] → "train.sa_train" (train, encode, mask) [→ "train.sa_consistency",
                    signed rounds] → "train.sa_unmask" (unmask; with round r + 1's plan and keys,
                    each client shares that round's keys) → the sum, through `secagg.rounds.ServerRound`
                    (the server's phases, as the simulator drives them); the round's public keys were
                    advertised in the hello, so a round costs two exchanges (three signed)
    → the scheme's aggregator → server chain (reversed) → ledger, metrics; then w ← w + Δ, evaluation:
      on the server's test data at once; on the sites' held-out data (federated) with the next
      round's training message (its metrics line is completed then), or an "evaluate" exchange
      after the last round.

It talks to clients through an `Exchange` (send one content per node, collect the replies);
`dpfl.flower.server` gives it Flower's Grid, `dpfl.flower.loopback` an in-process one.
A round whose secure sum cannot complete (too few clients at some phase, or shares that cannot be
corrected and verified: `RoundAborted`) releases nothing: the model stays as it was and no
privacy event is recorded (the rule of `run_round`, the same in the simulator). A client's
malformed reply only drops that client (docs/threat-model.md).

Signed rounds: when every node's hello carries a signing key bound to its registered node key
(node config `signing-key`, `peers`), secure rounds are signed: the plan carries every cohort
member's key and binding (each client checks them against its own peers file), advertised keys
are signed, and each survivor signs the survivor list before unmasking. Some nodes signing and
others not is a ConfigError at start.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from dpfl.config import RunConfig
from dpfl.errors import BudgetExceededError, ConfigError, DataError, ProtocolError
from dpfl.flower import certs, wire
from dpfl.flower.client import SHARE_SHAPE
from dpfl.flower.node import (
    OsSeeds,
    check_record_dp,
    decode_sum,
    distributed_correlated,
    round_secagg,
    round_values,
)
from dpfl.run.state import CHECKPOINT, CONFIG, METRICS, Run
from dpfl.schemes.base import Received, RoundContext, Step
from dpfl.schemes.round import batch_plan, run_round
from dpfl.secagg import keys as kx
from dpfl.secagg.prg import default_workers
from dpfl.secagg.protocol import AdvertiseKeys, RoundAborted, RoundConfig, keys_statement
from dpfl.secagg.rounds import ServerRound
from dpfl.secagg.simulate import make_config

# where the global model is evaluated: on the server's test data (metrics accuracy, loss, ...), on
# each site's held-out data added up (fed_accuracy, fed_loss, fed_examples, fed_sites), or both;
# "federated" alone: the server loads no dataset (`Run(data=False)`)
EVALUATION = ("server", "federated", "both")


@dataclass
class Reply:
    content: RecordDict | None  # None when the client answered with an error
    error: str | None
    up_nbytes: int  # serialized size of the reply
    down_nbytes: int  # serialized size of the message the server sent


@dataclass
class Prepared:
    """A secure round whose keys were shared ahead of its training (phase 1 done)."""

    round: int
    cohort: np.ndarray
    node_at: dict[int, int]  # position → node
    sec: dict[str, Any]  # the plan's secure-sum configuration (d = b = 0 until the masked inputs)
    rnd: ServerRound
    inbox: dict[int, dict[int, bytes]] | None = None


def one_line(text: str, limit: int = 300) -> str:
    """A site's text as one line of at most `limit` characters (it may be anything)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


Exchange = Callable[..., dict[int, Reply]]
"""exchange(kind, contents, timeout, quorum=None) → replies by node: once the `quorum` is met, the
rest get a short grace (GridExchange); an exchange with `connected()` lists the nodes connected now,
one with `late_errors()` the nodes that answered an earlier message with an error after its
exchange had ended."""

Quorum = int | tuple[tuple[frozenset[int], int], ...]
"""k: k answers from the nodes sent to; ((nodes, k), ...): k answers from each group of nodes."""


def quorum_open(quorum: Quorum, sent: Collection[int], answered: Collection[int], pending: Collection[int]) -> bool:
    """Whether to keep waiting for the pending nodes without a grace: some group of the quorum has
    fewer than its k answers (`answered`: replies with content) and could still reach k, or, where
    errors made that impossible, fewer than k replies of any kind (fewer answers are still of use)."""
    groups = ((frozenset(sent), int(quorum)),) if isinstance(quorum, Integral) else quorum
    ok, wait = set(answered), set(pending)
    replied = set(sent) - wait
    return any(len(g & ok) < k and (k <= len(g & (ok | wait)) or len(g & replied) < k) for g, k in groups)


def _redraws(scheme: Any) -> bool:
    """The server draws some noise again in later rounds (central DP-FTRL tree noise)."""
    return any(getattr(s, "name", "") == "correlated_noise" and s.noise == "central" and s.mf.name == "tree"
               for s in scheme.steps)


class Coordinator:
    """One deployed run. `Coordinator(cfg, exchange, nodes).run()`."""

    def __init__(self, cfg: RunConfig, exchange: Exchange, nodes: list[int], out_dir: str | Path | None = None,
                 reproducible: bool = False, timeout: float = 300.0, log: Callable[[str], None] = print,
                 resume: bool = False, evaluation: str = "both", peers: Mapping[int, Any] | None = None,
                 config_text: str = ""):
        if cfg.attack is not None and cfg.attack.name != "none":
            raise ConfigError("attacks are simulation-only; remove the [attack] section to deploy")
        check_record_dp(cfg)
        if evaluation not in EVALUATION:
            raise ConfigError(f"evaluation must be one of {', '.join(EVALUATION)}, got {evaluation!r}")
        self.cfg, self.exchange, self.timeout, self.log = cfg, exchange, float(timeout), log
        self.evaluation = evaluation
        # the operator-approved site keys (certs.read_peers): every site must prove its key at hello
        self.peers, self.config_text = peers, config_text
        self.reproducible = reproducible
        self.out = Path(out_dir) if out_dir else None
        if resume:
            self.state = self._resumed(cfg, log)
        else:
            if self.out and (self.out / CHECKPOINT).exists():
                raise ConfigError(f"{self.out} already holds a deployed run with a checkpoint; resume it (run config "
                                  "resume = true: `dpfl flower local --resume`, or `dpfl flower app ... --resume` "
                                  "by hand) or choose another out-dir (`--results`)")
            self.state = Run(cfg, self.out, log, data=evaluation != "federated")  # federated only: no data
        if cfg.run.checkpoint_every != 1:  # (a written config always carries it: a note, not an error)
            log(f"note: run.checkpoint_every = {cfg.run.checkpoint_every} does not apply to a deployed run, which "
                "checkpoints every round (a round released after the last checkpoint would be released again on "
                "resume, its noise uncounted)")
        self.state.checkpoint_every = 1
        if resume and distributed_correlated(self.state.scheme):
            raise ConfigError("a run with distributed correlated noise cannot be resumed over Flower: the sites' "
                              "states (the secrets their noise shares continue from) end with the Flower run")
        if resume and reproducible and self.state.noise_key is not None:
            raise ConfigError(f"{self.out} ran on OS randomness (its checkpoint holds a noise key): resuming it "
                              "reproducible would draw the rest of its noise from the public config seed")
        if not reproducible:  # selection, server-side ties and central noise from the OS
            if resume and self.state.noise_key is None and _redraws(self.state.scheme):
                raise ConfigError(f"{self.out}'s checkpoint holds no server noise key (the run was reproducible), "
                                  "but its central correlated noise draws earlier rounds' noise again: resume it "
                                  "reproducible")
            self.state.seeds = OsSeeds(self.state.noise_key)  # a resumed run goes on with its key
            if _redraws(self.state.scheme):  # kept in the checkpoint (mode 0600) only where it is needed
                self.state.noise_key = self.state.seeds.key
        self.state.setup()
        if self.state.site_salt is None:  # the salt of the sites' data MACs: one per run, kept on resume
            if resume:
                log(f"note: {self.out / CHECKPOINT} records no salted site data MACs (written before 2026-11-28): "
                    "the sites' data cannot be checked against the run's; they are recorded afresh")
            self.state.site_salt = (hashlib.sha256(f"dpfl site data salt;{cfg.seed}".encode()).digest()
                                    if reproducible else os.urandom(wire.SALT_BYTES))
        self.scheme = self.state.scheme
        if self.scheme.transport.drop_after_masking:
            log("note: drop_after_masking simulates failures; over Flower only real failures happen")
        self.nodes = list(nodes)
        self.node_of: dict[int, int] = {}
        self.sizes = np.zeros(cfg.data.n_clients, dtype=np.int64)
        self.hashes: dict[int, str] = {}  # client → its data MAC, as its last hello said
        self.round_keys: dict[int, list[tuple[bytes, bytes]]] = {}  # client → (enc, mask) public keys per round
        self.signing: dict[int, tuple[bytes, bytes, list[bytes]]] = {}  # client → (Ed25519 key, binding, key sigs)
        self.signed: bool | None = None  # secure rounds are signed (decided at the hello)
        self.history: list[dict[str, Any]] = []
        self.bytes = {"up": 0, "down": 0}  # serialized message bytes of the current round
        self.phases: dict[str, dict[str, float]] = {}  # this round's exchanges: wall and ClientApp time split
        self.silent: set[int] = set()  # nodes that did not answer some message of the last round
        self.erred: dict[int, str] = {}  # node → its error: nodes that answered some message of the last round so
        self.answered: set[int] = set()  # clients whose replies were taken in the last phase the round reached
        self.aborted = 0
        self.prepared: Prepared | None = None  # the next secure round, its keys shared with this one's unmasking
        self.unshared = 0  # a round whose key sharing failed with the previous unmask message (it aborts)
        self.awaiting_w: torch.Tensor | None = None  # the model `awaiting`'s round released
        self.selected: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.awaiting: dict[str, Any] | None = None  # a round's metrics awaiting its federated evaluation
        self.evaluations: dict[int, dict[str, Any]] = {}  # node → its counts for the awaited round
        self.rejoined: set[int] = set()  # clients greeted again before this round
        self.done: list[dict[str, Any]] = []  # the earlier round whose metrics this round completed

    def _resumed(self, cfg: RunConfig, log: Callable[[str], None]) -> Run:
        """The run in `out_dir`, restored from its checkpoint (model, scheme state, privacy ledger)."""
        if self.out is None:
            raise ConfigError("resume needs the run's out-dir (run config out-dir)")
        if not (self.out / CHECKPOINT).is_file():
            raise ConfigError(f"{self.out} holds no {CHECKPOINT} to resume from")
        st = Run.resume(self.out, log, data=self.evaluation != "federated")
        if st.cfg.model_dump() != cfg.model_dump():
            raise ConfigError(f"the run config differs from the one {self.out} was started with ({CONFIG}); "
                              "a resume continues the same run")
        log(f"resuming {self.out} after round {st.round}"
            + ("" if st.ledger is None else f", ε so far {st.ledger.epsilon(cfg.privacy.delta):.4g}"))
        return st

    # ---- setup ----------------------------------------------------------------------
    def hello(self) -> None:
        """Learn which client each node holds and its data size; check they built the same scheme.
        Every listed node is asked: a node that does not answer, or answers with an error or a
        hello the checks refuse (a stale id a SuperLink database still lists, a key not in peers, data
        other than the run recorded), is left out and logged; each client must then be held by exactly
        one node. The run records each client's data MAC (the summary's, without server data)."""
        n = self.cfg.data.n_clients
        if len(self.nodes) < n:
            raise ConfigError(f"{len(self.nodes)} nodes connected but data.n_clients = {n}: one node per client")
        replies = self.exchange("query", {node: wire.hello_request(self.state.site_salt) for node in self.nodes},
                                self.timeout, n)
        seeded, claims, left = set(), {}, {}
        for node in self.nodes:
            rep = replies.get(node)
            if rep is None or rep.content is None:
                left[node] = f"did not answer the hello: {rep.error if rep else 'no reply'}"
                continue
            try:
                cid, is_seeded, h = self._greet(node, rep.content)
            except (ProtocolError, ConfigError, DataError) as e:
                if len(self.nodes) == n:
                    raise  # no spare node: the run cannot start
                left[node] = str(e)
                continue
            self._keep(cid, h)
            claims.setdefault(cid, []).append(node)
            seeded.add(is_seeded)
        twice = {c: v for c, v in claims.items() if len(v) > 1}
        if twice:
            raise ConfigError(f"several nodes claim the same partition-id: {twice}; ids must be distinct")
        for node, why in left.items():
            self.log(f"node {node} left out: {why}")
        missing = sorted(set(range(n)) - set(claims))
        if missing:
            why = "; ".join(f"node {node} {why}" for node, why in left.items())
            raise ProtocolError(f"no node answered the hello for clients {missing} ({why})")
        self.node_of = {cid: v[0] for cid, v in sorted(claims.items())}
        for cid in self.node_of:  # the run's record of the sites' data (a resumed run's stays)
            self.state.sites.setdefault(cid, self.hashes[cid])
        self.signed = self._signing_policy()
        if self.reproducible and seeded != {True}:
            self.log("note: reproducible server but unseeded clients: results will not match the simulator")
        if not self.reproducible and True in seeded:
            self.log("WARNING: some clients run with dpfl-seeded = true: their noise is derivable from the seed")

    def _signing_policy(self) -> bool:
        """Secure rounds are signed iff every node's hello carries a signing key; some and not
        others is a ConfigError (no client would take the rounds of the other kind)."""
        signing = {cid for cid in self.node_of if cid in self.signing}
        if signing and signing != set(self.node_of):
            raise ConfigError(f"clients {sorted(signing)} sign their secure rounds (node config signing-key, peers), "
                              f"clients {sorted(set(self.node_of) - signing)} do not: configure every node alike")
        if signing:
            self.log(f"secure rounds are signed: {len(signing)} clients' signing keys bound to their registered keys")
        return bool(signing)

    def _greet(self, node: int, content: RecordDict) -> tuple[int, bool, dict[str, Any]]:
        """One node's hello, checked: (client id, seeded, the hello for `_keep`). Data whose MAC differs
        from the one the run recorded for that client are refused."""
        n = self.cfg.data.n_clients
        h = wire.read_hello(content, self.cfg.federation.rounds, self.scheme.transport.secure)
        cid = h["cid"]
        if not 0 <= cid < n:
            raise ConfigError(f"node {node} claims partition-id {cid}: ids must be in [0, {n})")
        was = self.state.sites.get(cid)
        if was is not None and h["data"] != was:
            raise DataError(f"client {cid}'s data differ from the run's (data MAC {h['data'][:12]}, the run recorded "
                            f"{was[:12]}; or its site key changed): refused")
        if h["describe"] != self.scheme.describe():
            raise ConfigError(f"client {cid} built {h['describe']!r}, the server {self.scheme.describe()!r}: "
                              "configs differ")
        signing = h["signing"]
        if self.signed is not None and self.signed != (signing is not None):
            raise ConfigError(f"client {cid} {'does not sign' if self.signed else 'signs'} its secure rounds, this run's "
                              f"are {'signed' if self.signed else 'unsigned'}")
        if signing is not None:
            vk, _, sigs = signing
            bad = [r for r, ((enc, mask), sig) in enumerate(zip(h["keys"], sigs), start=1)
                   if not kx.verify(vk, sig, keys_statement(r, cid, enc, mask))]
            if bad:
                raise ProtocolError(f"client {cid}: its round keys of rounds {bad} are not signed by its signing key")
        if self.peers is not None and not (
                signing is not None and cid in self.peers
                and certs.check_binding(self.peers[cid], signing[1], self.config_text, cid, signing[0])):
            raise ProtocolError(f"node {node} claims client {cid} without a binding by that site's key in the "
                                "server's peers file: refused")
        return cid, h["seeded"], h

    def _keep(self, cid: int, h: dict[str, Any]) -> None:
        """Client cid's data size, data MAC, round keys and signing key, from a hello `_greet` accepted."""
        self.sizes[cid], self.round_keys[cid], self.hashes[cid] = h["size"], h["keys"], h["data"]
        if h["signing"] is not None:
            self.signing[cid] = h["signing"]
        else:
            self.signing.pop(cid, None)

    def rejoin(self, r: int) -> list[int]:
        """Before round r: greet nodes that connected since (a restarted site without node
        authentication gets a new node id) and known nodes that answered the last round with an
        error (a restarted site keeps its id but lost its keys), then or since (a restarted site
        still working through messages sent while it was away answers after their exchange ended).
        A client whose node did not answer its last round is served by the node that now says it
        holds it. A known node whose hello says it kept its state, with the same round keys, had an
        error, not a restart: it is not counted as rejoined. Returns who rejoined."""
        listed = getattr(self.exchange, "connected", None)
        late, forget = getattr(self.exchange, "late_errors", None), getattr(self.exchange, "forget", None)
        known = set(self.node_of.values())
        new = set(listed()) - known if listed else set()
        erred = set(self.erred.keys())
        try:
            found = late() if late else {}
        except Exception as e:  # noqa: BLE001  (an optional look back; the round's own exchanges follow)
            self.log(f"round {r}: could not look for late replies: {one_line(e)}")
            found = {}
        for node, error in sorted(found.items()):
            if node in known and node not in erred:
                self.log(f"round {r}: node {node} answered an earlier message late, with an error: {one_line(error)}")
                erred.add(node)
        ask = sorted(new | (erred & known))
        if not ask:
            return []
        replies = self.exchange("query", {node: wire.hello_request(self.state.site_salt) for node in ask}, self.timeout,
                                len(ask))
        back = []
        for node in ask:
            rep = replies.get(node)
            if rep is None or rep.content is None:
                continue
            try:
                cid, _, h = self._greet(node, rep.content)
            except (ProtocolError, ConfigError, DataError) as e:
                self.log(f"round {r}: node {node} cannot rejoin: {e}")
                continue
            old = self.node_of.get(cid)
            if old is not None and old != node and old not in self.silent | self.erred.keys():
                self.log(f"round {r}: node {node} claims client {cid}, which node {old} still serves: refused")
                continue
            kept = old == node and h.get("fresh") is False and h["keys"] == self.round_keys.get(cid)
            self._keep(cid, h)
            self.node_of[cid] = node
            if forget is not None:  # its answers to messages from before this hello are of no more use
                forget(node)
            if kept:  # the same node with the same keys, its shares kept: its error was not a restart
                self.log(f"round {r}: node {node} kept its state (its error was not a restart): client {cid} "
                         "is not made to sit out")
                continue
            back.append(cid)
        if back:
            self.log(f"round {r}: clients {back} rejoined (fresh round keys)")
        return back

    # ---- one round ------------------------------------------------------------------
    def plan(self, r: int, n_selected: int, cohort: np.ndarray, index: int, secagg: dict | None = None) -> ConfigRecord:
        sizes = self.sizes[cohort]
        steps, batch = batch_plan(self.scheme, self.state.local, sizes)
        return wire.RoundPlan(round=r, cohort=[int(c) for c in cohort], sizes=[int(s) for s in sizes],
                              index=index, answering=len(cohort), n_selected=n_selected, steps=steps,
                              batch=batch, describe=self.scheme.describe(), secagg=secagg or {},
                              values=round_values(self.scheme)).to_record()

    def step_round(self) -> dict[str, Any]:
        st, cfg = self.state, self.cfg
        r = st.round + 1
        t0 = time.perf_counter()
        back = self.rejoin(r)
        self.rejoined = set(back)
        cohort, dropped = self.select(r)
        ctx = st.context(r, cohort, len(cohort) + len(dropped), self.sizes[cohort])  # sizes as the sites said
        self.bytes = {"up": 0, "down": 0}
        self.silent, self.erred, self.answered = set(), {}, set()
        self.phases: dict[str, dict[str, float]] = {}
        extra = {"flower_up_bytes": 0, "flower_down_bytes": 0}

        def train(ctx: RoundContext) -> None:  # the clients train on their nodes, within `send`
            if st.record is not None:  # the server's view: every client asked to train spent
                q = np.minimum(1.0, st.local.batch_size / self.sizes[ctx.cohort].astype(np.float64))
                st.record.add(ctx.cohort, q, st.local.steps)  # (each client also enforces its own budget)

        def send(u: None, ctx: RoundContext) -> Received:
            try:
                return self.secure(ctx, ctx.cohort) if self.scheme.transport.secure else self.plain(ctx, ctx.cohort)
            finally:
                extra["flower_up_bytes"], extra["flower_down_bytes"] = self.bytes["up"], self.bytes["down"]

        def gather(step: Step, ctx: RoundContext) -> torch.Tensor:
            try:
                return self.statistic_rows(ctx)
            finally:
                extra["flower_up_bytes"], extra["flower_down_bytes"] = self.bytes["up"], self.bytes["down"]

        out = run_round(self.scheme, ctx, st.accounting(), train=train, send=send, gather=gather, totals=st.cum,
                        n_clients=cfg.data.n_clients, sampling_rate=cfg.sampling_rate(), extra=extra)
        m = st.end_round(r, out, cohort)  # the server's view: every client asked to train spent
        if out.delta is not None:
            m["answered"] = int(out.received.count)  # over Flower: the clients whose rows are in the sum
        else:
            m["answered"] = len(self.answered)  # who answered the last phase the round reached
            if "aborted" in m:
                self.aborted += 1
                self.log(f"round {r}: {m['aborted']}; nothing released, the model is unchanged")
        m["absent"] = sorted(int(c) for c in cohort if int(c) not in self.answered)  # asked, not in the result
        if back:
            m["rejoined"] = back
        self.done = [d for d in [self.finish_evaluation()] if d is not None]  # the last round's, if awaited
        if st.eval_due(r):
            if self.evaluation != "federated":
                m.update(st.evaluate_global())
            if self.evaluation != "server":
                self.awaiting = m  # the sites evaluate this model with the next round's training
                self.awaiting_w = st.w.detach().cpu().clone()  # (sites the next round does not reach: this one)
            else:
                st.update_best(m)
        for kind, split in self.phases.items():  # per exchange: wall time, and the slowest ClientApp's split
            m.update({f"flower_{kind}_{part}_seconds": round(v, 4) for part, v in split.items()})
        m["round_seconds"] = round(time.perf_counter() - t0, 4)
        return m

    def evaluation_exchange(self, r: int, nodes: list[int], w: torch.Tensor) -> dict[int, dict[str, Any]]:
        """The model `w` (after round r) on the held-out data of the sites at `nodes`: their counts."""
        model = wire.vector_record(w.detach().cpu().numpy())
        replies = self.send("evaluate", {node: RecordDict({wire.MODEL: model}) for node in nodes},
                            self.quorum(len(nodes)))
        cid_of = {node: cid for cid, node in self.node_of.items()}
        got = {node: self.read(r, cid_of[node], replies.get(node), wire.read_evaluation) for node in nodes}
        return {node: g for node, g in got.items() if g is not None}

    @staticmethod
    def fed_metrics(counts: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
        """The sites' counts added up: examples weigh."""
        tot = {"n": 0, "correct": 0, "loss_sum": 0.0}
        sites = 0
        for got in counts.values():
            if got["n"]:
                sites += 1
                for k in tot:
                    tot[k] += got[k]
        out: dict[str, Any] = {"fed_sites": sites, "fed_examples": tot["n"]}
        if tot["n"]:
            out.update(fed_accuracy=tot["correct"] / tot["n"], fed_loss=tot["loss_sum"] / tot["n"])
        return out

    def send(self, kind: str, contents: dict[int, RecordDict], quorum: Quorum | None = None) -> dict[int, Reply]:
        """Send, count bytes, and keep the replies that carry content (errors are logged: dropped).
        Once the `quorum` is met, the others get a short grace (`Exchange`)."""
        t0 = time.perf_counter()
        replies = self.exchange(kind, contents, self.timeout, quorum)
        split = {"wall": time.perf_counter() - t0, "launch": 0.0, "import": 0.0, "work": 0.0}
        for rep in replies.values():  # the slowest client's launch, import and work (`wire.read_timing`)
            for part, v in wire.read_timing(rep.content).items():
                split[part] = max(split[part], v)
        self.phases[kind.removeprefix("train.")] = split
        out = {}
        for node in contents:
            rep = replies.get(node)
            if rep is None:
                self.log(f"{kind}: node {node} did not answer (dropped)")
                self.silent.add(node)
                continue
            self.bytes["up"] += rep.up_nbytes
            self.bytes["down"] += rep.down_nbytes
            if rep.content is None:
                self.log(f"{kind}: node {node} failed: {rep.error} (dropped)")
                self.erred[node] = rep.error
            else:
                out[node] = rep
        return out

    def nobody(self, r: int, what: str = "answered") -> RoundAborted:
        """Round r aborted for want of answers, with the lowest client's error (the reason, when every
        site refuses alike: a spent privacy budget, a config it rejects)."""
        why = ""
        if self.erred:
            client = {node: cid for cid, node in self.node_of.items()}
            cid, error = min((client.get(node, -1), e) for node, e in self.erred.items())
            why = f" ({len(self.erred)} answered with an error; client {cid}: {one_line(error)})"
        return RoundAborted(f"round {r}: no client {what}{why}")

    def read(self, r: int, cid: int, rep: Reply | None, parse: Callable[[RecordDict], Any]) -> Any:
        """Parse one client's reply (None if it sent none); a malformed one is logged and its
        sender treated as dropped."""
        if rep is None:
            return None
        try:
            return parse(rep.content)
        except (ProtocolError, KeyError) as e:
            self.log(f"round {r}: rejected client {cid}: {e}")
            return None

    def keep(self, ctx: RoundContext, answered: list[bool]) -> None:
        """The clients that answered stay in the round (the aggregator's weights follow them)."""
        self.answered = {int(c) for c, a in zip(ctx.cohort, answered) if a}
        if not all(answered):
            keep = np.array(answered)
            ctx.cohort, ctx.weights = ctx.cohort[keep], ctx.weights[torch.from_numpy(keep).to(ctx.weights.device)]

    @staticmethod
    def quorum(k: int) -> int:
        """Plain rounds: once all but one client have answered, the last gets a grace period."""
        return max(1, k - 1)

    def statistic_rows(self, ctx: RoundContext) -> torch.Tensor:
        """The first exchange of a scheme that needs a round statistic: each client's row [k, n]
        (clients that do not answer, or answer malformed rows, leave the round)."""
        cohort, n = ctx.cohort, self.state.flat.n
        model = wire.vector_record(self.state.w.detach().cpu().numpy())
        contents = {self.node_of[int(c)]: RecordDict({wire.PLAN: self.plan(ctx.round, ctx.n_selected, cohort, i), wire.MODEL: model})
                    for i, c in enumerate(cohort)}
        replies = self.send("train.statistic", contents, self.quorum(len(cohort)))
        rows = [self.read(ctx.round, int(c), replies.get(self.node_of[int(c)]),
                          lambda m: wire.read_vector(m, n, wire.STATISTIC)) for c in cohort]
        if all(r is None for r in rows):
            raise self.nobody(ctx.round, "sent its statistic row")
        self.keep(ctx, [r is not None for r in rows])
        return torch.from_numpy(np.stack([r for r in rows if r is not None])).to(self.state.device)

    def models(self, ctx: RoundContext) -> dict[str, ArrayRecord]:
        """What every client of the round trains from: the model, and the round statistic if any."""
        out = {wire.MODEL: wire.vector_record(self.state.w.detach().cpu().numpy())}
        if ctx.statistic is not None:
            out[wire.STATISTIC] = wire.vector_record(ctx.statistic.detach().cpu().numpy())
        return out

    def plain(self, ctx: RoundContext, cohort: np.ndarray) -> Received:
        models = self.models(ctx)
        contents = {self.node_of[int(c)]: RecordDict({wire.PLAN: self.plan(ctx.round, ctx.n_selected, cohort, i), **models,
                                                      **self.evaluation_part(self.node_of[int(c)])})
                    for i, c in enumerate(cohort)}
        replies = self.send("train", contents, self.quorum(len(cohort)))
        self.take_evaluations(replies)
        codec = self.scheme.transport.codec
        payloads, dims, answered, reports = [], set(), [], []
        for c in cohort:
            got = self.read(ctx.round, int(c), replies.get(self.node_of[int(c)]),
                            lambda m: (wire.read_payload(m), wire.read_shape(m, False)[0], wire.read_report(m)))
            answered.append(bool(got))
            if got:
                payloads.append(got[0])
                dims.add(got[1])
                reports.append(got[2])
        if not payloads:
            raise self.nobody(ctx.round)
        self.keep(ctx, answered)
        if len(dims) != 1:
            raise ProtocolError(f"round {ctx.round}: clients sent rows of different lengths {sorted(dims)}")
        self.hand_reports(ctx, reports)
        payload, d = wire.stack_payloads(payloads), dims.pop()
        rows = codec.decode(payload, d).to(self.state.device)
        return Received(rows=rows, total=rows.sum(0), count=rows.shape[0],
                        upstream_bytes=payload.per_client_nbytes(), width=d)

    def hand_reports(self, ctx: RoundContext, reports: list[dict[str, np.ndarray]]) -> None:
        """The answering clients' step reports (`Step.client_report`), stacked in cohort order, to
        their steps' `server_report`."""
        names = set(reports[0])
        if any(set(r) != names for r in reports):
            raise ProtocolError(f"round {ctx.round}: clients reported different values {sorted(names)}")
        for i, s in enumerate(self.scheme.steps):
            mine = sorted(n for n in names if n.split("/", 1)[0] == str(i))
            if mine:
                try:
                    stacked = {n.split("/", 1)[1]: torch.from_numpy(np.concatenate([r[n] for r in reports]))
                               for n in mine}
                except ValueError as e:
                    raise ProtocolError(f"round {ctx.round}: clients' reports do not stack: {e}") from None
                s.server_report(stacked, ctx)

    # ---- the secure sum: phase 1 of round r + 1 rides on round r's unmask message -----------
    def prepare(self, r: int, cohort: np.ndarray, n_selected: int) -> tuple[Prepared, dict[int, dict]]:
        """Round r's phase 1 as message parts: each cohort member's plan and its neighbours' keys
        (advertised in the hello). d and b are 0 in the plan: the masked inputs fix them."""
        k = len(cohort)
        probe = round_secagg(self.scheme.transport, k, self.state.flat.n)  # graph and threshold do not depend on d
        seed = self.state.seeds.seed("round", r, "secagg") if self.reproducible else None
        shape = make_config(k, *SHARE_SHAPE, threshold=probe.threshold, neighbours=probe.neighbours,
                            min_survivors=max(1, k - probe.max_dropouts), rng_seed=seed, round_id=r)
        sec = {"bits": 0, "d": 0, "threshold": shape.threshold, "min_survivors": shape.min_survivors,
               "graph": dict(shape.neighbours)}
        signed = bool(self.signed)
        vks = {i: self.signing[int(c)][0] for i, c in enumerate(cohort)} if signed else None
        if signed:  # each member's key and binding, for every client to check against its peers file
            sec.update(signing_keys=[vks[i] for i in range(k)], bindings=[self.signing[int(c)][1] for c in cohort])
        adv = {}
        for i, c in enumerate(cohort):  # keys of small order are rejected here: that client sits the round out
            try:
                keys = [kx.check_public(pk, f"client {int(c)}") for pk in self.round_keys[int(c)][r - 1]]
                adv[i] = AdvertiseKeys(i, r, *keys, self.signing[int(c)][2][r - 1] if signed else b"")
            except ProtocolError as e:
                self.log(f"round {r}: rejected client {int(c)}: {e}")
        ids = {i: int(c) for i, c in enumerate(cohort)} if signed else None
        rc = RoundConfig(r, k, *SHARE_SHAPE, shape.neighbours, shape.threshold, shape.min_survivors, vks, ids)
        rnd = ServerRound(rc, workers=default_workers(),
                          on_reject=lambda i, why: self.log(f"round {r}: rejected client {int(cohort[i])}: {why}"))
        neighbour_keys = rnd.keys(adv)
        pend = Prepared(r, cohort.copy(), {i: self.node_of[int(c)] for i, c in enumerate(cohort)}, sec, rnd)
        parts = {i: {"plan": self.plan(r, n_selected, cohort, i, sec), "keys": wire.keys_record(neighbour_keys[i])}
                 for i in sorted(neighbour_keys)}
        return pend, parts

    def take_shares(self, pend: Prepared, replies: dict[int, Reply], name: str = wire.SECAGG) -> Prepared:
        """The shares of round `pend.round` that arrived: the inboxes of its masking phase."""
        r, msgs = pend.round, {}
        for i, node in pend.node_at.items():
            rep = replies.get(node)
            if rep is not None and wire.NEXT_ERROR in rep.content:
                why = rep.content[wire.NEXT_ERROR].get("error")  # the client's words: logged, quoted
                self.log(f"round {r}: client {int(pend.cohort[i])} cannot join: {str(why)[:300]!r}")
            msg = self.read(r, int(pend.cohort[i]), rep if rep is None or name in rep.content else None,
                            lambda m: wire.read_share(m[name]))
            if msg is not None:
                msgs[i] = msg
        pend.inbox = pend.rnd.shares(msgs)
        return pend

    def keys_exchange(self, r: int, cohort: np.ndarray, n_selected: int) -> Prepared:
        """Round r's phase 1 in an exchange of its own (the first round; after an aborted round, a
        resume or a rejoin)."""
        pend, parts = self.prepare(r, cohort, n_selected)
        need = pend.rnd.cfg.min_survivors
        replies = self.send("train.sa_keys", {pend.node_at[i]: RecordDict(p) for i, p in parts.items()}, need)
        self.answered = {int(cohort[i]) for i in parts if pend.node_at[i] in replies}
        return self.take_shares(pend, replies)

    def secure(self, ctx: RoundContext, cohort: np.ndarray) -> Received:
        r, k = ctx.round, len(cohort)
        transport = self.scheme.transport
        pend, self.prepared = self.prepared, None
        if self.unshared == r:  # its keys went out with the last unmask message, to too few: no second sharing
            raise RoundAborted(f"round {r}: too few clients shared its keys with round {r - 1}'s unmasking")
        if pend is None:
            pend = self.keys_exchange(r, cohort, ctx.n_selected)
        elif pend.round != r or not np.array_equal(pend.cohort, cohort):
            raise RuntimeError(f"round {r}: keys were shared for another cohort")  # `select` draws a round once
        else:  # a member whose node changed since, or that rejoined, lost what it shared: it sits out
            for i in [i for i in pend.inbox if self.node_of.get(int(cohort[i])) != pend.node_at[i]
                      or int(cohort[i]) in self.rejoined]:
                del pend.inbox[i]
        rnd, node_at, sec, signed = pend.rnd, pend.node_at, pend.sec, bool(self.signed)
        need = rnd.cfg.min_survivors  # once this many have answered a phase, the rest get a short grace
        models = self.models(ctx)

        def contents(ids, extra: Callable[[int], dict]) -> dict[int, RecordDict]:
            return {node_at[i]: RecordDict({wire.PLAN: self.plan(ctx.round, ctx.n_selected, cohort, i, sec), **extra(i)}) for i in ids}

        # phase 2: train, encode, mask (and evaluate the model received, for the last round's metrics)
        replies = self.send("train.sa_train", contents(sorted(pend.inbox), lambda i: {
            **models, "inbox": wire.inbox_record(pend.inbox[i]), **self.evaluation_part(node_at[i])}), need)
        self.take_evaluations(replies)
        got = {}
        for i in sorted(pend.inbox):
            rep = replies.get(node_at[i])
            shape = self.read(r, int(cohort[i]), rep, lambda m: wire.read_shape(m, True))
            msg = None if shape is None else self.read(r, int(cohort[i]), rep,
                                                        lambda m, d=shape[0]: wire.read_masked(m[wire.SECAGG], d))
            if msg is not None:
                got[i] = (shape, msg)
        if not got:
            raise self.nobody(r)
        votes = Counter(shape for shape, _ in got.values())  # (d, b): the most common wins, others are rejected
        (d, bits), top = votes.most_common(1)[0]
        if d < 1:
            raise RoundAborted(f"round {r}: the clients' rows have length {d}")
        if list(votes.values()).count(top) > 1:
            raise RoundAborted(f"round {r}: clients disagree on (d, b): {sorted(votes)}")
        for i in [i for i, (shape, _) in got.items() if shape != (d, bits)]:
            self.log(f"round {r}: rejected client {int(cohort[i])}: (d, b) = {got.pop(i)[0]}, most sent {(d, bits)}")
        sa = round_secagg(transport, k, d)
        if sa.round_bits(k) != bits:
            raise RoundAborted(f"round {r}: clients encoded at b = {bits}, the scheme needs {sa.round_bits(k)}")
        sec.update(bits=bits, d=d)
        try:
            rnd.shape(d, bits)
        except ConfigError as e:
            raise RoundAborted(f"round {r}: the clients' (d, b) = {(d, bits)} cannot be summed: {e}") from None
        self.answered = {int(cohort[i]) for i in got}
        request = rnd.masked({i: msg for i, (_, msg) in got.items()})
        self.answered = {int(cohort[i]) for i in range(k) if rnd.masked_bytes[i]}
        if signed:  # consistency check: each survivor signs the survivor list; unmasking needs enough signatures
            req = wire.request_record(request)
            replies = self.send("train.sa_consistency", contents(sorted(request.survivors), lambda i: {"request": req}),
                                need)
            sigs = {i: self.read(r, int(cohort[i]), replies.get(node_at[i]),
                                 lambda m: wire.read_signature(m[wire.SECAGG])) for i in sorted(request.survivors)}
            request = rnd.signatures({i: m for i, m in sigs.items() if m is not None})
            self.answered = {int(cohort[i]) for i in request.signatures}
        # phase 3: unmasking, asked of the survivors (signed: of those that signed the list), with the
        # next round's phase 1 for its cohort
        req = wire.request_record(request)
        asked = sorted(request.signatures) if signed else sorted(request.survivors)
        parts = {node_at[i]: {wire.PLAN: self.plan(ctx.round, ctx.n_selected, cohort, i, sec), "request": req} for i in asked}
        nxt = self.next_round(r)
        if nxt is not None:
            for i, p in nxt[1].items():
                parts.setdefault(nxt[0].node_at[i], {}).update({wire.NEXT_PLAN: p["plan"], wire.NEXT_KEYS: p["keys"]})
        quorum = ((frozenset(node_at[i] for i in asked), need),)  # the next cohort's own answers count apart
        if nxt is not None:
            quorum += ((frozenset(nxt[0].node_at[i] for i in nxt[1]), nxt[0].rnd.cfg.min_survivors),)
        replies = self.send("train.sa_unmask", {node: RecordDict(p) for node, p in parts.items()}, quorum)
        if nxt is not None:
            try:
                self.prepared = self.take_shares(nxt[0], replies, wire.NEXT_SECAGG)
            except RoundAborted as e:
                self.unshared = r + 1  # its keys are used once: round r + 1 releases nothing
                self.log(f"round {r + 1}: its keys were not shared with round {r}'s unmasking ({e})")
        msgs = {i: self.read(r, int(cohort[i]), replies.get(node_at[i]), lambda m: wire.read_unmask(m[wire.SECAGG]))
                for i in asked}
        self.answered = {int(cohort[i]) for i, m in msgs.items() if m is not None}
        total = rnd.unmask({i: m for i, m in msgs.items() if m is not None})
        self.answered = {int(cohort[i]) for i in request.survivors}  # their inputs are in the sum
        ctx.metrics["secagg_bits"] = float(bits)
        ctx.metrics["secagg_survivors"] = float(len(request.survivors))
        ctx.metrics["secagg_protocol_bytes"] = float(rnd.protocol_bytes.mean())
        transport.bits_per_value = bits  # the round's width on the wire (as SecureSum.transmit records it)
        return Received(rows=None, total=decode_sum(sa, total, bits).to(self.state.device),
                        count=len(request.survivors), upstream_bytes=rnd.masked_bytes.copy(), width=d)

    def next_round(self, r: int) -> tuple[Prepared, dict[int, dict]] | None:
        """Round r + 1's phase 1, to ride on round r's unmask message (None after the last round)."""
        if r >= self.cfg.federation.rounds:
            return None
        cohort, dropped = self.select(r + 1)
        if len(cohort) < 2 or any(int(c) not in self.node_of for c in cohort):
            return None
        try:
            return self.prepare(r + 1, cohort, len(cohort) + len(dropped))
        except (RoundAborted, ConfigError) as e:
            self.log(f"round {r + 1}: its keys cannot be shared yet ({e})")
            return None

    def select(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Round r's cohort, drawn once (a deployment's seeds may come from the OS)."""
        if r not in self.selected:
            self.selected = {r: self.state.select(r)}
        return self.selected[r]

    # ---- federated evaluation: the last round's model, evaluated with the next round's training ----
    def evaluation_part(self, node: int) -> dict[str, ConfigRecord]:
        if self.awaiting is None:
            return {}
        return {wire.EVALUATE: wire.evaluate_flag(self.awaiting["round"])}

    def take_evaluations(self, replies: dict[int, Reply]) -> None:
        if self.awaiting is None:
            return
        r = self.awaiting["round"]
        for cid, node in self.node_of.items():
            rep = replies.get(node)
            if rep is not None and wire.EVALUATION in rep.content:
                got = self.read(r, cid, rep, lambda m: wire.read_evaluation(m, wire.EVALUATION))
                if got is not None:
                    self.evaluations[node] = got

    def finish_evaluation(self) -> dict[str, Any] | None:
        """The awaited round's federated metrics: the counts that came with this round's training,
        and an evaluation exchange for the sites that were not asked then. Returns its metrics,
        completed (its metrics line rewritten), or None when none awaited."""
        m, self.awaiting = self.awaiting, None
        if m is None:
            return None
        listed = getattr(self.exchange, "connected", None)
        live = set(listed()) if listed else set(self.node_of.values())
        # the sites that were not asked yet; not those lost this round (an exchange would wait for them)
        missing = sorted((set(self.node_of.values()) & live) - set(self.evaluations) - self.silent - self.erred.keys())
        if missing:
            self.evaluations.update(self.evaluation_exchange(m["round"], missing, self.awaiting_w))
        m.update(self.fed_metrics(self.evaluations))
        self.evaluations = {}
        self.state.update_best(m)
        self.state.rewrite_round(m)
        return m
    # ---- driving --------------------------------------------------------------------
    def _unevaluated(self) -> dict[str, Any] | None:
        """A resumed run's last round, when the server stopped before the sites evaluated its model."""
        if not self.out or self.state.round == 0 or self.evaluation == "server" or not (self.out / METRICS).exists():
            return None
        lines = [ln for ln in (self.out / METRICS).read_text().splitlines() if ln.strip()]
        last = json.loads(lines[-1]) if lines else {}
        r = self.state.round
        return last if last.get("round") == r and self.state.eval_due(r) and "fed_sites" not in last else None

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        self.hello()
        self.state.start_files()
        if self.state.ledger is not None:
            self.log(self.state.accounting_note())
        total, first = self.cfg.federation.rounds, self.state.round + 1
        self.awaiting = self._unevaluated()
        self.awaiting_w = self.state.w.detach().cpu().clone() if self.awaiting is not None else None
        while self.state.round < total:
            try:
                m = self.step_round()
            except BudgetExceededError as e:
                self.state.stopped_reason = str(e)
                self.log(f"stopping: {e}")
                break
            self.history.append(m)
            self.state.write_round(m)
            for done in [*self.done, m] if on_round else ():  # a round's line once its metrics are all in
                if done is not self.awaiting:
                    on_round(done)
        last = self.finish_evaluation()  # the last round's federated evaluation: an exchange of its own
        if last is not None and on_round:
            on_round(last)
        ran = self.state.round - first + 1
        if ran > 0 and self.aborted == ran:
            self.state.stopped_reason = (f"all {ran} rounds aborted (the last: {self.history[-1]['aborted']}); "
                                       "nothing was released")
        return self.state.finish({"reproducible": self.reproducible, "rounds_aborted": self.aborted,
                                  "deployment": "flower"})
