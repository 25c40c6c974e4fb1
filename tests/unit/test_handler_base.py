"""BaseHandler's model loading and whole-batch flow, and BatchedHandler's per-request failures."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from handlers.base_handler import BaseHandler
from handlers.batching import BatchedHandler
from handlers.context import Context
from handlers.errors import BadInputError, PredictionException, RequestError

torch.set_num_threads(1)

DOUBLER_PY = """
import torch


class Doubler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return x * self.scale
"""


class Doubler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class RowsHandler(BaseHandler):
    def preprocess(self, data: list[Any]) -> torch.Tensor:
        return torch.as_tensor([row["body"] for row in data], dtype=torch.float32)


class NumberHandler(BatchedHandler):
    """Decodes a JSON number per request; refuses anything else."""

    def decode_request(self, row: Any) -> torch.Tensor:
        value = row.get("body")
        if not isinstance(value, (int, float)):
            raise BadInputError(f"Expected a number, got {value!r}.")
        if value < 0:
            raise PredictionException("Negative numbers are too large to handle.", 413)
        return torch.tensor([float(value)])


def context(
    model_dir: Path, model: dict[str, str], n: int = 1, headers: list[dict[str, str]] | None = None
) -> Context:
    ctx = Context("m", str(model_dir), {"model": model}, n, None, "0.1.0")
    ctx.begin_batch([str(i) for i in range(n)], headers or [{}] * n)
    return ctx


@pytest.fixture()
def scripted_dir(tmp_path: Path) -> Path:
    torch.jit.script(Doubler()).save(str(tmp_path / "model.pt"))
    return tmp_path


@pytest.fixture()
def eager_dir(tmp_path: Path) -> Path:
    (tmp_path / "doubler.py").write_text(DOUBLER_PY)
    torch.save({"scale": torch.tensor(3.0)}, tmp_path / "weights.bin")
    return tmp_path


pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")


def test_base_handler_loads_torchscript_on_cpu(scripted_dir: Path) -> None:
    handler = RowsHandler()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 2)
    handler.initialize(ctx)
    assert handler.initialized and handler.device == torch.device("cpu")
    assert handler.map_location == "cpu"
    assert handler.mapping is None
    assert handler.handle([{"body": [1.0]}, {"body": [2.5]}], ctx) == [[2.0], [5.0]]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.onnx's legacy exporter
def test_base_handler_serves_an_onnx_file_through_onnxruntime_with_its_default_inference(
        tmp_path: Path) -> None:
    """A .onnx serialized file is an onnxruntime session (as TorchServe's BaseHandler makes
    it); the default inference runs the batch as its first input and gives a tensor back,
    so a handler that only preprocesses serves it, with compile settings left to torch."""
    pytest.importorskip("onnxruntime")
    torch.onnx.export(Doubler(), (torch.zeros(1, 1),), str(tmp_path / "model.onnx"),
                      dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
    handler = RowsHandler()
    ctx = context(tmp_path, {"serializedFile": "model.onnx"}, 2)
    ctx.model_yaml_config = {"pt2": {"compile": {"enable": True}}}
    handler.initialize(ctx)
    assert handler.onnx and type(handler.model).__name__ == "InferenceSession"
    assert handler.handle([{"body": [1.0]}, {"body": [2.5]}], ctx) == [[2.0], [5.0]]


def test_base_handler_loads_eager_model_file_and_state_dict(eager_dir: Path) -> None:
    handler = RowsHandler()
    ctx = context(eager_dir, {"serializedFile": "weights.bin", "modelFile": "doubler.py"})
    handler.initialize(ctx)
    assert type(handler.model).__name__ == "Doubler"
    assert not handler.model.training
    assert handler.handle([{"body": [2.0]}], ctx) == [[6.0]]


def test_base_handler_loads_legacy_state_dict_without_mmap(eager_dir: Path) -> None:
    torch.save(
        {"scale": torch.tensor(4.0)}, eager_dir / "old.pth", _use_new_zipfile_serialization=False
    )
    handler = RowsHandler()
    ctx = context(eager_dir, {"serializedFile": "old.pth", "modelFile": "doubler.py"})
    handler.initialize(ctx)
    assert handler.handle([{"body": [1.0]}], ctx) == [[4.0]]


LINEAR_WITH_PROJECTION_PY = """
import torch


