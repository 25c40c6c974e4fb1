"""The vision built-ins' preprocessing gives exactly torchvision's tensors, without torchvision."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from handlers import image_transforms as ours

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.mark.parametrize("size,mode", [((300, 400), "RGB"), ((640, 480), "RGB"),
                                       ((256, 256), "RGB"), ((500, 333), "L"),
                                       ((100, 180), "RGB"), ((224, 300), "RGBA")])
def test_imagenet_preprocessing_matches_torchvision_bit_for_bit(size, mode) -> None:
    from torchvision import transforms as tv

    channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], channels), np.uint8)
    image = Image.fromarray(pixels.squeeze(), mode)
    theirs = tv.Compose([tv.Resize(256), tv.CenterCrop(224), tv.ToTensor()])(image)
    mine = ours.Compose([ours.Resize(256), ours.CenterCrop(224), ours.ToTensor()])(image)
    assert torch.equal(theirs, mine)
    assert torch.equal(tv.ToTensor()(image), ours.ToTensor()(image))
    padded = tv.ToTensor()(tv.CenterCrop(300)(image))  # a crop larger than the image pads it
    assert torch.equal(padded, ours.ToTensor()(ours.CenterCrop(300)(image)))
    if mode == "RGB":
        assert torch.equal(tv.Normalize(MEAN, STD)(theirs), ours.Normalize(MEAN, STD)(mine))
