"""``VisionHandler``: decoding one request into an image tensor, the base of the image built-ins.

This module owns what counts as an image input (TorchServe's rules): raw bytes, a base64 string,
or a nested list of numbers taken as the tensor itself, read from the request's ``data`` or
``body`` input. Anything else, or bytes PIL cannot read, is a ``BadInputError`` for that request.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from handlers import image_transforms as transforms
from handlers.batching import BatchedHandler
from handlers.context import Context
from handlers.errors import BadInputError

logger = logging.getLogger(__name__)


def request_input(row: Any) -> Any:
    """A request's input: its ``data`` field, else its ``body`` field (TorchServe's names)."""
    if not isinstance(row, dict):
        raise BadInputError(f"Expected a request with a 'data' or 'body' input, got {row!r:.80}.")
    value = row.get("data")
    if value is None:
        value = row.get("body")
    if value is None:
        raise BadInputError(
            f"The request has no 'data' or 'body' input (inputs: {sorted(row)!r}); send the "
            "input as the request body or as a form field named 'data'."
        )
    return value


class VisionHandler(BatchedHandler):
    """Images in, one tensor per request out through :attr:`image_processing`.

    :attr image_processing: applied to the decoded PIL image; must return a tensor.
    :attr image_mode: the PIL mode images are converted to before processing: ``RGB`` for the
        built-ins' own transforms (three channels), ``None`` — the image as sent, as TorchServe
        gives it — for a subclass that brings its ``image_processing`` without an
        ``image_mode`` (MNIST's grayscale transform, say).
    """

    image_processing: Callable[[Image.Image], torch.Tensor] = transforms.ToTensor()
    image_mode: str | None = "RGB"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "image_processing" in own and "image_mode" not in own \
                and not cls.__module__.startswith("handlers."):
            cls.image_mode = None

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        if not context.system_properties.get("limit_max_image_pixels", True):
            Image.MAX_IMAGE_PIXELS = None

    def decode_request(self, row: Any) -> torch.Tensor:
        image = request_input(row)
        if isinstance(image, str):
            try:
                image = base64.b64decode(image)
            except (binascii.Error, ValueError):
                raise BadInputError(
                    "The input is a string but not valid base64; send the image as raw bytes "
                    "or as a base64 string."
                ) from None
        if isinstance(image, (bytes, bytearray)):
            return self.image_processing(self.open_image(bytes(image)))
        if isinstance(image, list):
            try:
                return torch.as_tensor(image, dtype=torch.float32)
            except (TypeError, ValueError, RuntimeError):
                raise BadInputError(
                    "The input is a JSON list but not a rectangular list of numbers."
                ) from None
        raise BadInputError(
            f"Expected an image (bytes, a base64 string or a nested list of numbers), got a "
            f"{type(image).__name__}."
        )

    def open_image(self, raw: bytes) -> Image.Image:
        """The decoded image; a ``BadInputError`` when ``raw`` is not an image PIL can read."""
        try:
            image: Image.Image = Image.open(io.BytesIO(raw))
            image.load()
        except Image.DecompressionBombError as exc:
            raise BadInputError(
                f"The image is too large to decode ({exc}); resize it, or set "
                "limit_max_image_pixels=false if the model needs it."
            ) from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
            raise BadInputError(
                f"The input ({len(raw)} bytes) is not an image format PIL can read "
                "(JPEG, PNG, BMP, GIF, TIFF, WebP, ...)."
            ) from None
        if self.image_mode is not None and image.mode != self.image_mode:
            image = image.convert(self.image_mode)
        return image
