"""Batches in which one bad request fails only itself.

This module owns :class:`BatchedHandler`, the base of the built-in handlers: each request is
decoded on its own (:meth:`~BatchedHandler.decode_request`), a request that cannot be decoded
gets a :class:`~handlers.errors.RequestError` at its position (whatever its decoding raised:
a ``PredictionException`` keeps its status, anything else is a 500 naming it), the good ones
are collated into one batch and run through the model once per group, and the results are
merged back in request order, so ``len(outputs) == len(data)`` always holds. A group whose
collating or inference fails fails its own requests; the other groups are answered.

A subclass written for TorchServe that overrides ``preprocess`` keeps TorchServe's whole-batch
behaviour: its ``preprocess`` sees every request, and an exception fails the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from typing import Any

import torch

from handlers.base_handler import BaseHandler
from handlers.context import Context
from handlers.errors import PredictionException, RequestError

logger = logging.getLogger(__name__)


class BatchedHandler(BaseHandler):
    """Decode per request, infer per batch.

    Subclasses implement :meth:`decode_request` and may override :meth:`collate` (default:
    ``torch.stack``), :meth:`group_key`, :meth:`inference` and :meth:`postprocess` (which gets
    the model output for the good requests only and returns one item per good request).
    """

    def decode_request(self, row: Any) -> Any:
        """One request's input as a model-ready value (usually a tensor).

        Raise :class:`~handlers.errors.BadInputError` (or any ``PredictionException``) when the
        request cannot be decoded; only that request fails.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement decode_request(row)")

    def collate(self, values: list[Any]) -> Any:
        """The decoded values of one group as one model input."""
        return torch.stack(values)

    def group_key(self, value: Any) -> Hashable:
        """Values with equal keys are collated together; by default tensors of one shape,
        so that inputs a transform left at different sizes still run (one pass per size)."""
        if isinstance(value, torch.Tensor):
            return tuple(value.shape)
        return None

    def preprocess(self, data: list[Any]) -> Any:
        """TorchServe's whole-batch preprocess: decode every request, fail on the first bad one;
        the batch on the handler's device, as TorchServe's vision and text handlers give it."""
        return self._to_device(self.collate([self.decode_request(row) for row in data]))

    def handle(self, data: list[Any], context: Context) -> list[Any]:
        self.context = context
        if (self._is_explain() or self._is_describe()
                or type(self).preprocess is not BatchedHandler.preprocess):
            return super().handle(data, context)
        start = time.perf_counter()
        outputs: list[Any] = [None] * len(data)
        groups: dict[Hashable, list[tuple[int, Any]]] = {}
        for idx, row in enumerate(data):
            try:
                value = self.decode_request(row)
                key = self.group_key(value)
            except Exception as exc:  # this request's content: it fails alone
                logger.info(
                    "Request %s of model %s failed to decode: %s",
                    context.get_request_id(idx),
                    context.model_name,
                    exc.message if isinstance(exc, PredictionException) else repr(exc),
                    exc_info=None if isinstance(exc, PredictionException) else exc,
                )
                outputs[idx] = RequestError.from_exception(exc)
                continue
            groups.setdefault(key, []).append((idx, value))

        for members in groups.values():
            positions = [idx for idx, _ in members]
            try:
                results = self.postprocess(
                    self.inference(self.collate([v for _, v in members])))
            except Exception as exc:  # this group's requests fail; the others are answered
                if len(positions) == len(data):  # the whole batch: the worker's failure path
                    raise
                logger.error("A group of %d requests of model %s failed: %s", len(members),
                             context.model_name, exc, exc_info=exc)
                for idx in positions:
                    outputs[idx] = RequestError.from_exception(exc)
                continue
            if len(results) != len(positions):
                raise PredictionException(
                    f"{type(self).__name__}.postprocess returned {len(results)} items for "
                    f"{len(positions)} requests; it must return one item per request."
                )
            for idx, result in zip(positions, results):
                outputs[idx] = result
        self._record_handler_time(context, start)
        return outputs
