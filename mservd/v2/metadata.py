"""A model's v2 metadata (input and output names, datatypes, shapes) from its model-config.yaml.

The archive declares it in a ``v2:`` section (docs/v2.md)::

    v2:
      platform: pytorch            # optional
      inputs:  [{name: INPUT0, datatype: FP32, shape: [-1, 64]}]
      outputs: [{name: OUTPUT0, datatype: FP32, shape: [-1, 10]}]

Pure: the controller uses it to answer metadata questions, the worker to check inputs and name
outputs. A model without the section has no declared tensors and accepts any input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mservd.errors import short_repr
from mservd.v2.codec import DATATYPES, V2Error

DEFAULT_PLATFORM = "pytorch"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]  # -1 is a variable dimension

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def accepts_shape(self, shape: list[int]) -> bool:
        return len(shape) == len(self.shape) and all(
            want == -1 or want == got for want, got in zip(self.shape, shape))


@dataclass(frozen=True)
class ModelMetadata:
    platform: str = DEFAULT_PLATFORM
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)

    def output(self, name: str) -> TensorSpec | None:
        return next((o for o in self.outputs if o.name == name), None)


def from_model_yaml(model_yaml: dict[str, Any] | None) -> ModelMetadata:
    """The ``v2:`` section of a model-config.yaml; an empty ``ModelMetadata`` when absent.

    :raises V2Error: the section is malformed (the message names the entry and the fix).
    """
    section = (model_yaml or {}).get("v2")
    if not section:
        return ModelMetadata()
    if not isinstance(section, dict):
        raise V2Error("model-config.yaml 'v2' must be a mapping with inputs and outputs.")
    platform = section.get("platform") or DEFAULT_PLATFORM
    if not isinstance(platform, str):
        raise V2Error(f"model-config.yaml v2.platform {short_repr(platform)} is not a string.")
    return ModelMetadata(
        platform=platform,
        inputs=_specs(section.get("inputs"), "inputs"),
        outputs=_specs(section.get("outputs"), "outputs"),
    )


def _specs(items: Any, where: str) -> list[TensorSpec]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise V2Error(f"model-config.yaml v2.{where} must be a list of "
                      "{name, datatype, shape} entries.")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise V2Error(f"model-config.yaml v2.{where} entry {short_repr(item)} has no name.")
        name = short_repr(item["name"])
        datatype = item.get("datatype", "")
        datatype = datatype.upper() if isinstance(datatype, str) else ""
        if datatype not in DATATYPES:
            raise V2Error(f"model-config.yaml v2.{where} entry {name} has datatype "
                          f"{short_repr(item.get('datatype'))}; use one of "
                          f"{', '.join(DATATYPES)}.")
        shape = item.get("shape", [-1])
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= -1 for d in shape):
            raise V2Error(f"model-config.yaml v2.{where} entry {name} has shape "
                          f"{short_repr(shape)}; use a list of integers, -1 for a variable "
                          "dimension.")
        out.append(TensorSpec(item["name"], datatype, list(shape)))
    return out
