import math

import numpy as np
import pytest
import scipy.fft
import torch

from dpfl.compression.dct import ChunkedDCT, dct, dct_torch, idct, idct_torch
from dpfl.errors import ConfigError, DataError


def dct_matrix(n):
    """Closed form of the orthonormal DCT-II: D[k, j] = s_k cos(π k (2j + 1) / 2n)."""
    k, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    d = np.sqrt(2.0 / n) * np.cos(np.pi * k * (2 * j + 1) / (2 * n))
    d[0] /= math.sqrt(2.0)
    return d


@pytest.mark.parametrize("n", [1, 2, 3, 8, 15, 64, 101])
def test_dct_matches_closed_form_and_is_orthonormal(n):
    x = torch.randn(3, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    d = dct_matrix(n)
    np.testing.assert_allclose(d @ d.T, np.eye(n), atol=1e-12)  # orthonormal rows
    expected = x.numpy() @ d.T
    for f in (dct, dct_torch):
        np.testing.assert_allclose(f(x).numpy(), expected, atol=1e-12)
    for f in (idct, idct_torch):
        np.testing.assert_allclose(f(torch.from_numpy(expected)).numpy(), x.numpy(), atol=1e-12)


def test_torch_path_matches_scipy_on_fast_and_prime_lengths():
    for n in (8317, 8400):
        x = torch.randn(2, n, dtype=torch.float64)
        ref = scipy.fft.dct(x.numpy(), norm="ortho", axis=-1)
        np.testing.assert_allclose(dct_torch(x).numpy(), ref, atol=1e-10)
        np.testing.assert_allclose(idct_torch(torch.from_numpy(ref)).numpy(), x.numpy(), atol=1e-10)


def explicit_theta(op):
    """Θ as a dense [m, n] matrix, built column by column from the operator."""
    return op.compress(torch.eye(op.n, dtype=torch.float64)).T


def test_chunked_operator_sizes_split_and_padding():
    n, p = 1003, 10
    op = ChunkedDCT(n, 101, p, np.random.default_rng(0).permutation(n))
    assert op.length == scipy.fft.next_fast_len(101) and op.length >= 101
    assert op.real_counts.tolist() == [101, 101, 101] + [100] * 7
    assert op.counts.tolist() == [11] + [10] * 9 and op.counts.sum() == 101
    measured, real = op.masks()
    assert measured.sum() == 101 and real.sum() == n
    assert torch.equal(measured[:, :10], torch.ones(p, 10, dtype=torch.bool))


def test_theta_has_orthonormal_rows_and_adjoint_is_transpose():
    n = 308  # 4 chunks of 77 (a fast length): no padding, so ΘΘᵀ = I exactly
    op = ChunkedDCT(n, 40, 4, np.random.default_rng(3).permutation(n))
    assert op.length * 4 == n
    theta = explicit_theta(op)
    assert theta.shape == (40, n)
    np.testing.assert_allclose((theta @ theta.T).numpy(), np.eye(40), atol=1e-12)
    y = torch.randn(5, 40, dtype=torch.float64)
    np.testing.assert_allclose(op.adjoint(y).numpy(), (y @ theta).numpy(), atol=1e-12)
    np.testing.assert_allclose(op.compress(op.adjoint(y)).numpy(), y.numpy(), atol=1e-12)


def test_padded_operator_adjoint_and_norm():
    n = 307  # one padding slot: Θ loses a column, ‖Θ‖ ≤ 1 and Θᵀ is still the adjoint
    op = ChunkedDCT(n, 40, 4, np.random.default_rng(3).permutation(n))
    assert op.length * 4 == n + 1
    theta = explicit_theta(op)
    assert np.linalg.eigvalsh((theta @ theta.T).numpy()).max() <= 1 + 1e-12
    y = torch.randn(5, 40, dtype=torch.float64)
    np.testing.assert_allclose(op.adjoint(y).numpy(), (y @ theta).numpy(), atol=1e-12)


def test_chunk_layout_follows_the_shared_permutation():
    n, p = 120, 4
    perm = np.random.default_rng(5).permutation(n)
    op = ChunkedDCT(n, 20, p, perm)
    x = torch.arange(n, dtype=torch.float64)
    chunks = op.to_chunks(x)
    # chunk j holds the permuted coordinates perm[30 j : 30 (j + 1)], then zero padding
    for j in range(p):
        np.testing.assert_array_equal(chunks[j, :30].numpy(), perm[30 * j : 30 * (j + 1)])
        assert torch.all(chunks[j, 30:] == 0)
        np.testing.assert_allclose(op.compress(x)[5 * j : 5 * (j + 1)].numpy(),
                                   scipy.fft.dct(chunks[j].numpy(), norm="ortho")[:5], atol=1e-12)
    assert torch.equal(op.from_chunks(chunks), x)


def test_single_chunk_is_first_m_coefficients_and_low_pass_round_trip():
    n, m = 1000, 50
    op = ChunkedDCT(n, m, 1, None)
    x = torch.randn(2, n, dtype=torch.float64)
    padded = np.zeros((2, op.length))
    padded[:, :n] = x.numpy()
    np.testing.assert_allclose(op.compress(x).numpy(), scipy.fft.dct(padded, norm="ortho")[:, :m], atol=1e-12)
    # a signal made of the first m basis vectors (and zero in the padding) passes unchanged
    c = np.zeros(op.length)
    c[:m] = np.random.default_rng(1).standard_normal(m)
    low = scipy.fft.idct(c, norm="ortho")
    assert op.length == n
    np.testing.assert_allclose(op.adjoint(op.compress(torch.from_numpy(low[None])))[0].numpy(), low, atol=1e-12)


def test_linearity_mean_of_compressed_is_compressed_mean():
    n = 5000
    op = ChunkedDCT(n, 250, 10, np.random.default_rng(2).permutation(n))
    u = torch.randn(7, n, dtype=torch.float64)
    np.testing.assert_allclose(op.compress(u).mean(0).numpy(), op.compress(u.mean(0)).numpy(), atol=1e-12)


def test_thesis_size_layout():
    n = 1_663_370
    op = ChunkedDCT(n, 83_168, 200, None)
    assert op.length == 8400 and op.counts.sum() == 83_168 and op.real_counts.max() == 8317


def test_bad_arguments():
    with pytest.raises(ConfigError, match=r"m must be in \[1, n=10\]"):
        ChunkedDCT(10, 11, 1)
    with pytest.raises(ConfigError, match="chunks P"):
        ChunkedDCT(10, 3, 4)
    with pytest.raises(ConfigError, match="permutation"):
        ChunkedDCT(4, 2, 1, np.array([0, 1, 1, 2]))
    op = ChunkedDCT(10, 3, 1)
    with pytest.raises(DataError, match="last dimension 10"):
        op.compress(torch.zeros(2, 9))
    with pytest.raises(DataError, match="float32 or float64"):
        op.compress(torch.zeros(2, 10, dtype=torch.int64))
