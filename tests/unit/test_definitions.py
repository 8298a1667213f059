"""Unit tests for durable.definitions: decorators, the registry and retry policies.

The registry is global, so every workflow and step registered here has a unique name starting
with "tests.unit_" (default-name tests use this module's own dotted path).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable
from durable.definitions import Retry, Step, Workflow, registry
from durable.errors import ApplicationError, InvalidInput, WorkflowNotRegistered

# -- decorators ----------------------------------------------------------------------------


def test_step_decorator_without_parentheses_returns_a_step() -> None:
    @durable.step
    def tests_unit_bare_step(x: int) -> int:
        return x

    assert isinstance(tests_unit_bare_step, Step)


def test_step_decorator_with_parentheses_returns_a_step() -> None:
    @durable.step(name="tests.unit_paren_step", timeout="30s", heartbeat_timeout=10)
    def fn(x: int) -> int:
        return x

    assert isinstance(fn, Step)
    assert fn.name == "tests.unit_paren_step"
    assert fn.timeout == timedelta(seconds=30)
    assert fn.heartbeat_timeout == timedelta(seconds=10)
    assert registry.step("tests.unit_paren_step") is fn


def test_step_decorator_with_empty_parentheses_returns_a_step() -> None:
    @durable.step()
    def tests_unit_empty_paren_step() -> None:
        return None

    assert isinstance(tests_unit_empty_paren_step, Step)


def test_workflow_decorator_without_parentheses_returns_version_1() -> None:
    @durable.workflow
    def tests_unit_bare_workflow(ctx: durable.Context, input: object) -> object:
        return input

    assert isinstance(tests_unit_bare_workflow, Workflow)
    assert tests_unit_bare_workflow.version == "1"


def test_workflow_decorator_with_parentheses_registers_the_given_name() -> None:
    @durable.workflow(name="tests.unit_paren_workflow", version="3", timeout="1h")
    def fn(ctx: durable.Context, input: object) -> object:
        return input

    assert isinstance(fn, Workflow)
    assert fn.timeout == timedelta(hours=1)
    assert registry.workflow("tests.unit_paren_workflow") is fn


def test_default_name_outside_an_app_is_module_and_function() -> None:
    @durable.step
    def tests_unit_default_named_step() -> None:
        return None

    @durable.workflow
    def tests_unit_default_named_workflow(ctx: durable.Context, input: object) -> None:
        return None

    assert tests_unit_default_named_step.name == f"{__name__}.tests_unit_default_named_step"
    assert tests_unit_default_named_workflow.name == f"{__name__}.tests_unit_default_named_workflow"


def test_default_name_inside_an_app_is_app_label_and_function() -> None:
    def tests_unit_in_shop_app(ctx: durable.Context, input: object) -> None:
        return None

    tests_unit_in_shop_app.__module__ = "project.shop.workflows"
    wf = durable.workflow(tests_unit_in_shop_app)
    assert wf.name == "shop.tests_unit_in_shop_app"


def test_registering_same_workflow_version_with_another_function_raises_invalid_input() -> None:
    @durable.workflow(name="tests.unit_dup_workflow")
    def first(ctx: durable.Context, input: object) -> None:
        return None

    with pytest.raises(InvalidInput, match="'tests.unit_dup_workflow' version '1' is already registered"):

        @durable.workflow(name="tests.unit_dup_workflow")
        def second(ctx: durable.Context, input: object) -> None:
            return None


def test_registering_same_step_name_with_another_function_raises_invalid_input() -> None:
    @durable.step(name="tests.unit_dup_step")
    def first() -> None:
        return None

    with pytest.raises(InvalidInput, match="'tests.unit_dup_step' is already registered"):

        @durable.step(name="tests.unit_dup_step")
        def second() -> None:
            return None


def test_registering_same_name_with_another_version_keeps_both() -> None:
    @durable.workflow(name="tests.unit_two_versions", version="1")
    def v1(ctx: durable.Context, input: object) -> None:
        return None

    @durable.workflow(name="tests.unit_two_versions", version="2")
    def v2(ctx: durable.Context, input: object) -> None:
        return None

    assert registry.workflow("tests.unit_two_versions", "1") is v1
    assert registry.workflow("tests.unit_two_versions", "2") is v2


@pytest.mark.parametrize("version", ["v1", "1.", "", "1.x", 2])
def test_malformed_workflow_version_raises_invalid_input(version: object) -> None:
    with pytest.raises(InvalidInput, match="dotted integers"):
        durable.workflow(name="tests.unit_bad_version", version=version)  # type: ignore[arg-type]


def test_calling_a_step_directly_just_calls_the_function() -> None:
    @durable.step(name="tests.unit_direct_call")
    def add(a: int, b: int = 0) -> int:
        return a + b

    assert add(2, b=3) == 5
    assert add.__name__ == "add"


# -- registry lookup -----------------------------------------------------------------------


def _register_versions(name: str, versions: list[str]) -> None:
    for version in versions:
        durable.workflow(name=name, version=version)(lambda ctx, input: None)


def test_newest_version_compares_numerically_not_as_text() -> None:
    _register_versions("tests.unit_numeric_versions", ["9", "10", "2"])
    assert registry.workflow("tests.unit_numeric_versions").version == "10"


def test_newest_version_ranks_dotted_minor_above_major() -> None:
    _register_versions("tests.unit_dotted_versions", ["2", "2.1", "1.10"])
    assert registry.workflow("tests.unit_dotted_versions").version == "2.1"


def test_pinned_unknown_version_raises_naming_registered_versions() -> None:
    _register_versions("tests.unit_pinned_versions", ["10", "1", "2"])
    with pytest.raises(WorkflowNotRegistered, match=r"has no version '3' \(registered: 1, 2, 10\)"):
        registry.workflow("tests.unit_pinned_versions", "3")


def test_unknown_workflow_name_raises_workflow_not_registered() -> None:
    with pytest.raises(WorkflowNotRegistered, match="'tests.unit_never_registered'"):
        registry.workflow("tests.unit_never_registered")


def test_unknown_step_name_raises_workflow_not_registered() -> None:
    with pytest.raises(WorkflowNotRegistered, match="no step is registered as 'tests.unit_no_step'"):
        registry.step("tests.unit_no_step")


# -- Retry ---------------------------------------------------------------------------------


def test_retry_defaults_match_the_contract() -> None:
    retry = Retry()
    assert retry.max_attempts == 3
    assert retry.initial == timedelta(seconds=1)
    assert retry.backoff == 2.0
    assert retry.maximum == timedelta(minutes=5)
    assert retry.non_retryable == ()


@pytest.mark.parametrize(("attempt", "seconds"), [(1, 1), (2, 3), (3, 9), (4, 27)])
def test_retry_delay_grows_as_initial_times_backoff_power(attempt: int, seconds: float) -> None:
    retry = Retry(initial="1s", backoff=3.0, maximum="1h")
    assert retry.delay(attempt, rand=lambda: 0.0) == timedelta(seconds=seconds)


def test_retry_delay_is_capped_at_maximum() -> None:
    retry = Retry(initial="1s", backoff=2.0, maximum="10s")
    assert retry.delay(10, rand=lambda: 0.0) == timedelta(seconds=10)


def test_retry_delay_adds_at_most_20_percent_jitter() -> None:
    retry = Retry(initial="10s", backoff=2.0, maximum="5m")
    assert retry.delay(2, rand=lambda: 1.0) == timedelta(seconds=24)


def test_retry_delay_jitter_is_added_on_top_of_the_cap() -> None:
    retry = Retry(initial="1s", backoff=2.0, maximum="10s")
    assert retry.delay(10, rand=lambda: 1.0) == timedelta(seconds=12)


def test_retry_delay_with_default_randomness_stays_within_jitter_bounds() -> None:
    retry = Retry(initial="1s", backoff=2.0)
    for _ in range(50):
        assert timedelta(seconds=4) <= retry.delay(3) <= timedelta(seconds=4.8)


def test_retry_delay_for_very_late_attempt_is_capped_at_maximum() -> None:
    retry = Retry(max_attempts=5000, initial="1s", backoff=2.0, maximum="1h")
    assert retry.delay(2000, rand=lambda: 0.0) == timedelta(hours=1)


class _Declined(Exception):
    pass


class _HardDeclined(_Declined):
    pass


def test_plain_exception_is_retryable() -> None:
    assert Retry().is_retryable(ValueError("boom"))


def test_non_retryable_class_refuses_retry_for_it_and_subclasses() -> None:
    retry = Retry(non_retryable=(_Declined,))
    assert not retry.is_retryable(_Declined())
    assert not retry.is_retryable(_HardDeclined())
    assert retry.is_retryable(ValueError())


def test_non_retryable_dotted_name_refuses_retry() -> None:
    retry = Retry(non_retryable=[f"{__name__}._Declined"])
    assert not retry.is_retryable(_HardDeclined())
    assert retry.is_retryable(KeyError())


def test_non_retryable_bare_class_name_refuses_retry() -> None:
    assert not Retry(non_retryable=["KeyError"]).is_retryable(KeyError("k"))


def test_application_error_marked_non_retryable_is_not_retried() -> None:
    assert not Retry().is_retryable(ApplicationError("no", non_retryable=True))
    assert Retry().is_retryable(ApplicationError("maybe"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "counts the first attempt"),
        ({"max_attempts": 1.5}, "must be an int"),
        ({"max_attempts": True}, "must be an int"),
        ({"backoff": 0.5}, "must be a number >= 1"),
        ({"backoff": "2"}, "must be a number >= 1"),
        ({"initial": "soon"}, "Retry.initial"),
        ({"maximum": -1}, "Retry.maximum"),
        ({"initial": None}, "Retry.initial"),
    ],
)
def test_bad_retry_arguments_raise_invalid_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Retry(**kwargs)  # type: ignore[arg-type]


def test_non_retryable_given_a_bare_class_is_taken_as_one_entry() -> None:
    retry = Retry(non_retryable=ValueError)  # type: ignore[arg-type]
    assert not retry.is_retryable(ValueError())
    assert retry.is_retryable(KeyError())


def test_non_retryable_given_a_bare_string_is_taken_as_one_entry() -> None:
    retry = Retry(non_retryable="ValueError")  # type: ignore[arg-type]
    assert not retry.is_retryable(ValueError())
    assert retry.is_retryable(KeyError())


def test_step_retry_that_is_not_a_retry_raises_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="must be a durable.Retry"):

        @durable.step(name="tests.unit_bad_retry", retry={"max_attempts": 2})  # type: ignore[arg-type]
        def fn() -> None:
            return None


def test_step_bad_timeout_raises_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="step timeout"):

        @durable.step(name="tests.unit_bad_timeout", timeout="soon")
        def fn() -> None:
            return None
