"""load_handler: TorchServe's rules for turning a manifest's handler value into an entry point."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from handlers.context import Context
from handlers.image_classifier import ImageClassifier
from handlers.loader import BUILTIN_HANDLERS, HandlerLoadError, load_handler


def write(model_dir: Path, name: str, source: str) -> None:
    (model_dir / name).write_text(textwrap.dedent(source))


def context(model_dir: Path) -> Context:
    ctx = Context("m", str(model_dir), {"model": {}}, 1, None, "0.1.0")
    ctx.begin_batch(["r"], [{}])
    return ctx


CLASS_HANDLER = """
    from handlers.base_handler import BaseHandler  # imported classes do not count


    class EchoHandler:
        def initialize(self, context):
            self.model_name = context.model_name

        def handle(self, data, context):
            return [{"echo": row["body"], "model": self.model_name} for row in data]
"""


@pytest.mark.parametrize("value", ["echo_handler.py", "echo_handler", "sub/echo_handler.py"])
def test_loader_class_handler_is_instantiated_and_initialized(tmp_path: Path, value: str) -> None:
    write(tmp_path, "echo_handler.py", CLASS_HANDLER)
    loaded = load_handler(str(tmp_path), value)
    ctx = context(tmp_path)
    loaded.initialize(ctx)
    assert type(loaded.service).__name__ == "EchoHandler"
    assert loaded.handle([{"body": 1}], ctx) == [{"echo": 1, "model": "m"}]
    assert loaded.description == "class echo_handler.EchoHandler"


def test_loader_class_handler_without_initialize_is_fine(tmp_path: Path) -> None:
    write(
        tmp_path,
        "plain.py",
        "class Plain:\n    def handle(self, data, context):\n        return data\n",
    )
    loaded = load_handler(str(tmp_path), "plain.py")
    loaded.initialize(context(tmp_path))
    assert loaded.handle([1, 2], context(tmp_path)) == [1, 2]


def test_loader_module_handle_function_is_called_with_none_at_initialize(tmp_path: Path) -> None:
    write(
        tmp_path,
        "fn_handler.py",
        """
        calls = []

        class Model:  # a class beside handle(): TorchServe uses the function
            pass

        def handle(data, context):
            calls.append(data)
            return None if data is None else [len(data)]
        """,
    )
    loaded = load_handler(str(tmp_path), "fn_handler.py")
    ctx = context(tmp_path)
    loaded.initialize(ctx)
    assert loaded.handle(["a", "b"], ctx) == [2]
    import fn_handler  # type: ignore[import-not-found]

    assert fn_handler.calls == [None, ["a", "b"]]
    assert loaded.service is None


def test_loader_named_function_is_the_entry_point(tmp_path: Path) -> None:
    write(
        tmp_path,
        "multi.py",
        """
        seen = []

        class A:
            pass

        class B:
            pass

        def predict(data, context):
            seen.append(data)
            return ["predicted"] if data else None
        """,
    )
    loaded = load_handler(str(tmp_path), "multi.py:predict")
    ctx = context(tmp_path)
    loaded.initialize(ctx)
    assert loaded.handle([{}], ctx) == ["predicted"]
    import multi  # type: ignore[import-not-found]

    assert multi.seen == [None, [{}]]
    assert loaded.description == "function multi.predict"


def test_loader_two_classes_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "two.py", "class A:\n    pass\n\n\nclass B:\n    pass\n")
    with pytest.raises(
        HandlerLoadError, match=r"two.py defines 2 classes \['A', 'B'\]; it must define exactly one"
    ):
        load_handler(str(tmp_path), "two.py")


def test_loader_no_class_and_no_handle_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "empty.py", "X = 1\n")
    with pytest.raises(HandlerLoadError, match="defines no class and no handle"):
        load_handler(str(tmp_path), "empty.py")


def test_loader_missing_file_names_the_file_and_the_builtins(tmp_path: Path) -> None:
    with pytest.raises(HandlerLoadError) as info:
        load_handler(str(tmp_path), "nothere.py")
    message = str(info.value)
    assert "Handler file 'nothere.py' is not in the model directory" in message
    assert "image_classifier" in message


def test_loader_unknown_module_name_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(
        HandlerLoadError, match="'no_such_handler' is not a file in the model directory"
    ):
        load_handler(str(tmp_path), "no_such_handler")


def test_loader_missing_named_function_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "h.py", "def handle(data, context):\n    return data\n")
    with pytest.raises(HandlerLoadError, match="module 'h' has no function 'predict'"):
        load_handler(str(tmp_path), "h.py:predict")


def test_loader_reports_a_missing_dependency(tmp_path: Path) -> None:
    write(tmp_path, "needs.py", "import not_installed_pkg_xyz\n")
    with pytest.raises(
        HandlerLoadError, match="imports 'not_installed_pkg_xyz', which is not installed"
    ):
        load_handler(str(tmp_path), "needs.py")


def test_loader_reports_a_syntax_error(tmp_path: Path) -> None:
    write(tmp_path, "broken.py", "def handle(:\n")
    with pytest.raises(HandlerLoadError, match="'broken' .* failed to import: SyntaxError"):
        load_handler(str(tmp_path), "broken.py")


@pytest.mark.parametrize("name", sorted(BUILTIN_HANDLERS))
def test_loader_builtin_names_resolve_to_builtin_classes(tmp_path: Path, name: str) -> None:
    loaded = load_handler(str(tmp_path), name)
    assert loaded.description == f"built-in {name}"
    assert type(loaded.service).__module__ == f"handlers.{name}"


def test_loader_archive_file_wins_over_builtin_name(tmp_path: Path) -> None:
    write(tmp_path, "image_classifier.py", "def handle(data, context):\n    return ['mine']\n")
    loaded = load_handler(str(tmp_path), "image_classifier")
    assert loaded.handle([1], context(tmp_path)) == ["mine"]
    assert not isinstance(loaded.service, ImageClassifier)


def test_loader_same_file_name_in_two_model_dirs_loads_each(tmp_path: Path) -> None:
    results: list[Any] = []
    for tag in ("first", "second"):
        model_dir = tmp_path / tag
        model_dir.mkdir()
        write(model_dir, "handler.py", f"def handle(data, context):\n    return ['{tag}']\n")
        results.append(load_handler(str(model_dir), "handler.py").handle([1], context(model_dir)))
    assert results == [["first"], ["second"]]


def test_loader_subclass_of_builtin_in_archive(tmp_path: Path) -> None:
    write(
        tmp_path,
        "custom.py",
        """
        from handlers.image_classifier import ImageClassifier


        class Custom(ImageClassifier):
            topk = 1
        """,
    )
    loaded = load_handler(str(tmp_path), "custom.py")
    assert isinstance(loaded.service, ImageClassifier) and loaded.service.topk == 1


def test_loader_empty_handler_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(HandlerLoadError, match="The manifest names no handler"):
        load_handler(str(tmp_path), " ")
