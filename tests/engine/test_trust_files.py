"""Trust boundaries, files: checkpoints (plain data, no code, corrupt files, atomic writes), the
metrics file a kill leaves, the data a run used, and run.device."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError, DataError
from dpfl.run.state import Run

QUIET = {"log": lambda s: None}
LOCAL_DP = {"scheme.name": "fl-std-dp", "scheme.options": {"sigma": 1.0, "clip": 1.0, "noise": "local"},
            "federation.rounds": 2}


class _RunsCode:
    """Unpickling this calls os.makedirs(marker): what a crafted checkpoint could do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def _run(tmp_path, tiny_config, name="run", **over):
    sim = Run(tiny_config(**over), tmp_path / name, **QUIET)
    simulate(sim)
    return sim


def test_checkpoint_that_runs_code_is_refused(tmp_path, tiny_config):
    from dpfl.run.final_model import load_final_model

    _run(tmp_path, tiny_config, **{"federation.rounds": 1})
    marker = tmp_path / "code-ran"
    torch.save({"round": 1, "w": _RunsCode(marker)}, tmp_path / "run" / "checkpoint.pt")
    with pytest.raises(DataError, match=r"run/checkpoint.pt: refusing to load.*could run code.*os.makedirs") as e:
        Run.resume(tmp_path / "run", **QUIET)
    assert "safe_globals" not in str(e.value) and "allowlist" not in str(e.value)  # no advice to let it run
    with pytest.raises(DataError, match=r"checkpoint.pt: refusing to load"):
        load_final_model(tmp_path / "run")  # what `dpfl attacks membership RUN_DIR` reads
    assert not marker.exists()


def test_checkpoint_holds_plain_data_and_resumes_numpy_state(tmp_path, tiny_config):
    from dpfl.run import checkpoint as ckpt

    # local noise keeps numpy participation counts: stored as plain tensors, rebuilt as numpy on load
    sim = _run(tmp_path, tiny_config, **LOCAL_DP)
    raw = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)  # no allow-list needed
    assert raw["format"] == ckpt.FORMAT
    counts = sim.scheme.steps[-1].participation.counts
    back = Run.resume(tmp_path / "run", **QUIET).scheme.steps[-1].participation.counts
    assert isinstance(back, np.ndarray) and back.dtype == counts.dtype and np.array_equal(back, counts)


def test_plain_round_trip_and_non_plain_refused(tmp_path):
    from dpfl.run import checkpoint as ckpt

    state = {"a": np.arange(5, dtype=np.uint16), "b": np.float32(0.1), "c": [1, "x", None, (2.5, torch.ones(2))]}
    ckpt.save(state, tmp_path / "c.pt")
    back = ckpt.load(tmp_path / "c.pt")
    assert back["a"].dtype == np.uint16 and back["a"].tolist() == [0, 1, 2, 3, 4]
    assert type(back["b"]) is np.float32 and back["b"] == np.float32(0.1)
    assert back["c"][:3] == [1, "x", None] and torch.equal(back["c"][3][1], torch.ones(2))
    with pytest.raises(TypeError, match=r"state.x: a set cannot go into a checkpoint"):
        ckpt.save({"x": {1}}, tmp_path / "d.pt")
    assert not (tmp_path / "d.pt").exists()


def test_old_format_checkpoint_is_migrated_without_running_code(tmp_path, tiny_config):
    """Checkpoints written before the plain format pickled numpy arrays; they still load (numpy's
    array types allow-listed, weights_only kept) and are rewritten in the new format."""
    from dpfl.run import checkpoint as ckpt

    sim = _run(tmp_path, tiny_config, **LOCAL_DP)
    old = sim.state_dict()
    old.pop("sigmas", None), old.pop("data", None)
    assert isinstance(old["scheme"]["steps"][-1]["participation"]["counts"], np.ndarray)
    torch.save(old, tmp_path / "run" / "checkpoint.pt")  # the old writer: torch.save of the raw state
    notes = []
    resumed = Run.resume(tmp_path / "run", log=notes.append, rounds=3)
    assert np.array_equal(resumed.scheme.steps[-1].participation.counts, sim.scheme.steps[-1].participation.counts)
    assert any("predates data records" in n for n in notes)
    simulate(resumed)
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["format"] == ckpt.FORMAT


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "not-a-dict", "wrong-shape"])
def test_corrupt_checkpoint_names_the_file(tmp_path, tiny_config, damage):
    _run(tmp_path, tiny_config, **{"federation.rounds": 1})
    path = tmp_path / "run" / "checkpoint.pt"
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(400))
    elif damage == "not-a-dict":
        torch.save([1, 2], path)
    else:
        from dpfl.run import checkpoint as ckpt

        st = ckpt.load(path)
        st["w"] = st["w"][:-1]
        ckpt.save(st, path)
    with pytest.raises(DataError, match=r"run/checkpoint.pt: "):
        Run.resume(tmp_path / "run", **QUIET)


