"""The admin shows payloads decoded only to users with ``durable.view_payloads``; other staff see
that they are hidden; the run list and its search never decode one."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet as FernetKeys
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.urls import reverse

import durable
from durable.models import Checkpoint

pytestmark = pytest.mark.django_db

SECRET = "Pangolin-Secret-5519"
HIDDEN = "hidden (needs the durable.view_payloads permission)"


@durable.step(name="tests.admin_payloads.note")
def note(text: str) -> dict[str, str]:
    return {"noted": text}


@durable.workflow(name="tests.admin_payloads.flow")
def flow(ctx: durable.Context, given: Any) -> Any:
    noted = ctx.step(note, given["text"])
    ctx.expose("noted", noted)
    return ctx.wait_for_signal("go")


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="durable", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def encoded():
    key = FernetKeys.generate_key().decode()
    with override_settings(
        DURABLE={**settings.DURABLE, "CODEC": "durable.codecs.Fernet", "CODEC_KEYS": [key]}
    ):
        yield


def test_payloads_show_decoded_only_to_users_with_view_payloads(durable_env: Any, encoded: None) -> None:
    run_id = durable.start(flow, {"text": SECRET}).id
    durable_env.run_until_idle()
    durable.signal(run_id, "later", {"text": SECRET})
    step = Checkpoint.objects.get(run_id=run_id, kind="step")
    viewer = staff("viewer", "view_run", "view_checkpoint", "view_payloads")
    onlooker = staff("onlooker", "view_run", "view_checkpoint")
    pages = [
        reverse("admin:durable_run_change", args=[quote(run_id)]),
        reverse("admin:durable_checkpoint_change", args=[step.pk]),
    ]
    for page in pages:
        shown = viewer.get(page)
        assert shown.status_code == 200 and SECRET in shown.content.decode(), page
        hidden = onlooker.get(page)
        assert hidden.status_code == 200, page
        assert SECRET not in hidden.content.decode() and HIDDEN in hidden.content.decode(), page
    listing = onlooker.get(reverse("admin:durable_run_changelist"), {"q": SECRET})
    # The search reads ids and names, never payloads: a payload's text finds no run.
    assert listing.status_code == 200 and "0 results" in listing.content.decode()
