"""Which documents an operator's command is about, said the same way by every command:
``-c COLLECTION``; one document by its id as typed (or its business key) or as Extended
JSON (``--id-json``); or every document the browser's filters select (``--phase``,
``--state``, ``--error``, ``--key`` and ``FIELD=VALUE`` arguments), as ``find`` lists
them and ``retry``, ``unlock`` and ``cancel`` act on them."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from orchestrator.cli.conventions import CommandError
from orchestrator.core.documents import Document
from orchestrator.operations import (
    AmbiguousId,
    DocumentNotFound,
    Filter,
    LeaseState,
    Operations,
    Row,
    id_json,
    parse_fields,
    parse_id_json,
)

F = TypeVar("F", bound=Callable[..., Any])

ID_JSON_HELP = (
    'The document\'s id as Extended JSON, exactly: \'{"$numberInt": "42"}\' is the integer 42,'
    ' \'"42"\' the string, \'{"$oid": "..."}\' an ObjectId. Instead of ID, when ID names'
    " more than one document, an id has no typed form, or it holds '='."
)

FIELD_VALUE = re.compile(r"^[A-Za-z_][\w.-]*=")
"""An argument that selects by a field (``number=INV-7``), not an id."""

STATES = [state.value for state in LeaseState]


def collection_option(help_text: str = "The documents' collection.") -> Callable[[F], F]:
    return click.option("--collection", "-c", required=True, help=help_text)


def filter_options(phase_names: Sequence[str] = ("--phase",)) -> Callable[[F], F]:
    """``--phase`` (repeatable; named ``phase_names``: retry's own ``--phase`` is where
    documents go, so its filter is ``--from``), ``--state``, ``--error`` and ``--key``."""

    def decorate(command: F) -> F:
        command = click.option(
            "--key",
            metavar="VALUE",
            help="Documents whose business key (the one-field unique key the replicas "
            "declare, e.g. submit's unique=) is VALUE, as text; FIELD=VALUE names the field.",
        )(command)
        command = click.option(
            "--error",
            "error_type",
            metavar="TYPE",
            help="Documents whose last error is of this type (e.g. TimeoutError).",
        )(command)
        command = click.option(
            "--state",
            type=click.Choice(STATES, case_sensitive=False),
            help="Documents in this lease state: leased (a live lease), overdue (a lease "
            "past its expiry: its holder died or is stuck), waiting (sitting out a relock or "
            "retry, or a later start set at submit), free; retrying (its latest attempt "
            "failed and it is tried again), or failed (its handler gave up on it: it stays "
            "in the failed phase until retried).",
        )(command)
        return click.option(
            *phase_names,
            "phases",
            multiple=True,
            metavar="PHASE",
            help="Documents in this phase (repeatable: any of them).  [default: every phase]",
        )(command)

    return decorate


@dataclass(frozen=True)
class Selection:
    """What the command line named in ``collection``: one document (``doc_id`` as typed,
    or ``exact`` as Extended JSON), or the filters of many."""

    collection: str
    doc_id: str | None
    exact: str | None
    phases: tuple[str, ...]
    state: str | None
    error_type: str | None
    key: str | None
    fields: tuple[str, ...]

    @classmethod
    def of(
        cls,
        arguments: Sequence[str],
        *,
        collection: str,
        exact: str | None = None,
        phases: Sequence[str] = (),
        state: str | None = None,
        error_type: str | None = None,
        key: str | None = None,
    ) -> Selection:
        """``arguments``: the command's ``[ID | FIELD=VALUE ...]``, told apart by ``=``."""
        ids = [a for a in arguments if not FIELD_VALUE.match(a)]
        context = click.get_current_context()
        if len(ids) > 1:
            raise click.UsageError(
                f"one ID at a time, not {len(ids)}: select several with the filters "
                "(--state, --error, --key, FIELD=VALUE)",
                context,
            )
        selection = cls(
            collection=collection,
            doc_id=ids[0] if ids else None,
            exact=exact,
            phases=tuple(phases),
            state=state,
            error_type=error_type,
            key=key,
            fields=tuple(a for a in arguments if FIELD_VALUE.match(a)),
        )
        if selection.doc_id is not None and exact is not None:
            raise click.UsageError("give ID or --id-json, not both", context)
        if selection.one and selection.filtered:
            raise click.UsageError("give an ID or filters, not both", context)
        return selection

    @property
    def one(self) -> bool:
        """Whether it names one document."""
        return self.doc_id is not None or self.exact is not None

    @property
    def filtered(self) -> bool:
        """Whether any filter was given."""
        return bool(
            self.phases or self.state or self.error_type or self.key is not None or self.fields
        )

    def filter(self, operations: Operations) -> Filter:
        """The browser's filter of these options."""
        collection = self.collection
        fields = operations.key_filter(collection, self.key) if self.key is not None else ()
        return Filter(
            collection,
            phases=self.phases,
            state=LeaseState(self.state.lower()) if self.state else None,
            error_type=self.error_type,
            fields=(*fields, *parse_fields(self.fields)),
        )


