"""Durable's runs, their histories and signals in the Django admin: read-only, steered by actions.

Add ``"durable_admin"`` to INSTALLED_APPS after ``"durable"``; the ModelAdmins live in ``admin.py``.
"""
