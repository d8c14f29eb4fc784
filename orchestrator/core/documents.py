"""A document as the library reads it, and its id as exact text: what the engine, the
store and every operator's tool share about a document, whatever they do with it.

An id typed as text may name two documents (the string ``"42"`` and the integer ``42``);
its canonical Extended JSON (``id_json``) names exactly one, whatever its type, so it
round-trips through a log line, a link, a form or a command line to the very same id.
"""

from __future__ import annotations

from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS

from orchestrator.core.errors import OperatorError

Document = dict[str, Any]
"""A MongoDB document, as PyMongo returns it with the library's codec options."""


def id_json(doc_id: Any) -> str:
    """``doc_id`` as canonical Extended JSON: exact whatever its type (``42`` is
    ``{"$numberInt": "42"}``, the string ``"42"`` is ``"42"``)."""
    return json_util.dumps(doc_id, json_options=CANONICAL_JSON_OPTIONS)


def id_json_or_text(doc_id: Any) -> str:
    """``id_json``, or the id as text when it has no Extended JSON form."""
    try:
        return id_json(doc_id)
    except (TypeError, ValueError, BSONError):
        return str(doc_id)


def parse_id_json(text: str) -> Any:
    """An id given as Extended JSON (``id_json``'s form; plain JSON too): ``OperatorError``
    when it is not."""
    try:
        return json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise OperatorError(f"malformed Extended JSON id {text!r}: {exc}") from None


__all__ = ["Document", "id_json", "id_json_or_text", "parse_id_json"]
