"""Synthetic in-hospital mortality data shaped like the thesis's Premier Healthcare extract.

The real data (licensed, PHI) cannot be shipped. This generator keeps what the experiments
depend on (thesis §8.3.2, Tables 8.6-8.7):

- 7,280 input features: age and MRCI MinMax-scaled to [0, 1], gender one-hot (3), admission
  type one-hot (4) and 7,271 sparse binary first-day drug / ICD9 indicators (column layout
  below); the medical MLP's 1,496,601 parameters imply exactly 7,280 inputs;
- about 3.16 % positives (in-hospital death);
- training patients split at random over virtual hospitals of 203 patients plus one of 356,
  each with at least one positive (5011 hospitals, 1,017,386 patients at scale 1), and a test
  set of 1/4 the training size (254,347 at scale 1).

How patients are drawn: a hidden severity s ~ N(0, 1) and 1-3 hidden comorbidity profiles
("topics") per patient. The number of first-day codes grows with s; each code comes either
from a heavy-tailed (Zipf) base frequency or from one of the patient's profiles, so features
are sparse, heavy-tailed and correlated. MRCI grows with the number of codes, age with s.
The death probability is logistic in age, MRCI, admission type, a sparse set of code effects,
the profiles and s; the intercept is calibrated so the expected positive rate is 3.16 %.
Because s and the profiles are only seen through noisy proxies, the task is learnable but
not trivial. Accuracy figures on this data are not comparable with the thesis's.

Age and MRCI are rounded to multiples of 1/1024 so that the compact float16 storage used at
large scale is exact (cast a gathered batch to float32; values are identical either way).
Class imbalance is left in place: apply `downsample_majority` per client when training.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.special import expit

from dpfl.data.dataset import Dataset
from dpfl.errors import ConfigError
from dpfl.rng import Seeds

N_FEATURES = 7280
AGE, MRCI = 0, 8
GENDER = slice(1, 4)  # Male, Female, Unknown
ADMISSION = slice(4, 8)  # Emergency, Urgent, Trauma Center, Unknown
CODES = slice(9, N_FEATURES)  # 7,271 binary first-day indicators
N_CODES = N_FEATURES - 9
N_HOSPITALS, HOSPITAL_SIZE, PUBLIC_SIZE = 5011, 203, 356
POSITIVE_RATE = 32_106 / 1_017_386  # Table 8.7, training set
TEST_RATIO = 254_347 / 1_017_386
GRID = 1024  # continuous features are multiples of 1/GRID
CHUNK = 4096
CALIBRATION_SIZE = 100_000  # patients drawn to calibrate the intercept
FLOAT32_LIMIT = 2 * 2**30  # "auto" dtype: float16 above this many bytes of float32 features

# Generator constants (documented in the module docstring).
N_TOPICS, TOPIC_SIZE, TOPIC_SHARE = 50, 120, 0.55
MEAN_CODES = 18.0
GENDER_P = [0.46, 0.53, 0.01]
ADMISSION_P = [0.72, 0.17, 0.04, 0.07]
ADMISSION_EFFECT = np.array([0.3, 0.0, 0.6, 0.1])


class _World:
    """Population structure shared by every patient (drawn once per seed)."""

    def __init__(self, rng: np.random.Generator):
        w = (np.arange(N_CODES) + 5.0) ** -1.05
        self.base_cdf = np.cumsum(rng.permutation(w / w.sum()))
        self.base_cdf[-1] = 1.0
        self.topic_p = rng.dirichlet(np.full(N_TOPICS, 2.0))
        self.topic_members = np.stack(
            [rng.choice(N_CODES, TOPIC_SIZE, replace=False) for _ in range(N_TOPICS)]
        )
        tw = rng.lognormal(0.0, 1.0, size=(N_TOPICS, TOPIC_SIZE))
        cdf = np.cumsum(tw / tw.sum(1, keepdims=True), axis=1)
        cdf[:, -1] = 1.0
        self.topic_cdf = (cdf + np.arange(N_TOPICS)[:, None]).ravel()  # topic t occupies (t, t+1]
        self.topic_effect = rng.normal(0.0, 0.8, size=N_TOPICS)
        theta = np.zeros(N_CODES)
        active = rng.choice(N_CODES, size=N_CODES * 3 // 100, replace=False)
        theta[active] = rng.normal(0.0, 0.7, size=len(active))
        self.code_effect = theta

    def patients(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """n patients, sparse: continuous/one-hot columns, (row, code) pairs, and the logit z
        without intercept."""
        s = rng.standard_normal(n)
        n_topics = 1 + np.minimum(rng.poisson(0.8, n), 2)
        topics = rng.choice(N_TOPICS, size=(n, 3), p=self.topic_p)
        age = np.clip(np.round(58.0 + 5.0 * s + 17.0 * rng.standard_normal(n)), 15, 89)
        gender = rng.choice(3, size=n, p=GENDER_P)
        admission = rng.choice(4, size=n, p=ADMISSION_P)
        k = np.maximum(1, rng.poisson(MEAN_CODES * np.exp(0.3 * s + 0.15 * (n_topics - 1))))
        pid = np.repeat(np.arange(n), k)
        m = len(pid)
        base = np.minimum(np.searchsorted(self.base_cdf, rng.random(m), side="right"), N_CODES - 1)
        t = topics[pid, (rng.random(m) * n_topics[pid]).astype(np.int64)]
        j = np.searchsorted(self.topic_cdf, t + rng.random(m), side="right") - t * TOPIC_SIZE
        code = np.where(
            rng.random(m) < TOPIC_SHARE, self.topic_members[t, np.minimum(j, TOPIC_SIZE - 1)], base
        )
        pair = np.sort(pid * N_CODES + code)
        pair = pair[np.concatenate([[True], np.diff(pair) != 0])]  # a code given twice is one indicator
        row, code = pair // N_CODES, pair % N_CODES
        mrci = np.clip(2.0 + 0.9 * k + 3.0 * rng.standard_normal(n), 2.0, 60.0)
        age01 = np.round((age - 15.0) / 74.0 * GRID) / GRID
        mrci01 = np.round((mrci - 2.0) / 58.0 * GRID) / GRID
        used = np.arange(3)[None, :] < n_topics[:, None]
        z = (
            1.8 * age01
            + 1.5 * mrci01
            + np.bincount(row, weights=self.code_effect[code], minlength=n)
            + (self.topic_effect[topics] * used).sum(1)
            + 0.9 * s
            + ADMISSION_EFFECT[admission]
            + 0.1 * (gender == 0)
        )
        return {
            "age": age01,
            "mrci": mrci01,
            "gender": gender,
            "admission": admission,
            "row": row,
            "code": code,
            "z": z,
        }


def medical_sizes(
    scale: float = 1.0,
    n_hospitals: int | None = None,
    hospital_size: int = HOSPITAL_SIZE,
    public_size: int = PUBLIC_SIZE,
    n_test: int | None = None,
) -> tuple[np.ndarray, int]:
    """Hospital sizes (the public one last) and the test-set size for these options."""
    if n_hospitals is None:
        if not isinstance(scale, (int, float)) or not 0.0 < scale <= 1.0:
            raise ConfigError(f"medical-synthetic scale must be in (0, 1], got {scale!r}")
        n_hospitals = max(2, round(N_HOSPITALS * scale))
    if not isinstance(n_hospitals, (int, np.integer)) or n_hospitals < 2:
        raise ConfigError(f"medical-synthetic n_hospitals must be an integer >= 2, got {n_hospitals!r}")
    for what, v in (("hospital_size", hospital_size), ("public_size", public_size)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"medical-synthetic {what} must be a positive integer, got {v!r}")
    sizes = np.array([hospital_size] * (n_hospitals - 1) + [public_size], dtype=np.int64)
    n_test = round(int(sizes.sum()) * TEST_RATIO) if n_test is None else n_test
    if not isinstance(n_test, (int, np.integer)) or n_test < 1:
        raise ConfigError(f"medical-synthetic n_test must be a positive integer, got {n_test!r}")
    return sizes, int(n_test)


@functools.lru_cache(maxsize=4)
def _world(seed: int, positive_rate: float) -> tuple[_World, float]:
    """The population structure for `seed`, and the intercept giving the expected positive rate."""
    seeds = Seeds(seed)
    world = _World(seeds.numpy("data", "medical", "world"))
    z = world.patients(CALIBRATION_SIZE, seeds.numpy("data", "medical", "calibration"))["z"]
    return world, brentq(lambda b: expit(z + b).mean() - positive_rate, -40.0, 40.0, xtol=1e-12)


def _write(x: torch.Tensor, start: int, p: dict[str, np.ndarray]) -> None:
    """Write patients `p` into rows start.. of the zero-initialised feature matrix x."""
    n = len(p["z"])
    rows = torch.arange(start, start + n)
    x[rows, AGE] = torch.from_numpy(p["age"]).to(x.dtype)
    x[rows, MRCI] = torch.from_numpy(p["mrci"]).to(x.dtype)
    x[rows, GENDER.start + torch.from_numpy(p["gender"])] = 1
    x[rows, ADMISSION.start + torch.from_numpy(p["admission"])] = 1
    x[start + torch.from_numpy(p["row"]), CODES.start + torch.from_numpy(p["code"])] = 1


def load_medical_synthetic(
    root=None,
    seed: int = 0,
    scale: float = 1.0,
    n_hospitals: int | None = None,
    hospital_size: int = HOSPITAL_SIZE,
    public_size: int = PUBLIC_SIZE,
    positive_rate: float = POSITIVE_RATE,
    n_train: int | None = None,
    n_test: int | None = None,
    dtype: str = "auto",
) -> Dataset:
    """The synthetic medical dataset; see the module docstring.

    `scale` shrinks the number of hospitals (round(5011·scale), at least 2); `n_hospitals`
    sets it directly. `client_indices` lists the hospitals, the last one being the
    `public_size` hospital, which is also returned as `public` (FL-TOP uses it server-side
    and the other N-1 hospitals as clients). `dtype`: "float32", "float16" (exact, half the
    memory) or "auto" (float16 when float32 training features would exceed 2 GiB).
    `n_train` is refused (the hospitals fix it; use scale or n_hospitals); `n_test` sets the
    number of test patients (default 1/4 of the training patients).
    """
    if n_train is not None:
        raise ConfigError(
            "medical-synthetic has a natural hospital partition; reduce it with scale= or "
            f"n_hospitals=, not n_train={n_train!r}"
        )
    sizes, n_test = medical_sizes(scale, n_hospitals, hospital_size, public_size, n_test)
    if not 0.0 < positive_rate < 0.5:
        raise ConfigError(f"positive_rate must be in (0, 0.5), got {positive_rate!r}")
    n_hospitals, n_train = len(sizes), int(sizes.sum())
    if dtype == "auto":
        dtype = "float16" if n_train * N_FEATURES * 4 > FLOAT32_LIMIT else "float32"
    if dtype not in ("float32", "float16"):
        raise ConfigError(f"medical-synthetic dtype must be 'auto', 'float32' or 'float16', got {dtype!r}")
    tdtype = getattr(torch, dtype)

    seeds = Seeds(seed)
    world, intercept = _world(seed, positive_rate)

    total = n_train + int(n_test)
    x = torch.zeros((total, N_FEATURES), dtype=tdtype)
    y = np.empty(total, dtype=np.int64)
    for c, start in enumerate(range(0, total, CHUNK)):
        rng = seeds.numpy("data", "medical", "chunk", c)
        p = world.patients(min(CHUNK, total - start), rng)
        y[start : start + len(p["z"])] = rng.random(len(p["z"])) < expit(p["z"] + intercept)
        _write(x, start, p)
    y_train, y_test = torch.from_numpy(y[:n_train].copy()), torch.from_numpy(y[n_train:].copy())
    hospitals = assign_hospitals(y[:n_train], sizes, seeds.numpy("data", "medical", "hospitals"))
    x_train, x_test = x[:n_train], x[n_train:]
    pub = torch.from_numpy(hospitals[-1])
    return Dataset(
        "medical-synthetic",
        x_train,
        y_train,
        x_test,
        y_test,
        num_classes=2,
        task="binary",
        source=(
            f"synthetic medical generator (seed {seed}): {n_hospitals} hospitals "
            f"({n_hospitals - 1}x{hospital_size} + {public_size} public), {n_train} train / "
            f"{n_test} test patients, {N_FEATURES} features, {dtype}"
        ),
        client_indices=hospitals,
        public=(x_train[pub], y_train[pub]),
    )


def assign_hospitals(y: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Random split of patients into hospitals of the given sizes, each with >= 1 positive."""
    pos = np.flatnonzero(y == 1)
    if len(pos) < len(sizes):
        raise ConfigError(
            f"only {len(pos)} positive patients for {len(sizes)} hospitals (each needs one); "
            "raise scale, hospital_size or positive_rate"
        )
    first = rng.choice(pos, size=len(sizes), replace=False)
    rest = np.setdiff1d(np.arange(len(y)), first)
    rest = rest[rng.permutation(len(rest))]
    bounds = np.concatenate([[0], np.cumsum(sizes - 1)])
    return [
        rng.permutation(np.concatenate([[first[h]], rest[bounds[h] : bounds[h + 1]]]))
        for h in range(len(sizes))
    ]
