"""The built-in ``image_classifier``, with the digits model's preprocessing instead of ImageNet's.

The model was trained on 8x8 grayscale digits with ink levels scaled to [0, 1] (``train.py``),
so an image is made grayscale, shrunk to 8x8 and turned into a 1x8x8 tensor in [0, 1]. Decoding,
batching, top-5 ``{label: probability}`` output and per-request errors are the built-in's.
"""

from __future__ import annotations

from torchvision import transforms

from handlers.image_classifier import ImageClassifier


class DigitsClassifier(ImageClassifier):
    image_processing = transforms.Compose(
        [
            transforms.Grayscale(num_output_channels=1),
            transforms.Resize((8, 8)),
            transforms.ToTensor(),
        ]
    )
