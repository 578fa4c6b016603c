from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    CORRECT: _ClassVar[Status]
    INCORRECT: _ClassVar[Status]
    NO_ANSWER: _ClassVar[Status]
    TIMEOUT: _ClassVar[Status]
    RUNTIME_ERROR: _ClassVar[Status]
    MEMORY_LIMIT: _ClassVar[Status]
    OUTPUT_LIMIT: _ClassVar[Status]
    COMPILE_ERROR: _ClassVar[Status]
    SYNTAX_ERROR: _ClassVar[Status]
    INVALID_INPUT: _ClassVar[Status]
    SANDBOX_ERROR: _ClassVar[Status]
    INTERNAL_ERROR: _ClassVar[Status]
    RESPONSE_TOO_LONG: _ClassVar[Status]

class RewardMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BINARY: _ClassVar[RewardMode]
    FRACTIONAL: _ClassVar[RewardMode]
STATUS_UNSPECIFIED: Status
CORRECT: Status
INCORRECT: Status
NO_ANSWER: Status
TIMEOUT: Status
RUNTIME_ERROR: Status
MEMORY_LIMIT: Status
OUTPUT_LIMIT: Status
COMPILE_ERROR: Status
SYNTAX_ERROR: Status
INVALID_INPUT: Status
SANDBOX_ERROR: Status
INTERNAL_ERROR: Status
RESPONSE_TOO_LONG: Status
BINARY: RewardMode
FRACTIONAL: RewardMode

class Limits(_message.Message):
    __slots__ = ("timeout_s", "test_timeout_s", "memory_mb", "run_all_tests", "reward_mode")
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    TEST_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    RUN_ALL_TESTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_MODE_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    test_timeout_s: float
    memory_mb: int
    run_all_tests: bool
    reward_mode: RewardMode
    def __init__(self, timeout_s: _Optional[float] = ..., test_timeout_s: _Optional[float] = ..., memory_mb: _Optional[int] = ..., run_all_tests: _Optional[bool] = ..., reward_mode: _Optional[_Union[RewardMode, str]] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("id", "domain", "response", "ground_truth_json", "data_source", "limits", "profile")
    ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_JSON_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    id: str
    domain: str
    response: str
    ground_truth_json: str
    data_source: str
    limits: Limits
    profile: str
    def __init__(self, id: _Optional[str] = ..., domain: _Optional[str] = ..., response: _Optional[str] = ..., ground_truth_json: _Optional[str] = ..., data_source: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., profile: _Optional[str] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("id", "reward", "correct", "status", "passed", "total", "detail", "elapsed_ms", "data_source", "profile")
    ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    id: str
    reward: float
    correct: bool
    status: Status
    passed: int
    total: int
    detail: str
    elapsed_ms: float
    data_source: str
    profile: str
    def __init__(self, id: _Optional[str] = ..., reward: _Optional[float] = ..., correct: _Optional[bool] = ..., status: _Optional[_Union[Status, str]] = ..., passed: _Optional[int] = ..., total: _Optional[int] = ..., detail: _Optional[str] = ..., elapsed_ms: _Optional[float] = ..., data_source: _Optional[str] = ..., profile: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Item]
    def __init__(self, items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Result]
    def __init__(self, results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ...) -> None: ...

class ItemBatch(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Item]
    def __init__(self, items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Result]
    def __init__(self, results: _Optional[_Iterable[_Union[Result, _Mapping]]] = ...) -> None: ...
