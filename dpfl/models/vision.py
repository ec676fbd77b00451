"""Image models of the thesis: the MNIST/Fashion-MNIST CNN and All-CNN-C for CIFAR-10.

Keras -> PyTorch: inputs are NCHW here (Keras: NHWC). 'same' padding for a k x k kernel at
stride 1 is padding=k//2. Keras flattens in (H, W, C) order, PyTorch in (C, H, W): the dense
layer sees a permutation of the same features (same parameter count, same function class).
Outputs are logits (the thesis's softmax is in the loss).
"""

from __future__ import annotations

import torch
from torch import nn


class ThesisCNN(nn.Module):
    """[MMRHA16] CNN: Conv5x5(32, same)+ReLU, MaxPool2, Conv5x5(64, same)+ReLU, MaxPool2,
    Dense 512 ReLU, Dense num_classes. 1,663,370 parameters for 1x28x28 inputs and 10 classes."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 2 // 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side * side, 512),
            nn.ReLU(),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class AllCNNC(nn.Module):
    """All-CNN-C [SDBR15]: 3x Conv3x3(96) (last stride 2), dropout 0.5, 3x Conv3x3(192) (last
    stride 2), dropout 0.5, Conv3x3(192, valid), Conv1x1(192), Conv1x1(num_classes), global
    average pooling. ReLU after every conv but the last. 1,369,738 parameters for 10 classes.

    Keras 'same' at stride 2 pads (0 before, 1 after) on 32 -> 16; here padding=1 on both
    sides gives the same 16x16 output with a one-pixel shift. The paper's valid 3x3 conv in
    block 3 (8 -> 6) and no ReLU on the class conv (logits) are assumptions; the thesis does
    not say. The paper's 20 % input dropout is not used (the thesis lists dropout 0.5 only).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, dropout: float = 0.5):
        super().__init__()

        def conv(i, o, k, stride=1, padding=1):
            return [nn.Conv2d(i, o, k, stride=stride, padding=padding), nn.ReLU()]

        self.net = nn.Sequential(
            *conv(in_channels, 96, 3),
            *conv(96, 96, 3),
            *conv(96, 96, 3, stride=2),
            nn.Dropout(dropout),
            *conv(96, 192, 3),
            *conv(192, 192, 3),
            *conv(192, 192, 3, stride=2),
            nn.Dropout(dropout),
            *conv(192, 192, 3, padding=0),
            *conv(192, 192, 1, padding=0),
            nn.Conv2d(192, num_classes, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).mean(dim=(-2, -1))
