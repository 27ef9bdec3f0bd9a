"""How an option is declared, once, and read from Spark's strings by its declaration.

Every option is one pydantic field of an `OptionModel` (DESIGN §3), declared with `option()`: its
alias is the name users type, its annotation the type, its default and `ge`/`le` bounds the valid
values, its description the line docs/options.md shows (`reference.py` renders the tables from
it). `Reader` turns Spark's strings into a field's type from that declaration alone, and
`OptionModel.alias()` / `.default()` give the name and the default to any code that needs them,
so no other module writes an option's name, default or range.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from pyspark_rmqs.core.errors import ConfigurationError

LONG_MAX = 2**63 - 1
"""Offsets and timestamps are int64 in the broker and in Spark."""
INT_MAX = 2**31 - 1
DAY_MS = 24 * 60 * 60 * 1000
REFERENCE_MAX_BYTES = 256
"""Consumer and producer names are stream-protocol references."""

Kind = Literal["value", "class", "reference", "parsed"]
"""How `Reader` reads an option: `value` by its type (true/false, an integer in its bounds, one of
a Literal's values, text, a secret), `class` a dotted class path, `reference` a stream-protocol
name (at most 256 bytes), `parsed` by its model's module (its string form is not its type)."""

_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_INTEGER = re.compile(r"[+-]?\d+")


def option(
    name: str,
    default: Any,
    doc: str,
    *,
    ge: int | None = None,
    le: int | None = None,
    kind: Kind = "value",
    broker: str | None = None,
    shown: str | None = None,
    factory: Any = None,
) -> Any:
    """One option: `name` as users type it, its default, its doc line and its bounds.

    `broker` is the RabbitMQ version it needs (the docs' broker column); `shown` the default as the
    docs write it where the value alone would mislead (a default that depends on other options).
    """
    extra: dict[str, Any] = {"kind": kind}
    if broker is not None:
        extra["broker"] = broker
    if shown is not None:
        extra["shown"] = shown
    if factory is not None:
        return Field(default_factory=factory, alias=name, description=doc, json_schema_extra=extra)
    return Field(default, alias=name, description=doc, ge=ge, le=le, json_schema_extra=extra)


def extra(info: FieldInfo) -> Mapping[str, Any]:
    """What `option()` recorded beside pydantic's own attributes (kind, broker, shown default)."""
    value = info.json_schema_extra
    return value if isinstance(value, Mapping) else {}


def bounds(info: FieldInfo) -> tuple[int, int]:
    """An integer option's inclusive range, from its `ge` / `le`."""
    lo = next(m.ge for m in info.metadata if isinstance(m, Ge))
    hi = next(m.le for m in info.metadata if isinstance(m, Le))
    return int(lo), int(hi)  # type: ignore[call-overload]


def plain_type(info: FieldInfo) -> Any:
    """A field's type without `| None`."""
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def err(message: str) -> ConfigurationError:
    return ConfigurationError(message)


def show(value: str, limit: int = 80) -> str:
    """A user value, quoted and shortened, for an error message (never used for secrets)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class OptionModel(BaseModel):
    """A frozen set of options; each aliased field is one option (the table), the rest derived."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,
        validate_by_name=True,
        validate_by_alias=True,
        # Built at the first validation, on the driver: Spark's Python workers only unpickle options
        # and skip building the validators (~30 ms of every worker process's start).
        defer_build=True,
    )

    DERIVED_FROM: ClassVar[Mapping[str, str]] = {}
    """Derived field -> the option it comes from (errors about it name that option)."""
    OPTION_NAMES: ClassVar[Mapping[str, str]] = {}
    """Field name -> the camelCase option name users type (derived from the aliases)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        names = {field: info.alias for field, info in cls.model_fields.items() if info.alias}
        cls.OPTION_NAMES = {**names, **cls.DERIVED_FROM}

    @classmethod
    def alias(cls, field: str) -> str:
        """The option name users type for `field` (KeyError for a field that is no option)."""
        return cls.OPTION_NAMES[field]

    @classmethod
    def default(cls, field: str) -> Any:
        """A field's default, for settings built outside the models (the broker layer's dataclasses)."""
        return cls.model_fields[field].get_default(call_default_factory=True)

    @classmethod
    def option_fields(cls) -> dict[str, FieldInfo]:
        """Option name -> its field, in declaration order: the table of this model."""
        return {info.alias: info for info in cls.model_fields.values() if info.alias}


_M = TypeVar("_M", bound=OptionModel)


def build(cls: type[_M], **fields: Any) -> _M:
    """Construct a model; a rule's ConfigurationError comes out as it is, a pydantic error without
    any input value, naming the option."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        details = []
        for error in exc.errors(include_input=False, include_url=False):
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, ConfigurationError):
                raise ConfigurationError(str(cause)) from None
            loc = [str(part) for part in error["loc"]]
            if loc:
                loc[0] = cls.OPTION_NAMES.get(loc[0], loc[0])
            details.append(f"option '{'.'.join(loc)}': {error['msg']}")
        raise err("; ".join(details)) from None


