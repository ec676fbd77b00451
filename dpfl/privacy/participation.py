"""Participation schemas: which rounds one client may take part in, and cohort selections that keep to them.

The matrix mechanisms (`dpfl.privacy.factorization`) account a bound on participation, not sampling:

* ``any``: no bound: a client may take part in every round (k = T);
* ``cyclic``: the clients are split once into b groups (a seeded permutation); round r draws its cohort
  from group (r − 1) mod b only, so a client's rounds are one residue class mod b (k = ⌈T/b⌉);
* ``min-separation``: round r draws its cohort from the clients that took part in none of the b − 1
  rounds before it, so two rounds of one client are ≥ b apart (k ≤ ⌈T/b⌉).

Within what the schema allows the cohort is |K| distinct clients drawn uniformly (the run's seeds); the
accounting does not rely on that draw (no amplification), only on the schema.
"""

from __future__ import annotations

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.rng import Seeds

SCHEMAS = ("any", "cyclic", "min-separation")


def check_schema(schema: str, separation: int) -> tuple[str, int]:
    if schema not in SCHEMAS:
        raise PrivacyError(f"participation must be one of {SCHEMAS}, got {schema!r}")
    if isinstance(separation, bool) or not isinstance(separation, (int, np.integer)) or separation < 1:
        raise PrivacyError(f"the separation b must be an integer >= 1, got {separation!r}")
    if schema == "any" and separation != 1:
        raise PrivacyError(f"participation 'any' has separation 1, got {separation}")
    return schema, int(separation)


def max_participations(schema: str, separation: int, rounds: int) -> int:
    """k: the most rounds one client can take part in."""
    schema, b = check_schema(schema, separation)
    return -(-rounds // b)


def check_selection(schema: str, separation: int, n_clients: int, cohort: int) -> None:
    """PrivacyError if no selection of `cohort` of `n_clients` per round can keep to the schema."""
    schema, b = check_schema(schema, separation)
    if schema == "cyclic" and cohort > n_clients // b:
        raise PrivacyError(f"cyclic participation with {b} groups of {n_clients} clients has groups of "
                           f"{n_clients // b}, fewer than the cohort of {cohort}")
    if schema == "min-separation" and cohort * b > n_clients:
        raise PrivacyError(f"rounds ≥ {b} apart need at least {b} × {cohort} = {b * cohort} clients for a "
                           f"cohort of {cohort}, there are {n_clients}")


def groups(n_clients: int, count: int, seeds: Seeds) -> list[np.ndarray]:
    """The cyclic schema's groups: a seeded permutation dealt into `count` groups (sizes differ by ≤ 1)."""
    perm = seeds.numpy("participation", "groups").permutation(n_clients)
    return [np.sort(perm[g::count]) for g in range(count)]


_SCHEDULES: dict[tuple, list[np.ndarray]] = {}


def _min_separation(n_clients: int, cohort: int, b: int, seeds: Seeds, r: int) -> np.ndarray:
    """Round r's cohort under min-separation: rounds 1..r replayed from the seeds (cached)."""
    key = (seeds.root, n_clients, cohort, b)
    done = _SCHEDULES.setdefault(key, [])
    if len(_SCHEDULES) > 16:
        _SCHEDULES.clear()
        _SCHEDULES[key] = done
    last = np.full(n_clients, -b, dtype=np.int64)
    for j, c in enumerate(done, 1):
        last[c] = j
    for j in range(len(done) + 1, r + 1):
        free = np.flatnonzero(last <= j - b)
        c = np.sort(seeds.numpy("round", j, "select").choice(free, size=cohort, replace=False))
        last[c] = j
        done.append(c)
    return done[r - 1]


def select(schema: str, separation: int, n_clients: int, cohort: int, r: int, seeds: Seeds) -> np.ndarray:
    """Round r's cohort (sorted client ids) under the schema, drawn from the run's seeds."""
    schema, b = check_schema(schema, separation)
    check_selection(schema, b, n_clients, cohort)
    if schema == "cyclic":
        members = groups(n_clients, b, seeds)[(r - 1) % b]
        return np.sort(seeds.numpy("round", r, "select").choice(members, size=cohort, replace=False))
    if schema == "min-separation":
        return _min_separation(n_clients, cohort, b, seeds, r)
    return np.sort(seeds.numpy("round", r, "select").choice(n_clients, size=cohort, replace=False))
