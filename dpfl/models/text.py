"""The thesis's IMDB model: Embedding(5000, 50) -> Conv1D(250, 5) -> MaxPool1D(3) -> LSTM(70) -> Dense(1).

Keras -> PyTorch: Conv1D works on [B, C, L] here (Keras [B, L, C]); 'valid' padding, ReLU
(as in the Keras imdb_cnn_lstm example); MaxPool1D(3) has stride 3 (400 -> 396 -> 132 steps).
Keras's LSTM has one bias vector (4·70) where nn.LSTM has two, so the LSTM is written out
(`KerasLSTM`) to keep exactly 402,701 parameters; it uses only standard ops, so it runs
under torch.func.vmap. The output is one logit per review (no sigmoid).
"""

from __future__ import annotations

import torch
from torch import nn


class KerasLSTM(nn.Module):
    """Single-layer LSTM with Keras's parameter layout: kernel [4h, in], recurrent kernel
    [4h, h], one bias [4h]; gate order (input, forget, cell, output); tanh / sigmoid.
    (Keras 2.2's default recurrent activation was hard_sigmoid; sigmoid is used here.)
    Returns the last hidden state [B, h] of inputs [B, T, in]."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(4 * hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xw = x @ self.weight_ih.T + self.bias  # all input projections at once: [B, T, 4h]
        h = x.new_zeros(x.shape[0], self.hidden_size)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            i, f, g, o = (xw[:, t] + h @ self.weight_hh.T).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return h


class ImdbCnnLstm(nn.Module):
    """Tokens int64 [B, L] -> one logit [B]. 402,701 parameters with the defaults."""

    def __init__(
        self,
        vocab_size: int = 5000,
        embed_dim: int = 50,
        filters: int = 250,
        kernel_size: int = 5,
        pool: int = 3,
        hidden: int = 70,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.conv = nn.Conv1d(embed_dim, filters, kernel_size)
        self.pool = nn.MaxPool1d(pool)
        self.lstm = KerasLSTM(filters, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens).transpose(1, 2)  # [B, E, L]
        x = self.pool(torch.relu(self.conv(x))).transpose(1, 2)  # [B, T, filters]
        return self.out(self.lstm(x)).squeeze(-1)
