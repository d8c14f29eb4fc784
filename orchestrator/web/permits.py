"""Who may act on the page and its JSON API: every action either can take (``WebAction``),
and the one decision of whether a request may take it (``Permission``), from the
mounting application's ``permit`` or the ``read_only`` shorthand of ``operator_app``.

Where the application says nothing, the page is read-only: it shows everything and
offers no action, and every action's POST is refused (403). A page that can act is one
the application chose to let act, for the users it chose; a page mounted without a
thought, or reached past an authentication that only checks who someone is, lets them
look, never unlock, retry or cancel. ``orchestrator web``, which serves the page alone
on loopback for the operator who runs it, grants every action unless ``--read-only``.

The page asks the permission once per page it draws (to show only the actions
permitted) and again when an action is posted; the route decides nothing itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from starlette.requests import Request

from orchestrator.core.errors import ConfigError
from orchestrator.operations import Action

__all__ = ["Permission", "Permit", "WebAction", "permission"]


class WebAction(StrEnum):
    """Every action the operator's page and its JSON API can take, as a ``permit`` is
    asked about it: one document's, every document of a filter's (``*_all``), a pause's
    and a schedule's."""

    RETRY = "retry"
    UNLOCK = "unlock"
    CANCEL = "cancel"
    SIGNAL = "signal"
    RETRY_ALL = "retry_all"
    UNLOCK_ALL = "unlock_all"
    CANCEL_ALL = "cancel_all"
    PAUSE = "pause"
    RESUME = "resume"
    PAUSE_SCHEDULE = "pause_schedule"
    RESUME_SCHEDULE = "resume_schedule"
    TRIGGER_SCHEDULE = "trigger_schedule"
    BACKFILL_SCHEDULE = "backfill_schedule"

    @classmethod
    def one(cls, action: Action) -> WebAction:
        """``action`` of one document."""
        return cls(action.value)

    @classmethod
    def every(cls, action: Action) -> WebAction:
        """``action`` of every document a filter selects."""
        return cls(f"{action.value}_all")

    @classmethod
    def schedule(cls, verb: str) -> WebAction:
        """``verb`` (pause, resume, trigger, backfill) of a schedule."""
        return cls(f"{verb}_schedule")


Permit = Callable[[Request, WebAction], bool | Awaitable[bool]]
"""Whether the request's user may take the action: the mounting application's rule
(``operator_app(permit=...)``), sync or async; only ``True`` grants."""


@dataclass(frozen=True)
class Permission:
    """Who may act: ``permit``'s answer per request and action (None: nobody)."""

    permit: Permit | None

    async def allows(self, request: Request, action: WebAction) -> bool:
        if self.permit is None:
            return False
        answer = self.permit(request, action)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer is True

    async def granted(self, request: Request) -> frozenset[str]:
        """The actions the request may take, by value (what the templates test)."""
        return frozenset([a.value for a in WebAction if await self.allows(request, a)])


def _everyone(request: Request, action: WebAction) -> bool:
    return True


def permission(permit: Permit | None, read_only: bool | None) -> Permission:
    """``operator_app``'s ``permit`` and ``read_only`` as one ``Permission``: ``permit``
    decides when given; else ``read_only=False`` lets everyone act, and anything else
    (``True``, or nothing said) no one."""
    if permit is not None and read_only is not None:
        raise ConfigError("give permit or read_only, not both: permit decides who may act")
    if permit is not None and not callable(permit):
        raise ConfigError("permit is a function of the request and a WebAction returning a bool")
    if read_only is not None and not isinstance(read_only, bool):
        raise ConfigError(f"read_only is True or False, not {read_only!r}")
    if permit is None:
        permit = _everyone if read_only is False else None
    return Permission(permit)
