"""Small PyTorch models written in plain ``torch.nn`` (no torchvision) for the example, the
tests and ``bench/torch_profile.py``: a CNN, a CIFAR-size ResNet-18 and a 2-layer transformer.

Each ``make_*`` returns ``(module, inputs, targets, loss_fn, optimizer)`` for one batch, built
from a fixed seed so two calls give identical modules and data.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Two conv blocks and a classifier, for 3×32×32 images."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3×3 convolutions and a (projected) shortcut."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or inplanes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for CIFAR-size inputs (3×3 stem, no max-pool), as in He et al. §4.2."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, inplanes = [], 64
        for planes, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride),
                                        BasicBlock(planes, planes, 1)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(torch.flatten(x, 1))


class Attention(nn.Module):
    """Causal multi-head self-attention written out (FX traces it op by op)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length = x.size(0), x.size(1)
        shape = (batch, length, self.heads, self.head_dim)
        q = self.query(x).reshape(shape).transpose(1, 2)
        k = self.key(x).reshape(shape).transpose(1, 2)
        v = self.value(x).reshape(shape).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(mask, float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a 4× MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    """A 2-layer causal language model; the output head is tied to the token embedding."""

    def __init__(self, vocab: int = 512, dim: int = 128, heads: int = 4, layers: int = 2,
                 length: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)  # tied to the output head: GPT-2's scale
        self.position = nn.Parameter(torch.randn(length, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("mask", torch.ones(length, length, dtype=torch.bool).triu(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position  # sequences of exactly ``length`` tokens
        for block in self.blocks:
            x = block(x, self.mask)
        return F.linear(self.norm(x), self.embed.weight)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position of a ``(batch, length, vocab)`` output."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_cnn(batch: int = 16, seed: int = 0) -> tuple[Any, ...]:
    """``SmallCNN`` on random 3×32×32 images, SGD with momentum."""
    torch.manual_seed(seed)
    module = SmallCNN()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.003, momentum=0.9)
    return module, x, y, nn.CrossEntropyLoss(), optimizer


def make_resnet18(batch: int = 16, seed: int = 0) -> tuple[Any, ...]:
    """``ResNet18`` on random CIFAR-size images, SGD with momentum."""
    torch.manual_seed(seed)
    module = ResNet18()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.003, momentum=0.9)
    return module, x, y, nn.CrossEntropyLoss(), optimizer


def make_transformer(batch: int = 8, seed: int = 0, length: int = 64,
                     **sizes: int) -> tuple[Any, ...]:
    """``TinyTransformer`` on random token sequences (next-token targets), Adam."""
    torch.manual_seed(seed)
    module = TinyTransformer(length=length, **sizes)
    vocab = module.embed.num_embeddings
    tokens = torch.randint(0, vocab, (batch, length + 1))
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    return module, tokens[:, :-1], tokens[:, 1:], token_loss, optimizer


EXAMPLES = {"cnn": make_cnn, "resnet18": make_resnet18, "transformer": make_transformer}

__all__ = ["EXAMPLES", "ResNet18", "SmallCNN", "TinyTransformer", "make_cnn", "make_resnet18",
           "make_transformer", "token_loss"]
