"""Manifest layout, parsing and the name rules the daemon reuses."""

from __future__ import annotations

import pytest

from archiver import ArchiveError, Manifest
from archiver.manifest import validate_model_name, validate_version


def test_manifest_to_dict_matches_torchserve_layout() -> None:
    manifest = Manifest(
        model_name="resnet",
        model_version="2.0",
        handler="handler.py:handle",
        serialized_file="model.pt",
        created_on="01/02/2024 10:11:12",
        archiver_version="0.1.0",
    )
    assert manifest.to_dict() == {
        "createdOn": "01/02/2024 10:11:12",
        "runtime": "python",
        "model": {
            "modelName": "resnet",
            "modelVersion": "2.0",
            "handler": "handler.py:handle",
            "serializedFile": "model.pt",
        },
        "archiverVersion": "0.1.0",
    }


def test_manifest_round_trips_through_dict() -> None:
    manifest = Manifest(
        model_name="m",
        model_version="3",
        handler="image_classifier",
        serialized_file="w.pt",
        model_file="model.py",
        requirements_file="requirements.txt",
        config_file="model-config.yaml",
        created_on="01/02/2024 10:11:12",
        archiver_version="0.12.0",
        extensions={"k": 1},
    )
    assert Manifest.from_dict(manifest.to_dict()) == manifest


def test_manifest_from_dict_tolerates_unknown_keys_and_missing_version() -> None:
    manifest = Manifest.from_dict(
        {"runtime": "python", "future": 1, "model": {"modelName": "m", "handler": "h", "x": 2}}
    )
    assert manifest == Manifest(model_name="m", model_version="1.0", handler="h")


@pytest.mark.parametrize(
    ("data", "wording"),
    [
        ([], "expected a JSON object, got list"),
        ({"model": None}, "key 'model' must be an object"),
        ({"model": {"modelName": "../x"}}, "Invalid manifest key 'model.modelName'"),
        ({"model": {"modelName": "m", "modelVersion": "a/b"}}, "'model.modelVersion'"),
        ({"model": {"modelName": "m", "handler": 3}}, "'model.handler': expected a string, got 3"),
        ({"model": {"modelName": "m", "serializedFile": ["x"]}}, "'model.serializedFile'"),
        ({"model": {"modelName": "m", "extensions": 1}}, "'model.extensions'"),
    ],
)
def test_manifest_from_dict_names_the_bad_key(data: object, wording: str) -> None:
    with pytest.raises(ArchiveError, match="Invalid manifest") as info:
        Manifest.from_dict(data)
    assert wording in str(info.value)


@pytest.mark.parametrize("name", ["resnet", "r-1.0_b", "9lives", "A"])
def test_validate_model_name_accepts_torchserve_names(name: str) -> None:
    assert validate_model_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a/b", "a b", "../x", "é", None, 3])
def test_validate_model_name_refuses_bad_names(name: object) -> None:
    with pytest.raises(ArchiveError) as info:
        validate_model_name(name)
    assert str(info.value).startswith(f"Invalid model name {name!r}: it must match ^[A-Za-z0-9]")


@pytest.mark.parametrize("version", ["", " ", "a/b", "a\\b", "..", "1..2", None, 1.0])
def test_validate_version_refuses_bad_versions(version: object) -> None:
    with pytest.raises(ArchiveError, match=r"^Invalid model version "):
        validate_version(version)


def test_manifest_is_hashable_and_frozen() -> None:
    manifest = Manifest(model_name="m")
    assert hash(manifest) == hash(Manifest(model_name="m"))
    with pytest.raises(AttributeError):
        manifest.model_name = "other"  # type: ignore[misc]
