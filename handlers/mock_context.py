"""TorchServe's ``MockContext`` (``ts.torch_handler.unit_tests.test_utils.mock_context``): the
context a handler's unit test builds by hand, with TorchServe's constructor and defaults, so the
tests users wrote for their TorchServe handlers run against mservd's handlers unchanged (their
conftest installs the ``ts.*`` aliases first: ``handlers.ts_compat.install_ts_aliases()``).

It is mservd's :class:`~handlers.context.Context`, so a handler finds every attribute it would
find in a worker; only ``explain`` and ``get_request_header`` are TorchServe's mock's own.
"""

from __future__ import annotations

import os
from typing import Any

from handlers.context import Context
from handlers.ts_util import get_yaml_config


class MockContext(Context):
    def __init__(
        self,
        model_pt_file: str | None = "model.pt",
        model_dir: str = "ts/torch_handler/unit_tests/models/tmp",
        model_file: str | None = "model.py",
        gpu_id: str | None = "0",
        model_name: str = "mnist",
        model_yaml_config_file: str | None = None,
    ) -> None:
        import torch

        manifest: dict[str, Any] = {"model": {}}
        if model_pt_file:
            manifest["model"]["serializedFile"] = model_pt_file
        if model_file:
            manifest["model"]["modelFile"] = model_file
        gpu = int(gpu_id) if gpu_id and torch.cuda.is_available() else None
        yaml_config = (get_yaml_config(os.path.join(model_dir, model_yaml_config_file))
                       if model_yaml_config_file else {})
        super().__init__(model_name, model_dir, manifest, batch_size=1, gpu=gpu,
                         mms_version="mock", model_yaml_config=yaml_config)
        self.explain = False

    def get_request_header(self, idx: int, key: str) -> Any:
        """TorchServe's mock: ``explain`` answers for any request but the first, when set."""
        if self.request_processor:  # a batch begun with begin_batch: its real headers
            return super().get_request_header(idx, key)
        return bool(idx and key and self.explain)
