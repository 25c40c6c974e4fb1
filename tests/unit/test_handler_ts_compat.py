"""Handlers written for TorchServe import ``ts.*`` and get mservd's classes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_ts_compat_torchserve_handler_imports_resolve_to_ours(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("a: [1]\n")
    (tmp_path / "ts_handler.py").write_text(
        textwrap.dedent(
            """
            from ts.context import Context
            from ts.torch_handler.base_handler import BaseHandler
            from ts.torch_handler.image_classifier import ImageClassifier
            from ts.utils.util import PredictionException, get_yaml_config, map_class_to_label
            from ts.handler_utils.timer import timed
            import ts.torch_handler.base_handler


            class MyHandler(ImageClassifier):
                topk = 2
            """
        )
    )
    script = textwrap.dedent(
        f"""
        import sys
        assert "ts" not in sys.modules
        from handlers.ts_compat import install_ts_aliases
        from handlers.loader import load_handler
        import handlers.base_handler, handlers.errors, handlers.image_classifier

        install_ts_aliases()
        loaded = load_handler({str(tmp_path)!r}, "ts_handler.py")
        assert isinstance(loaded.service, handlers.image_classifier.ImageClassifier)
        import ts_handler
        assert ts_handler.BaseHandler is handlers.base_handler.BaseHandler
        assert ts_handler.PredictionException is handlers.errors.PredictionException
        assert ts_handler.ts.torch_handler.base_handler is handlers.base_handler
        import handlers.timer
        assert ts_handler.timed is handlers.timer.timed
        assert ts_handler.get_yaml_config({str(tmp_path / "c.yaml")!r}) == {{"a": [1]}}
        print("ok")
        """
    )
    # A fresh interpreter: the aliases are process-wide and must not leak into other tests.
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_ts_metrics_dimension_resolves_and_records() -> None:
    import subprocess
    import sys

    code = (
        "from handlers.ts_compat import install_ts_aliases; install_ts_aliases()\n"
        "from ts.metrics.dimension import Dimension\n"
        "from handlers.metrics import MetricsRecorder\n"
        "m = MetricsRecorder('m'); m.add_counter('C', 2, dimensions=[Dimension('Level', 'Model')])\n"
        "[s] = m.drain(); print(s.dimensions['Level'], s.value)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Model 2.0"


class Timed:
    """A TorchServe-style handler whose methods carry ``@timed``."""

    def __init__(self, profile: object) -> None:
        from handlers.context import Context

        config = {"handler": {"profile": profile}} if profile is not None else {}
        self.context = Context("m", ".", {}, 1, None, "0", model_yaml_config=config)

    from handlers.timer import timed

    @timed
    def preprocess(self, data: list) -> list:
        """Doubles."""
        return [2 * x for x in data]


def test_timed_records_a_method_time_only_when_the_model_config_asks_for_profiling() -> None:
    profiled = Timed(True)
    assert profiled.preprocess([1, 2]) == [2, 4]
    [sample] = profiled.context.metrics.drain()
    assert (sample.name, sample.unit, sample.dimensions["ModelName"]) == (
        "ts_handler_preprocess", "ms", "m")
    assert sample.value >= 0
    for profile in (False, None):
        plain = Timed(profile)
        assert plain.preprocess([3]) == [6]
        assert plain.context.metrics.drain() == []
    assert Timed.preprocess.__doc__ == "Doubles."


def test_map_class_to_label_keeps_values_as_given_as_torchserve_does() -> None:
    from handlers.labels import map_class_to_label

    # TorchServe's object detector maps each box to its class's label
    boxes = map_class_to_label([[[1.0, 2.0, 3.0, 4.0]]], {"7": "cat"}, lbl_classes=[[7]])
    assert boxes == [{"cat": [1.0, 2.0, 3.0, 4.0]}]
    assert map_class_to_label([[0.25, 0.75]]) == [{"0": 0.25, "1": 0.75}]
    assert map_class_to_label([[0.5]], {"2": "dog"}, [[2.0]]) == [{"dog": 0.5}]


def test_a_torchserve_handler_unit_test_with_mock_context_runs_unchanged(tmp_path: Path) -> None:
    """TorchServe's MockContext, as its users' handler tests build it: model.py and a state
    dict in model_dir, a BaseHandler subclass initialised and run on a batch by hand."""
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import torch

        class Doubler(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = torch.nn.Parameter(torch.tensor(2.0))

            def forward(self, x):
                return x * self.scale
        """))
    (tmp_path / "model-config.yaml").write_text("handler: {threshold: 3}\n")
    test = textwrap.dedent(f"""
        import torch
        from handlers.ts_compat import install_ts_aliases
        install_ts_aliases()  # the one line a user's conftest.py adds

        from ts.torch_handler.base_handler import BaseHandler
        from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext

        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from model import Doubler
        torch.save(Doubler().state_dict(), {str(tmp_path / "model.pt")!r})

        ctx = MockContext(model_dir={str(tmp_path)!r}, model_name="doubler",
                          model_yaml_config_file="model-config.yaml")
        handler = BaseHandler()
        handler.initialize(ctx)
        assert ctx.model_yaml_config == {{"handler": {{"threshold": 3}}}}
        assert ctx.manifest == {{"model": {{"serializedFile": "model.pt",
                                            "modelFile": "model.py"}}}}
        print(handler.handle([[1.0, 2.0], [3.0, 4.0]], ctx))
        ctx.explain = True
        print(ctx.get_request_header(0, "explain"), ctx.get_request_header(1, "explain"))
        """)
    result = subprocess.run([sys.executable, "-c", test], capture_output=True, text=True,
                            timeout=120, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[[2.0, 4.0], [6.0, 8.0]]", "False True"]
