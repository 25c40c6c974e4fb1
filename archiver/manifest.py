"""The model archive's ``MAR-INF/MANIFEST.json``.

Owns the :class:`Manifest` value, its JSON layout (exactly TorchServe's, so archives made by
``torch-model-archiver`` and by us read alike) and the model-name and version rules, which the
daemon reuses to validate names everywhere. It does no IO: reading and writing archives is
:mod:`archiver.reader` and :mod:`archiver.writer`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from archiver.errors import ArchiveError

__all__ = [
    "MANIFEST_PATH",
    "MODEL_NAME_PATTERN",
    "Manifest",
    "validate_model_name",
    "validate_version",
]

#: Where the manifest lives inside an archive, always with forward slashes.
MANIFEST_PATH = "MAR-INF/MANIFEST.json"

#: TorchServe's rule for model names; also keeps names safe as file and URL path parts.
MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")

#: ``Manifest`` field -> key inside the manifest's ``"model"`` object, for the optional keys.
_OPTIONAL_MODEL_KEYS = {
    "serialized_file": "serializedFile",
    "model_file": "modelFile",
    "requirements_file": "requirementsFile",
    "config_file": "configFile",
}


def validate_model_name(name: object) -> str:
    """Return ``name`` if it is a valid model name, else raise :class:`ArchiveError`.

    :param name: the candidate name, of any type (it often comes straight from JSON or a URL).
    """
    if not isinstance(name, str) or not MODEL_NAME_PATTERN.fullmatch(name):
        raise ArchiveError(
            f"Invalid model name {name!r}: it must match {MODEL_NAME_PATTERN.pattern}"
            " (a letter or digit, then letters, digits, '_', '-' or '.')."
        )
    return name


def validate_version(version: object) -> str:
    """Return ``version`` if it is a valid model version, else raise :class:`ArchiveError`.

    A version becomes a path part and a URL segment, so it may not be empty or contain
    ``/``, ``\\`` or ``..``.

    :param version: the candidate version, of any type.
    """
    if not isinstance(version, str) or not version.strip():
        raise ArchiveError(
            f"Invalid model version {version!r}: it must be a non-empty string such as '1.0'."
        )
    if "/" in version or "\\" in version or ".." in version or "\x00" in version:
        raise ArchiveError(
            f"Invalid model version {version!r}: it may not contain '/', '\\' or '..';"
            " use a plain version such as '1.0'."
        )
    return version


@dataclass(frozen=True)
class Manifest:
    """What an archive says about its model.

    File fields hold names relative to the archive root (TorchServe records basenames).
    ``created_on`` and ``archiver_version`` are ``None`` for a manifest derived from an
    archive that has no ``MANIFEST.json``.
    """

    model_name: str
    model_version: str = "1.0"
    handler: str | None = None
    serialized_file: str | None = None
    model_file: str | None = None
    requirements_file: str | None = None
    config_file: str | None = None
    runtime: str = "python"
    created_on: str | None = None
    archiver_version: str | None = None
    # hash=False: a dict is unhashable, and the other fields identify a manifest well enough.
    extensions: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest as TorchServe's ``MANIFEST.json`` object; absent keys are omitted."""
        model: dict[str, Any] = {"modelName": self.model_name, "modelVersion": self.model_version}
        if self.handler is not None:
            model["handler"] = self.handler
        for attr, key in _OPTIONAL_MODEL_KEYS.items():
            value = getattr(self, attr)
            if value is not None:
                model[key] = value
        if self.extensions:
            model["extensions"] = dict(self.extensions)
        result: dict[str, Any] = {}
        if self.created_on is not None:
            result["createdOn"] = self.created_on
        result["runtime"] = self.runtime
        result["model"] = model
        if self.archiver_version is not None:
            result["archiverVersion"] = self.archiver_version
        return result

    @classmethod
    def from_dict(cls, data: object) -> Manifest:
        """Build a manifest from a parsed ``MANIFEST.json``, validating names and types.

        Unknown keys are ignored so that manifests from newer archivers still load.
        A missing ``modelVersion`` (TorchServe's archiver allowed it once) reads as ``"1.0"``.

        :raises ArchiveError: naming the bad key, its value and what is expected.
        """
        if not isinstance(data, dict):
            raise ArchiveError(
                f"Invalid manifest: expected a JSON object, got {type(data).__name__}."
            )
        model = data.get("model")
        if not isinstance(model, dict):
            raise ArchiveError(
                f"Invalid manifest: key 'model' must be an object with 'modelName', got {model!r}."
            )
        name = model.get("modelName")
        try:
            validate_model_name(name)
        except ArchiveError as exc:
            raise ArchiveError(f"Invalid manifest key 'model.modelName': {exc}") from None
        version = model.get("modelVersion", "1.0")
        try:
            validate_version(version)
        except ArchiveError as exc:
            raise ArchiveError(f"Invalid manifest key 'model.modelVersion': {exc}") from None

        def optional_str(where: dict[str, Any], key: str, label: str) -> str | None:
            value = where.get(key)
            if value is not None and not isinstance(value, str):
                raise ArchiveError(
                    f"Invalid manifest key {label!r}: expected a string, got {value!r}."
                )
            return value

        files = {
            attr: optional_str(model, key, f"model.{key}")
            for attr, key in _OPTIONAL_MODEL_KEYS.items()
        }
        extensions = model.get("extensions") or {}
        if not isinstance(extensions, dict):
            raise ArchiveError(
                f"Invalid manifest key 'model.extensions': expected an object, got {extensions!r}."
            )
        runtime = optional_str(data, "runtime", "runtime") or "python"
        return cls(
            model_name=name,  # type: ignore[arg-type]  # validated above
            model_version=version,
            handler=optional_str(model, "handler", "model.handler"),
            runtime=runtime,
            created_on=optional_str(data, "createdOn", "createdOn"),
            archiver_version=optional_str(data, "archiverVersion", "archiverVersion"),
            extensions=dict(extensions),
            **files,
        )
