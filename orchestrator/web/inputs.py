"""What a request to the page or its JSON API says, read and checked: where it came from
(a cross-site POST is refused), its form or JSON body (bounded), the document it names,
and the filter it selects documents by.

A filter travels as query parameters (links, the list's form, the bulk confirmation's
hidden fields) and as a JSON object (the API), in one form, ``Selection``: the collection
``c``; ``phase`` (repeatable); ``state`` (leased, overdue, waiting, free; retrying: the
latest attempt failed and it is tried again; failed: its handler gave up on it);
``error`` (an error type); ``key`` (repeatable): a value of the collection's business key
(the one-field unique key its replicas declare), or ``FIELD=VALUE`` for any indexed field
(so a value holding ``=`` is given with its field: ``invoice=A=B``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS
from starlette.requests import Request

from orchestrator.operations import AsyncOperations, Filter, LeaseState, id_json, parse_fields

__all__ = [
    "MAX_BODY_BYTES",
    "Refused",
    "Resend",
    "Selection",
    "cross_site",
    "form",
    "json_body",
    "named",
    "parse_ref",
]

MAX_BODY_BYTES = 16 * 1024
"""An action's form or JSON body holds a few short fields; anything larger is refused
unread."""
MAX_FIELDS = 64
"""Fields of a form: a bulk action's carries its filter (a phase per field) besides its own."""


@dataclass(frozen=True)
class Resend:
    """A refused form (its URL and fields), offered again with the box that forces it
    for the operator to tick: ``flag``, the field it sets (``any_phase``: a phase no live
    replica handles; ``force``: a pause of what no live replica has)."""

    target: str
    fields: list[tuple[str, str]]
    flag: str = "any_phase"

    @classmethod
    def of(cls, target: str, fields: Mapping[str, Sequence[str]], flag: str) -> Resend:
        """``fields`` as posted, but ``flag``: the box is the operator's to tick."""
        resent = [(k, v) for k, values in fields.items() if k != flag for v in values]
        return cls(target, resent, flag)


