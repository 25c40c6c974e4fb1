"""Which heavy libraries the zygote imports before forking a model's workers."""

from __future__ import annotations

from pathlib import Path

from mservd.specs import WorkerSpec
from mservd.worker.zygote import libraries_for


def spec(model_dir: Path, handler: str = "handler.py", **extra) -> WorkerSpec:
    return WorkerSpec(worker_id="9000", endpoint="ipc:///nowhere", model_name="m",
                      version="1.0", model_dir=str(model_dir), manifest={}, handler=handler,
                      batch_size=1, gpu_id=None, threads=1, model_yaml={},
                      max_response_size=1 << 20, **extra)


def test_the_builtin_handlers_need_no_shared_library(tmp_path: Path) -> None:
    assert libraries_for(spec(tmp_path, "image_classifier")) == []
    assert libraries_for(spec(tmp_path, "object_detector:handle")) == []


def test_imports_in_the_model_code_are_found_by_their_top_package(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(
        "import os\nfrom torchvision.models.resnet import ResNet\n"
        "def f():\n    import transformers.utils as u\n")
    (tmp_path / "relative.py").write_text("from .timm import x\n")
    assert libraries_for(spec(tmp_path)) == ["torchvision", "transformers"]


def test_plain_torch_code_and_broken_files_need_nothing(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("import torch\nimport numpy\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    assert libraries_for(spec(tmp_path)) == []


def test_a_model_with_its_own_requirements_imports_its_own_copy(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("import transformers\n")
    assert libraries_for(spec(tmp_path, install_py_dep_per_model=True)) == []
