from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SetTrafficRequest(_message.Message):
    __slots__ = ("model_name", "traffic_json")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_JSON_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    traffic_json: str
    def __init__(self, model_name: _Optional[str] = ..., traffic_json: _Optional[str] = ...) -> None: ...

class DescribeTrafficRequest(_message.Message):
    __slots__ = ("model_name",)
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    def __init__(self, model_name: _Optional[str] = ...) -> None: ...

class ClearTrafficRequest(_message.Message):
    __slots__ = ("model_name",)
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    def __init__(self, model_name: _Optional[str] = ...) -> None: ...

class TrafficResponse(_message.Message):
    __slots__ = ("msg",)
    MSG_FIELD_NUMBER: _ClassVar[int]
    msg: str
    def __init__(self, msg: _Optional[str] = ...) -> None: ...