class Reader:
    """Normalized options (option name -> string) read as the fields of one model.

    Every read is by field name; the option's name, type, bounds and default come from the field.
    Every error names the option and what is valid.
    """

    def __init__(self, values: Mapping[str, str], model: type[OptionModel]) -> None:
        self.values = values
        self.model = model

    def name(self, field: str) -> str:
        return self.model.alias(field)

    def has(self, field: str) -> bool:
        return self.name(field) in self.values

    def raw(self, field: str) -> str | None:
        """The string given, untouched (None when absent)."""
        return self.values.get(self.name(field))

    def text(self, field: str, *, allow_empty: bool = False) -> str | None:
        """The string given, stripped (None when absent)."""
        value = self.raw(field)
        if value is None:
            return None
        value = value.strip()
        if not value and not allow_empty:
            raise err(f"option '{self.name(field)}' must not be empty")
        return value

    def given(self) -> dict[str, Any]:
        """Every option given that is read by its declaration: field -> value in the field's type."""
        return {
            field: self.get(field)
            for field, info in self.model.model_fields.items()
            if info.alias and extra(info).get("kind") != "parsed" and info.alias in self.values
        }

    def get(self, field: str) -> Any:
        """The field's value from its string, or the field's default when the option is absent."""
        info = self.model.model_fields[field]
        name = self.name(field)
        value = self.values.get(name)
        if value is None:
            return info.get_default(call_default_factory=True)
        kind = extra(info).get("kind")
        t = plain_type(info)
        if t is SecretStr:
            return SecretStr(value)
        if t is bool:
            return self._boolean(name, value)
        if t is int:
            return self._integer(name, value, *bounds(info))
        if typing.get_origin(t) is Literal:
            return self._choice(name, value, typing.get_args(t))
        text = self.text(field)
        assert text is not None
        if kind == "class" and not _DOTTED_PATH.fullmatch(text):
            raise err(
                f"option '{name}' must be a dotted path to a class, like 'package.module.ClassName'; "
                f"got {show(text)}"
            )
        if kind == "reference" and len(text.encode()) > REFERENCE_MAX_BYTES:
            raise err(f"option '{name}' must be at most {REFERENCE_MAX_BYTES} bytes long")
        return text

    @staticmethod
    def _boolean(name: str, value: str) -> bool:
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise err(f"option '{name}' must be 'true' or 'false' (case-insensitive), got {show(value)}")

    @staticmethod
    def _integer(name: str, value: str, lo: int, hi: int) -> int:
        text = value.strip()
        if not _INTEGER.fullmatch(text):
            allowed = f"an integer >= {lo}" if hi == LONG_MAX else f"an integer between {lo} and {hi}"
            raise err(f"option '{name}' must be {allowed}, got {show(value)}")
        number = int(text)
        if number < lo and hi == LONG_MAX:
            raise err(f"option '{name}' must be >= {lo}, got {number}")
        if not lo <= number <= hi:
            raise err(f"option '{name}' must be between {lo} and {hi}, got {number}")
        return number

    @staticmethod
    def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise err(f"option '{name}' must be one of {', '.join(choices)}; got {show(value)}")
        return lowered