class Refused(Exception):
    """A request answered with an explanation and an HTTP status, not a result;
    ``choices``: links (text, URL) to the documents the request may have meant; ``kind``:
    the refusal's name for the JSON API (``{"error", "kind"}``); ``resend``: the form
    posted, for the page to offer it again with its forcing box."""

    def __init__(
        self,
        status: int,
        message: str,
        choices: Sequence[tuple[str, str]] = (),
        kind: str = "BadRequest",
        resend: Resend | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.choices = list(choices)
        self.kind = kind
        self.resend = resend


@dataclass(frozen=True)
class Selection:
    """A filter as the operator gave it (``key`` values as typed); ``resolve`` makes it the
    ``Filter`` the operations take."""

    collection: str
    phases: tuple[str, ...] = ()
    state: LeaseState | None = None
    error: str | None = None
    keys: tuple[str, ...] = ()

    @classmethod
    def read(cls, values: Mapping[str, Sequence[str]]) -> Selection:
        """From query parameters or a form: each name with all its values (empty ones,
        as an unfilled form field sends them, are absent)."""

        def given(name: str) -> list[str]:
            return [v for v in values.get(name, ()) if v.strip()]

        collections = given("c")
        if not collections:
            raise Refused(400, "which collection? give its name (c=...)")
        states = given("state")
        errors = given("error")
        return cls(
            collection=collections[-1],
            phases=tuple(dict.fromkeys(given("phase"))),
            state=_state(states[-1]) if states else None,
            error=errors[-1].strip() if errors else None,
            keys=tuple(k.strip() for k in given("key")),
        )

    @classmethod
    def from_json(cls, collection: Any, given: Any) -> Selection:
        """From the API's ``filter`` object: ``phase`` and ``key`` a string or a list of
        them, ``state`` and ``error`` strings."""
        if not isinstance(given, Mapping):
            raise Refused(400, "the filter is an object: {phase, state, error, key}")
        unknown = sorted(set(given) - {"phase", "state", "error", "key"})
        if unknown:
            raise Refused(400, f"unknown filter field(s): {', '.join(unknown)}")
        values: dict[str, list[str]] = {"c": [_string(collection, "c")]}
        for name in ("phase", "state", "error", "key"):
            value = given.get(name)
            items = value if isinstance(value, list) else [] if value is None else [value]
            values[name] = [_string(item, name) for item in items]
        return cls.read(values)

    def params(self) -> list[tuple[str, str]]:
        """As query parameters or hidden form fields, in ``read``'s names."""
        out = [("c", self.collection)]
        out += [("phase", phase) for phase in self.phases]
        if self.state is not None:
            out.append(("state", self.state.value))
        if self.error is not None:
            out.append(("error", self.error))
        out += [("key", key) for key in self.keys]
        return out

    def describe(self) -> dict[str, Any]:
        """As typed, as the audit trail keeps a filter refused before it was resolved."""
        shown: dict[str, Any] = {"collection": self.collection}
        for name, values in (("phase", self.phases), ("key", self.keys)):
            if values:
                shown[name] = list(values)
        if self.state is not None:
            shown["state"] = self.state.value
        if self.error is not None:
            shown["error"] = self.error
        return shown

    async def resolve(self, operations: AsyncOperations) -> Filter:
        """The ``Filter``: each key as ``FIELD=VALUE``, or a bare value of the collection's
        business key (``OperatorError`` when its replicas declare none)."""
        fields: list[tuple[str, Any]] = []
        for key in self.keys:
            if "=" in key:
                fields.extend(parse_fields([key]))
            else:
                fields.extend(await operations.key_filter(self.collection, key))
        return Filter(
            collection=self.collection,
            phases=self.phases,
            state=self.state,
            error_type=self.error,
            fields=tuple(fields),
        )


def _state(text: str) -> LeaseState:
    try:
        return LeaseState(text.strip().lower())
    except ValueError:
        shown = ", ".join(s.value for s in LeaseState)
        raise Refused(400, f"unknown lease state {text!r} (one of: {shown})") from None


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise Refused(400, f"{name} is a string, not {json.dumps(value, default=str)}")
    return value


def cross_site(request: Request) -> str | None:
    """Why a POST came from another site, or None: fetch metadata first, then ``Origin``
    against ``Host``; neither header is no browser's cross-site form (``app``'s module
    says why that is safe)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    if origin == "null" or urlsplit(origin).netloc != request.headers.get("host"):
        return f"Origin {origin} is not this site"
    return None


async def _body(request: Request, kind: str, what: str) -> str:
    """The body of a POST of content type ``kind``, checked for where it came from and
    read up to ``MAX_BODY_BYTES``."""
    refusal = cross_site(request)
    if refusal is not None:
        raise Refused(403, f"refused a cross-site request ({refusal})", kind="CrossSite")
    given = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if given != kind:
        raise Refused(415, f"an action is {what} ({kind})", kind="UnsupportedMediaType")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise Refused(
                413, f"an action's body is at most {MAX_BODY_BYTES} bytes", kind="TooLarge"
            )
    return body.decode("utf-8", errors="replace")


async def form(request: Request) -> dict[str, list[str]]:
    """An action's url-encoded form, each field with all its values."""
    text = await _body(request, "application/x-www-form-urlencoded", "a form post")
    try:
        return parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except ValueError as exc:
        raise Refused(400, f"malformed form: {exc}") from None


async def json_body(request: Request) -> dict[str, Any]:
    """An API action's JSON object, read as Extended JSON (``{"$date": ...}`` is a date).
    A browser sends this content type cross-site only after a preflight, which this app
    never answers: no other site's page can post it."""
    text = await _body(request, "application/json", "a JSON post")
    try:
        data = json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise Refused(400, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Refused(400, "the body is a JSON object")
    return data


NAMED_LENGTH = 200
"""Most characters of a document reference the audit trail keeps as given."""


def named(text: Any) -> list[str]:
    """The document a request names by ``ref``, as the audit trail names documents: its
    id as canonical Extended JSON, else what was given, shortened (none: nothing)."""
    if not isinstance(text, str) or not text:
        return []
    try:
        shown = id_json(parse_ref(text))
    except Refused:
        shown = text
    return [shown[:NAMED_LENGTH]]


def parse_ref(text: str | None, what: str = "document reference") -> Any:
    """A value given as canonical Extended JSON (a document's ``ref``, a confirmed state)."""
    if not text:
        raise Refused(400, f"the request has no {what}")
    try:
        return json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise Refused(400, f"malformed {what}: {exc}") from None
