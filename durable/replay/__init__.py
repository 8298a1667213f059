"""The pure replay core: a turn as a function of (workflow, input, history) -> what to do next.

Nothing in this package imports the ORM, Celery, the models, the engine or dispatch.
"""
