"""ResNet-18 (1000 classes) as a no-argument class, for the eager ``--model-file`` path.

The same layers, names and state-dict keys as torchvision's ``resnet18``, written in plain torch:
serving it needs no torchvision, whose import (it pulls in ``torch._dynamo``) costs every worker
seconds of start-up. A state dict saved from torchvision's model loads into this one.
"""

from __future__ import annotations

import torch
from torch import nn


class ResNet18(nn.Module):
    """One class in the file: TorchServe's loader (and ours) takes the only class defined."""

    class BasicBlock(nn.Module):
        """Two 3x3 convolutions and the shortcut (torchvision's BasicBlock)."""

        def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample: nn.Module | None = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(self.BasicBlock(64, 64), self.BasicBlock(64, 64))
        self.layer2 = nn.Sequential(self.BasicBlock(64, 128, 2), self.BasicBlock(128, 128))
        self.layer3 = nn.Sequential(self.BasicBlock(128, 256, 2), self.BasicBlock(256, 256))
        self.layer4 = nn.Sequential(self.BasicBlock(256, 512, 2), self.BasicBlock(512, 512))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
