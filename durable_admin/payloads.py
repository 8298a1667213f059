"""Who sees payloads in the admin: decoded only for users with ``durable.view_payloads``
(payloads may hold personal data); everyone else sees that they are hidden."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest

PERMISSION = "durable.view_payloads"
HIDDEN = "hidden (needs the durable.view_payloads permission)"

# Admin display functions get no request: the view that renders them says who is looking.
_visible: ContextVar[bool] = ContextVar("durable_admin_payloads_visible", default=False)


def visible() -> bool:
    """Whether the page being rendered may show payloads (False outside such a page)."""
    return _visible.get()


@contextmanager
def viewed_by(request: HttpRequest) -> Iterator[None]:
    token = _visible.set(request.user.has_perm(PERMISSION))
    try:
        yield
    finally:
        _visible.reset(token)


def rendered(response: Any) -> Any:
    """``response`` rendered now, while the viewer is known (a TemplateResponse renders late)."""
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response