class Projected(torch.nn.Module):
    \"\"\"A Linear (initialised by torch.nn.init) and a fixed projection that no state dict
    holds, drawn by torch.nn.init too.\"\"\"

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.register_buffer("projection", torch.nn.init.ones_(torch.empty(2)),
                             persistent=False)

    def forward(self, x):
        return self.linear(x) * self.projection
"""


def test_base_handler_loads_an_eager_model_with_its_linear_layers_weights(
        tmp_path: Path) -> None:
    """Its parameters are built without random initial values (the state dict replaces them);
    a buffer the state dict does not hold is initialised as usual."""
    (tmp_path / "projected.py").write_text(LINEAR_WITH_PROJECTION_PY)
    torch.save({"linear.weight": torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
                "linear.bias": torch.tensor([0.5, -0.5])}, tmp_path / "weights.bin")
    handler = RowsHandler()
    ctx = context(tmp_path, {"serializedFile": "weights.bin", "modelFile": "projected.py"})
    handler.initialize(ctx)
    assert handler.handle([{"body": [1.0, 2.0, 3.0]}], ctx) == [[1.5, 1.5]]
    layer = torch.nn.Linear(3, 2)  # outside the load torch.nn.init draws parameters again
    torch.nn.init.zeros_(layer.weight)
    assert not layer.weight.any()


def test_base_handler_loads_a_half_precision_state_dict_into_the_models_float32(
        eager_dir: Path) -> None:
    """As TorchServe's copying load does: the weights take the model's dtype, so float32
    inputs still run (an assigned float16 tensor would keep its own dtype and fail them)."""
    torch.save({"scale": torch.tensor(3.0, dtype=torch.float16)}, eager_dir / "half.pt")
    handler = RowsHandler()
    ctx = context(eager_dir, {"serializedFile": "half.pt", "modelFile": "doubler.py"})
    handler.initialize(ctx)
    assert handler.model.scale.dtype == torch.float32
    assert handler.handle([{"body": [2.0]}], ctx) == [[6.0]]


def test_batched_handler_preprocess_gives_the_batch_on_the_handlers_device() -> None:
    handler = NumberHandler()
    handler.device = torch.device("meta")  # any device but the CPU the tensors are made on
    assert handler.preprocess([{"body": 1}, {"body": 2}]).device.type == "meta"


@pytest.mark.parametrize(("pt2", "compiled"), [
    ({"compile": {"enable": True, "backend": "eager"}}, True),
    ({"backend": "eager"}, True),  # TorchServe's older form
    ({"compile": {"enable": False, "backend": "eager"}}, False),
    ({"compile": {"enable": True, "backend": "no-such-backend"}}, False),  # logged, served
])
def test_base_handler_compiles_the_model_as_model_config_pt2_asks(
        eager_dir: Path, pt2: dict, compiled: bool) -> None:
    handler = RowsHandler()
    ctx = Context("m", str(eager_dir), {"model": {"serializedFile": "weights.bin",
                                                  "modelFile": "doubler.py"}}, 1, None, "0",
                  model_yaml_config={"pt2": pt2})
    ctx.begin_batch(["0"], [{}])
    handler.initialize(ctx)
    assert (type(handler.model).__name__ == "OptimizedModule") is compiled
    assert handler.handle([{"body": [2.0]}], ctx) == [[6.0]]


def test_base_handler_refuses_a_state_dict_that_lacks_a_parameter(tmp_path: Path) -> None:
    """A parameter built without its initial values never serves: the load is strict."""
    (tmp_path / "projected.py").write_text(LINEAR_WITH_PROJECTION_PY)
    torch.save({"linear.weight": torch.zeros(2, 3)}, tmp_path / "weights.bin")
    ctx = context(tmp_path, {"serializedFile": "weights.bin", "modelFile": "projected.py"})
    with pytest.raises(RuntimeError, match="linear.bias"):
        RowsHandler().initialize(ctx)


def test_base_handler_model_file_with_two_modules_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text(
        "import torch\n\nclass A(torch.nn.Module):\n    pass\n\nclass B(torch.nn.Module):\n    pass\n"
    )
    with pytest.raises(
        ValueError, match=r"exactly one torch.nn.Module subclass; found 2: \['A', 'B'\]"
    ):
        RowsHandler().initialize(context(tmp_path, {"modelFile": "two.py"}))


def test_base_handler_model_file_without_module_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "none.py").write_text("class Helper:\n    pass\n")
    with pytest.raises(ValueError, match="found 0"):
        RowsHandler().initialize(context(tmp_path, {"modelFile": "none.py"}))


def test_base_handler_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="Model file 'missing.py' is not in"):
        RowsHandler().initialize(context(tmp_path, {"modelFile": "missing.py"}))
    with pytest.raises(RuntimeError, match="does not exist"):
        RowsHandler().initialize(context(tmp_path, {"serializedFile": "gone.pt"}))
    with pytest.raises(RuntimeError, match="neither a serializedFile nor a modelFile"):
        RowsHandler().initialize(context(tmp_path, {}))
    with pytest.raises(RuntimeError, match="'model.tflite' is neither TorchScript"):
        RowsHandler().initialize(context(tmp_path, {"serializedFile": "model.tflite"}))
    (tmp_path / "lib.so").write_bytes(b"\x7fELF")
    with pytest.raises(RuntimeError, match=r"pt2: \{export: \{aot_compile: true\}\}"):
        RowsHandler().initialize(context(tmp_path, {"serializedFile": "lib.so"}))
    if importlib.util.find_spec("onnxruntime") is not None:
        with pytest.raises(RuntimeError, match="does not exist"):
            RowsHandler().initialize(context(tmp_path, {"serializedFile": "gone.onnx"}))


def test_base_handler_explain_without_get_insights_is_a_clear_error(scripted_dir: Path) -> None:
    handler = RowsHandler()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 1, [{"explain": "True"}])
    handler.initialize(ctx)
    with pytest.raises(PredictionException, match="does not support explanations") as info:
        handler.handle([{"body": [1.0]}], ctx)
    assert info.value.error_code == 400


def test_base_handler_explain_calls_get_insights(scripted_dir: Path) -> None:
    class Explained(RowsHandler):
        def get_insights(self, tensor: torch.Tensor, inputs: Any, target: int) -> list[Any]:
            return [{"inputs": inputs, "target": target, "shape": list(tensor.shape)}]

    handler = Explained()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 1, [{"Explain": "true"}])
    handler.initialize(ctx)
    assert handler.handle([{"body": [1.0], "target": 3}], ctx) == [
        {"inputs": [1.0], "target": 3, "shape": [1, 1]}
    ]


@pytest.mark.parametrize("handler_class", [RowsHandler, NumberHandler])
def test_a_describe_question_gets_describe_handle_and_runs_no_model(
        scripted_dir: Path, handler_class: type) -> None:
    class Described(handler_class):
        def describe_handle(self) -> dict[str, Any]:
            return {"labels": 10, "trained_on": "digits"}

        def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a describe question ran the model")

    handler = Described()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 1, [{"describe": "True"}])
    handler.initialize(ctx)
    assert handler.handle([{}], ctx) == [{"labels": 10, "trained_on": "digits"}]
    plain = RowsHandler()  # TorchServe's default: no metadata
    plain.initialize(ctx)
    assert plain.handle([{}], ctx) == [None]


def test_batched_handler_failures_stay_with_their_request(scripted_dir: Path) -> None:
    handler = NumberHandler()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 4)
    handler.initialize(ctx)
    outputs = handler.handle([{"body": 1}, {"body": "x"}, {"body": -1}, {"body": 4}], ctx)
    assert outputs == [
        [2.0],
        RequestError(400, "Expected a number, got 'x'.", "BadInput"),
        RequestError(413, "Negative numbers are too large to handle.", "BadInput"),
        [8.0],
    ]


def test_batched_handler_checks_postprocess_length(scripted_dir: Path) -> None:
    class Short(NumberHandler):
        def postprocess(self, data: Any) -> list[Any]:
            return [1]

    handler = Short()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 2)
    handler.initialize(ctx)
    with pytest.raises(PredictionException, match="returned 1 items for 2 requests"):
        handler.handle([{"body": 1}, {"body": 2}], ctx)


def test_batched_handler_with_overridden_preprocess_keeps_whole_batch_semantics(
    scripted_dir: Path,
) -> None:
    class TorchServeStyle(NumberHandler):
        def preprocess(self, data: list[Any]) -> torch.Tensor:
            return torch.as_tensor([[float(row["body"])] for row in data])

    handler = TorchServeStyle()
    ctx = context(scripted_dir, {"serializedFile": "model.pt"}, 2)
    handler.initialize(ctx)
    assert handler.handle([{"body": 1}, {"body": -3}], ctx) == [[2.0], [-6.0]]
    with pytest.raises(ValueError):
        handler.handle([{"body": 1}, {"body": "x"}], ctx)