def selection_options(
    phase_names: Sequence[str] = ("--phase",),
    *,
    arguments: str = "targets",
    metavar: str = "[ID | FIELD=VALUE...]",
    by_id: bool = True,
) -> Callable[[F], F]:
    """The documents a command is about, given to it as one ``selection``: ``-c``, the
    ``arguments`` (``metavar``: ids and ``FIELD=VALUE``), ``--id-json`` (``by_id``: a
    command that names one document) and the filters (``filter_options``)."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, **options: Any) -> Any:
            selection = Selection.of(
                options.pop(arguments),
                collection=options.pop("collection"),
                exact=options.pop("exact", None),
                phases=options.pop("phases"),
                state=options.pop("state"),
                error_type=options.pop("error_type"),
                key=options.pop("key"),
            )
            return command(*args, selection=selection, **options)

        decorated: Any = run
        for option in (
            filter_options(phase_names),
            *(
                [click.option("--id-json", "exact", metavar="JSON", help=ID_JSON_HELP)]
                if by_id
                else []
            ),
            collection_option(),
            click.argument(arguments, metavar=metavar, nargs=-1),
        ):
            decorated = option(decorated)
        result: F = decorated
        return result

    return decorate


def row_of(operations: Operations, collection: str, doc: Document) -> Row | None:
    """``doc`` as a list shows it (its business key, lease state, handler names), read
    now; None when it has no phase (no list holds it)."""
    rows = operations.browse(Filter(collection, fields=(("_id", doc["_id"]),)), limit=1).rows
    return rows[0] if rows else None


def the_document(
    operations: Operations, collection: str, raw: str | None, exact: str | None
) -> Document:
    """The one document the operator names, by its id or business key as typed (``raw``)
    or its id as Extended JSON (``exact``); text that names two documents is refused,
    saying how to name each."""
    if exact is not None:
        try:
            return operations.document(collection, parse_id_json(exact))
        except DocumentNotFound:
            raise CommandError(f"no document {exact} in collection {collection!r}") from None
    if raw is None:
        raise click.UsageError(
            "which document? give its ID, or --id-json", click.get_current_context()
        )
    try:
        return operations.find(collection, raw)
    except DocumentNotFound:
        raise CommandError(f"no document {raw!r} in collection {collection!r}") from None
    except AmbiguousId as exc:
        raise CommandError(_ambiguous(collection, raw, exc.documents)) from None


def _ambiguous(collection: str, raw: str, docs: Iterable[Document]) -> str:
    """Why ``raw`` is refused: the documents it names, each with the Extended JSON that
    names it alone, quoted for a shell, to give as ``--id-json``."""
    forms = " or ".join(f"--id-json {shlex.quote(id_json(doc['_id']))}" for doc in docs)
    return f"{raw!r} names more than one document in {collection!r}: say which with {forms}"


__all__ = [
    "ID_JSON_HELP",
    "Selection",
    "collection_option",
    "filter_options",
    "row_of",
    "selection_options",
    "the_document",
]
