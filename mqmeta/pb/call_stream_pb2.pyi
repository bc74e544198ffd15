from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class CallStreamOfferRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CallStreamOffer(_message.Message):
    __slots__ = ("port", "services", "address")
    PORT_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    port: int
    services: _containers.RepeatedScalarFieldContainer[str]
    address: str
    def __init__(self, port: _Optional[int] = ..., services: _Optional[_Iterable[str]] = ..., address: _Optional[str] = ...) -> None: ...
