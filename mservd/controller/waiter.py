"""A management answer that must wait for workers (a synchronous register or scale).

Kept apart from the controller so the management verbs can build one without importing the
loop that checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mservd.protocol import Reply


@dataclass
class Waiter:
    """A management answer that has to wait for workers; ``check`` returns it when ready."""

    respond: Callable[[Reply], None]
    check: Callable[[float], Reply | None]
    deadline: float
    on_timeout: Callable[[], Reply]
