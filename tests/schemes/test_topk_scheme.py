import numpy as np
import torch
from torch import nn

from dpfl.schemes.aggregators import MeanAggregator
from dpfl.schemes.topk import TopKStep
from dpfl.schemes.transport import PlainTransport
from dpfl.training.trainer import LocalTraining, Trainer


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def bruteforce_scores(model, w0, x, y, steps, lr):
    """Accumulated |grad| with plain autograd on a copy of the model."""
    m = tiny_model()
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(w0.clone(), m.parameters())
    acc = torch.zeros_like(w0, dtype=torch.float64)
    for _ in range(steps):
        m.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        acc += g.abs().double()
        with torch.no_grad():
            for p in m.parameters():
                p -= lr * p.grad
    return acc


def test_topk_set_from_public_data_matches_bruteforce_for_both_gradient_paths(contexts):
    model = tiny_model()
    w0 = flat(model)
    n = w0.numel()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 6, generator=gen), torch.randint(0, 3, (10,), generator=gen)
    scores = bruteforce_scores(model, w0, x, y, 5, 0.215)
    expected = torch.sort(torch.sort(scores, descending=True, stable=True).indices[:16]).values  # ⌊0.2·83⌋
    trainer = Trainer(model, "multiclass", LocalTraining())
    for kw in ({"model": model}, {"model": model, "trainer": trainer}):
        sctx, _ = contexts(n, w0=w0, public_data=(x, y), **kw)
        step = TopKStep(ratio=0.2, init_steps=5, init_lr=0.215)
        step.setup(sctx)
        assert torch.equal(step.indices, expected)


def test_topk_reset_rule_bytes_and_resume(contexts):
    model = tiny_model()
    w0 = flat(model)
    n = w0.numel()
    gen = torch.Generator().manual_seed(2)
    data_x, data_y = torch.randn(40, 6, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    sctx, rctx = contexts(n, w0=w0, public_data=(data_x[:10], data_y[:10]), model=model)
    step = TopKStep(ratio=0.2, init_steps=5)
    step.setup(sctx)
    k = int(0.2 * n)
    mask = step.train_mask(rctx(1))
    assert int(mask.sum()) == k and torch.equal(torch.nonzero(mask).squeeze(1), step.indices)
    trainer = Trainer(model, "multiclass", LocalTraining(steps=5, batch_size=10, lr=0.215))
    w = w0.clone()
    batches = torch.arange(40).view(4, 1, 10).expand(4, 5, 10)  # 4 clients, 5 steps each
    for r in (1, 2):
        ctx = rctx(r, 4, w=w)
        assert step.downstream_bytes(ctx) == 4 * k  # only the K current weights travel down
        u = trainer.train(w, data_x, data_y, batches, step.train_mask(ctx))
        assert torch.all(u[:, ~mask] == 0)  # Top-K SGD: everything else is reset every step
        c = step.client(u, ctx)
        rec = PlainTransport().transmit(c, ctx)
        assert rec.upstream_bytes.tolist() == [4 * k] * 4
        w = w + step.server(MeanAggregator()(rec, ctx), ctx)
    assert torch.equal(w[~mask], w0[~mask])  # the global model stays at w_0 outside T
    assert not torch.equal(w[mask], w0[mask])
    # resume: the set comes back from the state dict without recomputing it
    fresh = TopKStep(ratio=0.2)
    fresh.load_state_dict(step.state_dict())
    fresh.setup(contexts(n, w0=w0)[0])  # no public data needed when restored
    assert torch.equal(fresh.indices, step.indices) and torch.equal(fresh.train_mask(rctx(3)), mask)
    after = TopKStep(ratio=0.2)
    after.setup(sctx)
    other = step.state_dict()["indices"].flip(0)[:k].sort().values
    after.load_state_dict({"indices": torch.from_numpy(np.asarray(other))})
    assert torch.equal(after.indices, other)
