"""dpfl.threads (for_blocks, for_each), and the sign pipeline giving the same bits on any number of threads."""

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl import threads as dpfl_threads
from dpfl.compression import bits
from dpfl.compression.bits import SignCodec, random_sign_rows, unpack_signs
from dpfl.rng import Seeds
from dpfl.schemes import transport
from dpfl.threads import for_blocks, for_each


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
@pytest.mark.parametrize("n,min_block", [(0, 1), (1, 1), (2, 1), (7, 1), (100, 1), (100, 40), (9, 10)])
def test_blocks_cover_the_range_once_in_order(threads, workers, n, min_block):
    threads(workers)
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def fn(a, b):
        with lock:
            seen.append((a, b, threading.get_ident()))

    for_blocks(n, fn, min_block=min_block)
    spans = sorted((a, b) for a, b, _ in seen)
    assert [i for a, b in spans for i in range(a, b)] == list(range(n))
    assert all(b - a >= min(min_block, n) for a, b in spans)
    want = min(workers, max(1, n // min_block)) if n else 0
    assert len(spans) == want
    ids = {t for *_, t in seen}
    assert len(ids) == want if want < 2 else 2 <= len(ids) <= want  # the caller's block and the pool's


def test_an_error_in_any_block_is_raised_after_all_blocks_finish(threads):
    threads(3)
    done = []

    def fn(a, b):
        if a > 0:
            raise ValueError(f"block {a}")
        done.append(a)

    with pytest.raises(ValueError, match="block"):
        for_blocks(30, fn)
    assert done == [0]


def test_nested_blocks_run_serially_without_deadlock(threads):
    threads(2)
    out = np.zeros(40, int)

    def inner(a, b):
        out[a:b] += 1

    def outer(a, b):
        for_blocks(40, lambda c, d: inner(c, d) if a == 0 else None)

    for_blocks(2, outer)
    assert (out == 1).all()


def _child(q):
    torch.set_num_threads(2)
    got = []
    for_blocks(10, lambda a, b: got.append((a, b)))
    q.put(sorted(got))


def test_a_forked_child_gets_its_own_pool(threads):
    threads(2)
    for_blocks(10, lambda a, b: None)  # the parent's pool exists before the fork
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    assert q.get(timeout=60) == [(0, 5), (5, 10)]
    p.join(60)
    assert p.exitcode == 0


@pytest.mark.parametrize("workers,given", [(1, None), (3, None), (1, 4), (2, 1), (5, 2)])
@pytest.mark.parametrize("n", [0, 1, 2, 9, 100])
def test_each_index_is_handed_out_once(threads, workers, given, n):
    threads(workers)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def fn(i):
        with lock:
            seen.append((i, threading.get_ident()))

    for_each(n, fn, threads=given)
    assert sorted(i for i, _ in seen) == list(range(n))
    assert len({t for _, t in seen}) <= max(1, min(workers if given is None else given, n))


def test_for_each_uses_the_threads_it_is_given(threads):
    threads(1)
    barrier = threading.Barrier(3, timeout=30)  # passes only if three calls run at once
    for_each(3, lambda i: barrier.wait(), threads=3)


def test_for_each_stops_handing_out_after_an_error(threads):
    threads(2)
    done = []

    def fn(i):
        if i == 3:
            raise ValueError("item 3")
        done.append(i)

    with pytest.raises(ValueError, match="item 3"):
        for_each(1000, fn)
    assert 3 not in done and len(done) < 999


def test_for_each_inside_a_block_runs_serially(threads):
    threads(2)
    ids = {}

    def outer(a, b):
        for_each(20, lambda i: ids.setdefault(a, set()).add(threading.get_ident()))

    for_blocks(2, outer)
    assert all(len(t) == 1 for t in ids.values()) and len(ids) == 2


def test_callers_growing_the_pool_at_once_do_not_break_each_other(threads, monkeypatch):
    threads(1)
    get_pool = dpfl_threads._get_pool

    class SlowSubmit:  # widens the gap between getting the pool and submitting to it
        def __init__(self, pool):
            self.pool = pool

        def submit(self, fn):
            time.sleep(0.002)
            return self.pool.submit(fn)

    def slow_get_pool(n):
        return SlowSubmit(get_pool(n))

    monkeypatch.setattr(dpfl_threads, "_get_pool", slow_get_pool)
    errors: list[BaseException] = []
    out = np.zeros((3, 40), int)

    def caller(t):  # callers 0 and 1 ask for 2 threads again and again; caller 2 grows the pool to 40
        try:
            for j in range(2, 40):
                k = j if t == 2 else 2
                for_each(k, lambda i, t=t: out[t].__setitem__(i, out[t, i] + 1), threads=k)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=caller, args=(t,)) for t in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors
    assert (out[:2, :2] == 38).all() and (out[:2, 2:] == 0).all()
    assert list(out[2]) == [38, 38] + list(range(37, -1, -1))


def test_for_each_from_the_callers_own_part_runs_on_that_thread(threads):
    threads(2)
    seen = {}
    other_done = threading.Event()

    def outer(a, b):
        if a > 0:
            other_done.set()  # the pool thread is free from here on
            return
        assert other_done.wait(30)
        ids = set()

        def item(i):
            ids.add(threading.get_ident())
            time.sleep(0.002)

        for_each(20, item)
        seen[a] = ids == {threading.get_ident()}

    for_blocks(2, outer)
    assert seen == {0: True}


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 9), n=st.integers(1, 200), zeros=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_sign_pipeline_bits_do_not_depend_on_the_thread_count(k, n, zeros, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(k, n, generator=g)
    x[torch.rand(k, n, generator=g) < zeros] = 0.0
    seeds, before = Seeds(seed), torch.get_num_threads()
    results = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bits, "_min_rows", lambda n: 1)  # thread even tiny arrays
        m.setattr(transport, "_COLUMNS", 16)  # several column blocks to share out
        try:
            for t in (1, 2, 3):
                torch.set_num_threads(t)
                s = random_sign_rows(x, lambda i: seeds.numpy("z", i))
                p = SignCodec().encode(s).arrays["signs"]
                results.append((s, p, unpack_signs(p, n), transport.sum_rows(s)))
        finally:
            torch.set_num_threads(before)
    ref = np.stack([bits.random_sign(x[i].numpy(), seeds.numpy("z", i)) for i in range(k)]) if k else None
    for s, p, u, total in results:
        if k:
            assert np.array_equal(s.numpy(), ref)
        assert torch.equal(s, results[0][0]) and np.array_equal(p, results[0][1])
        assert np.array_equal(u, s.numpy()) and torch.equal(total, s.to(torch.int64).sum(0))
