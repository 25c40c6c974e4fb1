"""The image preprocessing of the vision built-ins — torchvision's transforms on PIL images,
written out so the built-ins do not import torchvision.

Importing torchvision imports ``torch._dynamo`` (about 3 s of CPU and 90 MiB per process), which
a worker that only classifies images never uses. These give the same tensors as
``transforms.Resize``, ``CenterCrop``, ``ToTensor`` and ``Normalize`` do on a PIL image (the
same PIL calls, the same arithmetic); a handler may still set ``image_processing`` to any
torchvision pipeline of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, steps: Sequence[Callable[[Any], Any]]) -> None:
        self.steps = list(steps)

    def __call__(self, image: Any) -> Any:
        for step in self.steps:
            image = step(image)
        return image


class Resize:
    """The shorter side to ``size`` pixels, keeping the aspect ratio (bilinear)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = self.size, int(self.size * long / short)
        new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
        if (new_w, new_h) == (w, h):
            return image
        return image.resize((new_w, new_h), Image.Resampling.BILINEAR)


class CenterCrop:
    """The middle ``size`` x ``size`` pixels; a smaller image is first padded with black."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        if w < self.size or h < self.size:
            padded = Image.new(image.mode, (max(w, self.size), max(h, self.size)))
            padded.paste(image, ((max(w, self.size) - w) // 2, (max(h, self.size) - h) // 2))
            image, (w, h) = padded, padded.size
        top = round((h - self.size) / 2.0)
        left = round((w - self.size) / 2.0)
        return image.crop((left, top, left + self.size, top + self.size))


class ToTensor:
    """A PIL image as a float tensor, channels first, values in [0, 1]."""

    def __call__(self, image: Image.Image) -> torch.Tensor:
        dtype = {"I": np.int32, "I;16": np.int16, "F": np.float32}.get(image.mode, np.uint8)
        array = np.array(image, dtype, copy=True)
        if image.mode == "1":
            array = 255 * array
        tensor = torch.from_numpy(array).view(image.size[1], image.size[0], len(image.getbands()))
        tensor = tensor.permute((2, 0, 1)).contiguous()
        if tensor.dtype == torch.uint8:
            return tensor.to(dtype=torch.get_default_dtype()).div(255)
        return tensor


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean)[:, None, None]
        self.std = torch.tensor(std)[:, None, None]

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std
