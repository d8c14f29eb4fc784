"""Reference pages generated from the code, so they cannot drift from it.

- ``orchestrator-model``: every field of a pydantic model (``Settings``,
  ``HandlerOptions``) with its type, default, constraints and description, after the
  model's docstring (which states the rules that tie fields together).
- ``orchestrator-events``: every event type a ``Listener`` receives (the ``Event``
  union), the listener method it is delivered to, and its fields.
- ``orchestrator-metrics``: every metric ``PrometheusListener`` registers (with a document
  count source, so the ``StatusCollector``'s too): name as scraped, type, labels, help.

Each renders reStructuredText into the page (``nested_parse``), so cross-references and
the docstrings' markup work as autodoc's do.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Iterator
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.typing import stringify_annotation

SYMBOLS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥",
           "max_length": "length ≤"}  # fmt: skip


def _indented(text: str, by: str = "   ") -> list[str]:
    return [by + line if line.strip() else "" for line in inspect.cleandoc(text).splitlines()]


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def constraints(field: FieldInfo) -> list[str]:
    """The field's bounds as a reader says them (``> 0``, ``≤ 86400``, strict)."""
    said = []
    for item in field.metadata:
        for name, symbol in SYMBOLS.items():
            value = getattr(item, name, None)
            if value is not None:
                said.append(f"{symbol} {_number(value)}")
        if getattr(item, "strict", None):
            said.append("strict (no conversion from another type)")
    return said


def default(field: FieldInfo) -> str:
    """The default as RST: a value, or what its factory computes."""
    factory = field.default_factory
    if factory is not None:
        if inspect.isclass(factory):
            return f":class:`~{factory.__module__}.{factory.__qualname__}` ``()``"
        doc = inspect.getdoc(factory) or factory.__name__
        return f"computed: {doc}"
    if field.default is PydanticUndefined:
        return "required"
    return f"``{field.default!r}``"


class ModelFields(SphinxDirective):
    """``orchestrator-model dotted.path.Model``: the model's docstring and each field."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name, _, name = self.arguments[0].rpartition(".")
        model = getattr(importlib.import_module(module_name), name)
        if not (inspect.isclass(model) and issubclass(model, BaseModel)):
            raise self.error(f"{self.arguments[0]} is not a pydantic model")
        lines = [*_indented(inspect.getdoc(model) or "", ""), ""]
        for field_name, field in model.model_fields.items():
            lines += [
                f".. py:attribute:: {name}.{field_name}",
                f"   :module: {module_name}",
                f"   :type: {stringify_annotation(field.annotation, 'fully-qualified')}",
                "",
                *(_indented(field.description) if field.description else []),
                "",
                f"   **Default**: {default(field)}.",
            ]
            said = constraints(field)
            if said:
                lines += ["", f"   **Constraints**: {', '.join(said)}."]
            lines.append("")
        return parsed(self, lines, self.arguments[0])


def parsed(directive: SphinxDirective, lines: list[str], source: str) -> list[nodes.Node]:
    """``lines`` of reStructuredText as the nodes they make, where ``directive`` stands."""
    container = nodes.container()
    directive.state.nested_parse(StringList(lines, source=source), 0, container)
    return list(container.children)


def listener_methods() -> dict[type, str]:
    """Each event type's ``Listener`` method, read from the methods' annotations."""
    from orchestrator.core.events import Listener  # noqa: PLC0415

    table: dict[type, str] = {}
    for method_name, method in vars(Listener).items():
        if inspect.isfunction(method) and not method_name.startswith("_"):
            table[typing.get_type_hints(method)["event"]] = method_name
    return table


class Events(SphinxDirective):
    """``orchestrator-events``: every type of the ``Event`` union, in its order."""

    def run(self) -> list[nodes.Node]:
        from orchestrator.core.events import Event  # noqa: PLC0415

        methods = listener_methods()
        lines: list[str] = []
        for event in typing.get_args(Event):
            method = methods[event]
            lines += [
                f".. py:class:: {event.__name__}",
                "   :module: orchestrator",
                "",
                f"   Delivered to :meth:`Listener.{method} <orchestrator.Listener.{method}>`.",
                "",
                *_indented(inspect.getdoc(event) or ""),
                "",
            ]
            hints = typing.get_type_hints(event)
            for field in dataclasses.fields(event):
                annotation = stringify_annotation(hints[field.name], "fully-qualified")
                lines += [
                    f"   .. py:attribute:: {field.name}",
                    f"      :type: {annotation}",
                    "",
                ]
        return parsed(self, lines, "orchestrator.core.events")


def metrics() -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """(name as scraped, type, labels, help) of every metric a ``PrometheusListener``
    with a document count registers."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415
    from prometheus_client.metrics import MetricWrapperBase  # noqa: PLC0415

    from orchestrator.monitoring.prometheus import PrometheusListener  # noqa: PLC0415

    def never() -> Any:
        raise AssertionError("the reference never counts documents")

    listener = PrometheusListener(CollectorRegistry(), status=never)
    for metric in vars(listener).values():
        if isinstance(metric, MetricWrapperBase):
            # prometheus_client keeps a metric's labels only as _labelnames (no public name).
            scraped = metric._name + ("_total" if metric._type == "counter" else "")
            yield scraped, str(metric._type), tuple(metric._labelnames), str(metric._documentation)
    assert listener.status is not None
    for family in listener.status.describe():
        yield family.name, str(family.type), tuple(family._labelnames), family.documentation


class Metrics(SphinxDirective):
    """``orchestrator-metrics``: one row per metric."""

    def run(self) -> list[nodes.Node]:
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 30 10 25 35",
            "",
            "   * - Metric",
            "     - Type",
            "     - Labels",
            "     - Meaning",
        ]
        for name, kind, labels, doc in metrics():
            lines += [
                f"   * - ``{name}``",
                f"     - {kind}",
                f"     - {', '.join(f'``{label}``' for label in labels) or '(none)'}",
                f"     - {doc}",
            ]
        return parsed(self, lines, "orchestrator.monitoring.prometheus")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("orchestrator-model", ModelFields)
    app.add_directive("orchestrator-events", Events)
    app.add_directive("orchestrator-metrics", Metrics)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
