"""Upgrading keeps what operators set up: the rename of the schedule row keeps its table and the
admin permissions granted on it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from durable.models import CronSchedule


@pytest.mark.django_db(transaction=True)
def test_a_group_allowed_to_view_schedules_still_may_after_the_rename() -> None:
    call_command("migrate", "durable", "0009_attempt_holds", verbosity=0)
    try:
        # As on a database that never had the new model: only the old content type and grants.
        ContentType.objects.filter(app_label="durable", model="cronschedule").delete()
        old = ContentType.objects.get(app_label="durable", model="schedule")
        ops = Group.objects.create(name="ops")
        ops.permissions.add(Permission.objects.get(content_type=old, codename="view_schedule"))
        alice = User.objects.create(username="alice", is_staff=True)
        alice.groups.add(ops)
    finally:
        call_command("migrate", "durable", verbosity=0)

    assert CronSchedule._meta.db_table == "durable_schedule"
    assert "durable_schedule" in connection.introspection.table_names()
    assert ContentType.objects.get(id=old.id).model == "cronschedule"
    assert set(ops.permissions.values_list("codename", flat=True)) == {"view_cronschedule"}
    assert User.objects.get(username="alice").has_perm("durable.view_cronschedule")
