"""Convolutional baselines: the width-parametrised CNN (double descent) and the 5.9M VGG-style CNN."""
from __future__ import annotations

from torch import nn


class WidthCNN(nn.Module):
    """Three 5x5 conv layers of C1, 2*C1, 4*C1 channels (ReLU + 2x2 average pooling each), then
    flatten -> Linear(4*C1) -> ReLU -> Linear(classes). ``width`` is C1."""

    def __init__(self, image_size: int, in_channels: int, num_classes: int, width: int = 10):
        super().__init__()
        if width < 1:
            raise ValueError(f"model.width={width} must be >= 1")
        if image_size < 8:
            raise ValueError(f"the cnn pools three times: dataset.image_size={image_size} must be at least 8")
        self.width = width
        c = [in_channels, width, 2 * width, 4 * width]
        layers = []
        for c_in, c_out in zip(c[:-1], c[1:], strict=True):
            layers += [nn.Conv2d(c_in, c_out, 5, padding=2), nn.ReLU(inplace=True), nn.AvgPool2d(2)]
        self.features = nn.Sequential(*layers)
        side = image_size // 2 // 2 // 2  # each pooling floors: 32 -> 4, 28 -> 3
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(4 * width * side * side, 4 * width), nn.ReLU(inplace=True),
            nn.Linear(4 * width, num_classes),
        )

    def forward(self, x):
        return self.head(self.features(x))


def _conv(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(inplace=True)]


class VGGCNN(nn.Module):
    """conv 32-64, pool, BN, conv 128-128, pool, BN, conv 256-256, pool, BN, FC 4096-1024-512-classes."""

    def __init__(self, image_size: int, in_channels: int, num_classes: int, dropout: float = 0.0):
        super().__init__()
        if image_size < 8:
            raise ValueError(f"cnn_vgg pools three times: dataset.image_size={image_size} must be at least 8")
        self.features = nn.Sequential(
            *_conv(in_channels, 32), *_conv(32, 64), nn.MaxPool2d(2), nn.BatchNorm2d(64),
            *_conv(64, 128), *_conv(128, 128), nn.MaxPool2d(2), nn.BatchNorm2d(128),
            *_conv(128, 256), *_conv(256, 256), nn.MaxPool2d(2), nn.BatchNorm2d(256),
        )
        flat = 256 * (image_size // 2 // 2 // 2) ** 2  # 4096 on 32x32 inputs
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 1024), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(1024, 512), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(512, num_classes),
        )

    def forward(self, x):
        return self.head(self.features(x))
