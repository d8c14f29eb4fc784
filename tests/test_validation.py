"""Pydantic's validation errors said as one line per bad field (``core/validation.py``):
the field, its value (cut short when long) and what is allowed, or the field a misspelt
one was meant to be."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.core.validation import explain

pytestmark = pytest.mark.pure


class Inner(BaseModel):
    count: int


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=2)
    size: int = 0
    inner: Inner | None = None
    retry_limit: int = Field(0, alias="retryLimit")

    @model_validator(mode="after")
    def _small(self) -> Sample:
        assert self.size < 100, "size must stay under 100"
        return self


def said(model: type[BaseModel] | None = Sample, **values: Any) -> str:
    with pytest.raises(ValidationError) as raised:
        Sample(**values)
    return explain(raised.value, "sample", model)


def test_a_missing_field_is_required() -> None:
    assert said() == "invalid sample: name: required"


def test_a_bad_value_is_shown_with_what_is_allowed() -> None:
    assert said(name="a") == "invalid sample: name='a': must have at least 2 characters"
    assert said(name="ab", size="many") == (
        "invalid sample: size='many': must be a valid integer, unable to parse string as an integer"
    )


def test_a_nested_field_is_named_by_its_path() -> None:
    assert said(name="ab", inner={"count": "x"}).startswith(
        "invalid sample: inner.count='x': must be a valid integer"
    )


def test_a_long_value_is_cut_short() -> None:
    shown = repr("x" * 100)[:57] + "..."
    assert said(name="ab", size="x" * 100).startswith(f"invalid sample: size={shown}: ")
    fits = "y" * 58  # its repr is 60 characters: shown whole
    assert said(name="ab", size=fits).startswith(f"invalid sample: size={fits!r}: ")


def test_a_model_check_says_its_own_message() -> None:
    assert said(name="ab", size=100).startswith("invalid sample: size must stay under 100")


def test_a_misspelt_field_is_matched_to_a_name_or_an_alias() -> None:
    assert said(name="ab", sise=1) == "invalid sample: sise: no such field (did you mean 'size'?)"
    assert said(name="ab", retryLimits=1) == (
        "invalid sample: retryLimits: no such field (did you mean 'retryLimit'?)"
    )
    assert said(name="ab", zzz=1) == "invalid sample: zzz: no such field"
    assert said(None, name="ab", sise=1) == "invalid sample: sise: no such field"


def test_every_bad_field_is_said_in_one_line() -> None:
    text = said(name="a", size="many", zzz=1)
    assert text.count(";") == 2 and "\n" not in text
