"""The run page's buttons: retry, cancel (with compensation or not), resume now, send a signal or
an update, fork from a position. Each is a POST behind its own permission, and each goes through
durable's public API.

A user without the permission sees no button, and a POST forged to the URL is refused with 403
before anything is read or written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.http import require_POST

import durable
from durable import conf, values
from durable.definitions import registry
from durable.engine import redispatch
from durable.errors import InvalidInput
from durable.models import RETRYABLE, Checkpoint, Run
from durable.statuses import MESSAGE_WAITS, TERMINAL, UNFINISHED, CheckpointStatus

#: Each button: the permission it needs (``durable.<codename>``) and the run statuses it applies to.
BUTTONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "retry": ("retry_run", RETRYABLE),
    "cancel": ("cancel_run", UNFINISHED),
    "compensate": ("cancel_run", UNFINISHED),
    "resume": ("resume_run", UNFINISHED),
    "send": ("signal_run", UNFINISHED),
    "fork": ("fork_run", (*UNFINISHED, *TERMINAL)),
}


def allowed(request: HttpRequest, button: str) -> bool:
    codename, _ = BUTTONS[button]
    return request.user.has_perm(f"{Run._meta.app_label}.{codename}")


def buttons_for(request: HttpRequest, run: Run) -> list[str]:
    """The buttons this user may press on this run, in the order the page shows them."""
    return [
        name for name, (_, statuses) in BUTTONS.items() if run.status in statuses and allowed(request, name)
    ]


class SendForm(forms.Form):
    """A signal or an update: its name, and its payload as JSON."""

    kind = forms.ChoiceField(
        choices=[("signal", "signal"), ("update", "update (vetted by the workflow's validator)")],
        initial="signal",
        widget=forms.RadioSelect,
    )
    name = forms.CharField(
        max_length=255,
        help_text="The name the workflow waits for.",
        widget=forms.TextInput(attrs={"list": "awaited-names", "class": "vTextField"}),
    )
    payload = forms.CharField(
        required=False,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "class": "vLargeTextField"}),
        help_text='JSON, e.g. {"approved": true}; empty sends null.',
    )
    idempotency_key = forms.CharField(
        max_length=255,
        required=False,
        help_text="Optional: the same key again for this run is dropped.",
    )

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"]
        if not text:
            return None
        try:
            return values.parse_json(text, "the payload")
        except InvalidInput as exc:
            said = str(exc)
            raise forms.ValidationError(f"{said[:1].upper()}{said[1:]}: fix it or leave it empty.") from None


class ForkForm(forms.Form):
    """Where the fork runs on from, and its id."""

    at = forms.TypedChoiceField(
        coerce=int,
        label="Run on from",
        help_text="The positions before it are copied (their steps do not run again); only positions "
        "with every one before them settled are offered.",
    )
    run_id = forms.CharField(
        max_length=255, required=False, label="Fork's run id", help_text="Optional: empty gives a new id."
    )

    def __init__(self, *args: Any, positions: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["at"].choices = positions


class RunActions:
    """Mixed into RunAdmin: the URLs and views of the run page's buttons."""

    admin_site: admin.AdminSite
    message_user: Callable[..., None]
    log_change: Callable[..., Any]

    def action_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/retry/", wrap(require_POST(self.retry_view)), name="durable_run_retry"),
            path("<path:object_id>/cancel/", wrap(require_POST(self.cancel_view)), name="durable_run_cancel"),
            path(
                "<path:object_id>/compensate/",
                wrap(require_POST(self.compensate_view)),
                name="durable_run_compensate",
            ),
            path("<path:object_id>/resume/", wrap(require_POST(self.resume_view)), name="durable_run_resume"),
            path("<path:object_id>/send/", wrap(self.send_view), name="durable_run_send"),
            path("<path:object_id>/fork/", wrap(self.fork_view), name="durable_run_fork"),
        ]

    def _run(self, request: HttpRequest, object_id: str, button: str) -> Run:
        if not allowed(request, button):
            raise PermissionDenied(f"you lack the permission durable.{BUTTONS[button][0]}")
        return get_object_or_404(Run.objects.using(conf.get().DATABASE), pk=unquote(object_id))

    def _back(self, run: Run) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:durable_run_change", args=[quote(run.pk)]))

    def _done(self, request: HttpRequest, run: Run, said: str, level: int = messages.SUCCESS) -> None:
        self.message_user(request, said, level)
        if level == messages.SUCCESS:
            self.log_change(request, run, said)

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run(request, object_id, "retry")
        try:
            durable.retry(run.pk)
        except durable.DurableError as exc:
            self._done(request, run, f"Not retried: {exc}", messages.ERROR)
        else:
            self._done(request, run, "Retried: the run goes on from where it stopped.")
        return self._back(run)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._cancel(request, self._run(request, object_id, "cancel"), compensate=False)

    def compensate_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._cancel(request, self._run(request, object_id, "compensate"), compensate=True)

    def _cancel(self, request: HttpRequest, run: Run, *, compensate: bool) -> HttpResponse:
        if request.POST.get("confirmed") != "yes":
            # The button only asks: a cancel cannot be taken back, so it takes a second POST.
            context = {
                **self.admin_site.each_context(request),
                "title": f"Cancel run {run.pk}?",
                "action": "Cancel with compensation" if compensate else "Cancel",
                "compensate": compensate,
                "opts": Run._meta,
                "original": run,
                "change_url": reverse("admin:durable_run_change", args=[quote(run.pk)]),
            }
            return TemplateResponse(request, "admin/durable/run/cancel_confirm.html", context)
        # Stored as the run's error message: who cancelled it stays visible on the run.
        reason = f"cancelled in the admin by {request.user.get_username() or 'an anonymous user'}"
        try:
            cancelled = durable.cancel(run.pk, compensate=compensate, reason=reason)
        except durable.DurableError as exc:
            self._done(request, run, f"Not cancelled: {exc}", messages.ERROR)
            return self._back(run)
        if not cancelled:
            self._done(request, run, "The run had already finished; left as it was.", messages.WARNING)
        elif compensate:
            self._done(
                request, run, "Cancel with compensation requested: its next turn undoes the done steps."
            )
        else:
            self._done(request, run, "Cancelled.")
        return self._back(run)

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run(request, object_id, "resume")
        if run.status not in UNFINISHED:
            self._done(request, run, f"The run is {run.status}: there is nothing to wake.", messages.WARNING)
            return self._back(run)
        # A wake sends the run a turn now: a timer or backoff it waits on is looked at again, and
        # a step attempt sent and never taken (its message lost) goes out again.
        resent = redispatch.redispatch([run.pk])
        again = (
            f"; {resent} step attempt{'s' if resent != 1 else ''} never taken sent again" if resent else ""
        )
        self._done(request, run, f"Woken: a turn was sent to the run now{again}.")
        return self._back(run)

    def send_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run(request, object_id, "send")
        awaited = _awaited_names(run)
        form = SendForm(request.POST or None, initial={"name": awaited[0] if awaited else ""})
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                said = _send(run, data)
            except durable.DurableError as exc:
                form.add_error("payload" if isinstance(exc, durable.UpdateRejected) else None, str(exc))
            else:
                self._done(request, run, said)
                return self._back(run)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Send a signal or an update to {run.pk}",
            "opts": Run._meta,
            "original": run,
            "form": form,
            "awaited": awaited,
            "validated": sorted(_validators(run)),
            "change_url": reverse("admin:durable_run_change", args=[quote(run.pk)]),
        }
        return TemplateResponse(request, "admin/durable/run/send.html", context)

    def fork_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        run = self._run(request, object_id, "fork")
        positions, suggested = _forkable(run)
        wanted = request.GET.get("at")
        initial = {"at": int(wanted) if wanted and wanted.isdigit() else suggested}
        form = ForkForm(request.POST or None, initial=initial, positions=positions)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                forked = durable.fork(run.pk, at=data["at"], run_id=data["run_id"] or None)
            except durable.DurableError as exc:
                form.add_error("run_id" if "run id" in str(exc) or "run_id" in str(exc) else None, str(exc))
            else:
                self._done(request, run, f"Forked at position {data['at']}: run {forked.id}.")
                return HttpResponseRedirect(reverse("admin:durable_run_change", args=[quote(forked.id)]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Fork run {run.pk}",
            "opts": Run._meta,
            "original": run,
            "form": form,
            "change_url": reverse("admin:durable_run_change", args=[quote(run.pk)]),
        }
        return TemplateResponse(request, "admin/durable/run/fork.html", context)


def _forkable(run: Run) -> tuple[list[tuple[int, str]], int]:
    """The positions a fork may run on from (each with every one before it settled), labelled,
    and the one to suggest: the first failed position, else the last offered."""
    rows = Checkpoint.objects.using(conf.get().DATABASE).filter(run=run).order_by("seq")
    choices: list[tuple[int, str]] = []
    failed: int | None = None
    # Read whole (a fork names a position of these anyway), not by a server-side cursor, which
    # does not survive a pooler in transaction mode.
    for seq, kind, name, status in rows.values_list("seq", "kind", "name", "status"):
        choices.append((seq, f"{seq}: {kind} {name} ({status})"))
        if status == CheckpointStatus.FAILED and failed is None:
            failed = seq
        if status == CheckpointStatus.PENDING:
            break  # a fork past it would run it again
    else:
        end = choices[-1][0] + 1 if choices else 0
        choices.append((end, f"{end}: after the last position"))
    return choices, failed if failed is not None else choices[-1][0]


def _send(run: Run, data: dict[str, Any]) -> str:
    payload, key = data["payload"], data["idempotency_key"] or None
    shown = json.dumps(payload, ensure_ascii=False)
    if data["kind"] == "update":
        update_id = durable.update(run.pk, data["name"], payload, idempotency_key=key)
        return f"Update {data['name']!r} sent ({update_id}) with {shown}."
    durable.signal(run.pk, data["name"], payload, idempotency_key=key)
    return f"Signal {data['name']!r} sent with {shown}."


def _awaited_names(run: Run) -> list[str]:
    """Names of the signals and updates the run waits for now."""
    rows = Checkpoint.objects.using(conf.get().DATABASE).filter(
        run=run, status=CheckpointStatus.PENDING, kind__in=MESSAGE_WAITS
    )
    names: list[str] = []
    for name in rows.values_list("name", flat=True)[:20]:
        # A wait for any of several signals keeps their names joined by "|".
        names += [part for part in name.split("|") if part and part not in names]
    return names


def _validators(run: Run) -> set[str]:
    try:
        return set(registry.workflow(run.workflow, run.version).validators)
    except durable.DurableError:
        return set()