def test_failed_checkpoint_write_keeps_the_previous_one(tmp_path, tiny_config, monkeypatch):
    sim = _run(tmp_path, tiny_config, **{"federation.rounds": 2})
    path = tmp_path / "run" / "checkpoint.pt"
    before = path.read_bytes()

    def dies_half_way(obj, f):
        with open(f, "wb") if isinstance(f, (str, os.PathLike)) else f as fh:
            fh.write(b"PK\x03\x04 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(OSError, match="disk full"):
        sim.save_checkpoint()
    assert path.read_bytes() == before
    monkeypatch.undo()
    assert Run.resume(tmp_path / "run", **QUIET).round == 2


def test_partial_last_metrics_line_is_dropped_on_resume(tmp_path, tiny_config):
    full = _run(tmp_path, tiny_config, name="full", **{"federation.rounds": 5})
    _run(tmp_path, tiny_config, **{"federation.rounds": 4})
    metrics = tmp_path / "run" / "metrics.jsonl"
    good = metrics.read_text()
    with open(metrics, "a") as f:  # what a kill during the append of round 5 leaves
        f.write('{"round": 5, "selected": 5, "answ')
    resumed = Run.resume(tmp_path / "run", rounds=5, **QUIET)
    assert metrics.read_text() == good  # rewritten without the partial line
    simulate(resumed)
    strip = [{k: v for k, v in json.loads(ln).items() if not k.endswith("seconds")}
             for ln in metrics.read_text().splitlines()]
    want = [{k: v for k, v in json.loads(ln).items() if not k.endswith("seconds")}
            for ln in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert strip == want and torch.equal(resumed.w, full.w)


def test_bad_metrics_line_before_the_last_is_an_error(tmp_path, tiny_config):
    _run(tmp_path, tiny_config, **{"federation.rounds": 2})
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0][:20] + "\n" + lines[1] + "\n")
    with pytest.raises(DataError, match=r"metrics.jsonl: line 1 is not JSON"):
        Run.resume(tmp_path / "run", **QUIET)
    assert metrics.read_text().splitlines()[1] == lines[1]  # nothing rewritten


def _default_data(root):
    return {"data.dataset": "default", "data.root": str(root), "data.options": {"n_train": 300, "n_test": 100},
            "model.options": {"in_features": 784, "hidden": 16, "num_classes": 10}, "federation.rounds": 2}


def test_run_records_its_data_and_resume_on_other_data_refuses(tmp_path, tiny_config):
    from dpfl.run import checkpoint as ckpt

    root = tmp_path / "data"
    root.mkdir()
    sim = _run(tmp_path, tiny_config, **_default_data(root))  # no Fashion-MNIST in root: digits at 28x28
    rec = sim.data_record()
    assert rec["dataset"] == "digits" and len(rec["sha256"]) == 64
    out = tmp_path / "run"
    assert json.loads((out / "summary.json").read_text())["data"] == rec
    assert ckpt.load(out / "checkpoint.pt")["data"] == rec
    assert (out / "config.toml").read_text().startswith(f"# data used: digits ({rec['source']}), sha256 {rec['sha256']}")
    Run.resume(out, rounds=3, **QUIET)  # same data: fine
    fm = "/usr/share/datasets/fashion-mnist"
    if not os.path.isfile(os.path.join(fm, "train-images-idx3-ubyte.gz")):
        pytest.skip("needs Fashion-MNIST: apt-get install dataset-fashion-mnist")
    for f in os.listdir(fm):  # Fashion-MNIST appears where "default" looks: it would now resolve to it
        shutil.copy(os.path.join(fm, f), root / f)
    metrics = (out / "metrics.jsonl").read_text()
    with pytest.raises(DataError, match=r"the data differ from the run's: it used digits .* now fashion-mnist"):
        Run.resume(out, rounds=3, **QUIET)
    assert (out / "metrics.jsonl").read_text() == metrics


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_device_on_a_cpu_only_torch(tmp_path, tiny_config):
    with pytest.raises(ConfigError, match=r"run.device = 'cuda' but this torch .* has no usable CUDA"):
        Run(tiny_config(**{"run.device": "cuda"}), None, **QUIET)


def test_eval_metric_must_exist_for_the_task(tiny_config):
    with pytest.raises(ConfigError, match=r"eval.metric: Input should be 'accuracy'"):
        tiny_config(**{"eval.metric": "loss"})
    with pytest.raises(ConfigError, match=r"eval.metric = 'auroc' exists for binary tasks only"):
        Run(tiny_config(**{"eval.metric": "auroc"}), None, **QUIET)


@pytest.mark.parametrize("key,value,shown", [("train.lr", float("inf"), "train.lr: Input should be a finite number"),
                                             ("privacy.target_epsilon", float("inf"), "privacy.target_epsilon"),
                                             ("scheme.options", {"sigma": float("inf")}, "sigma = inf"),
                                             ("data.partition_options", {"a": [1.0, float("-inf")]}, "a.1 = -inf")])
def test_non_finite_config_values_are_rejected(tiny_config, key, value, shown):
    with pytest.raises(ConfigError, match="invalid configuration") as e:
        tiny_config(**{key: value})
    assert shown in str(e.value) and "\n" not in str(e.value)


def test_zero_filled_tail_of_metrics_is_dropped(tmp_path, tiny_config):
    """A crash can leave NUL bytes (or other junk) after the last complete line."""
    _run(tmp_path, tiny_config, **{"federation.rounds": 2})
    metrics = tmp_path / "run" / "metrics.jsonl"
    good = metrics.read_bytes()
    metrics.write_bytes(good + b"\x00" * 37 + b"\xff")
    Run.resume(tmp_path / "run", **QUIET)
    assert metrics.read_bytes() == good
