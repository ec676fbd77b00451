import torch

from dpfl.schemes.aggregators import WeightedMeanAggregator
from dpfl.schemes.subset import RandomSubsetStep
from dpfl.schemes.transport import PlainTransport


def test_fl_rnd_sends_k_values_of_a_fresh_shared_subset(contexts):
    n = 1000
    sctx, rctx = contexts(n)
    step = RandomSubsetStep(0.05)
    step.setup(sctx)
    assert step.train_mask(rctx(1)) is None  # FL-RND trains every coordinate
    u = torch.randn(4, n)
    ctx1 = rctx(1, 4)
    y = step.client(u, ctx1)
    rec = PlainTransport().transmit(y, ctx1)
    assert rec.upstream_bytes.tolist() == [200] * 4  # 4·K bytes, K = 50
    delta = step.server(WeightedMeanAggregator()(rec, ctx1), ctx1)
    idx = step.subset(ctx1)
    torch.testing.assert_close(delta[idx], u.mean(0)[idx])
    rest = torch.ones(n, dtype=torch.bool)
    rest[idx] = False
    assert torch.all(delta[rest] == 0)
    # a second participant derives the same subset; the next round draws a new one
    other = RandomSubsetStep(0.05)
    other.setup(contexts(n)[0])
    assert torch.equal(other.subset(rctx(1)), idx)
    assert not torch.equal(step.subset(rctx(2)), idx)


def test_fl_basic_trains_only_the_round_subset(contexts):
    n = 500
    sctx, rctx = contexts(n)
    step = RandomSubsetStep(0.1, mask_training=True)
    step.setup(sctx)
    m1, m2 = step.train_mask(rctx(1)), step.train_mask(rctx(2))
    assert m1.dtype == torch.bool and int(m1.sum()) == int(m2.sum()) == 50
    assert not torch.equal(m1, m2)
    assert torch.equal(torch.nonzero(m1).squeeze(1), step.subset(rctx(1)))
