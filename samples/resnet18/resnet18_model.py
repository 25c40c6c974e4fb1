"""torchvision's ResNet-18 (1000 classes) as a no-argument class, for the eager ``--model-file`` path."""

from __future__ import annotations

from torchvision.models.resnet import BasicBlock, ResNet


class ResNet18(ResNet):
    def __init__(self) -> None:
        super().__init__(BasicBlock, [2, 2, 2, 2], num_classes=1000)
