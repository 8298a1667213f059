"""Unit tests for durable.errors: the hierarchy, pickling and the stored error shape."""

from __future__ import annotations

import pickle

import pytest

from durable import errors
from durable.errors import (
    ApplicationError,
    ChildFailed,
    DurableError,
    GatherError,
    InvalidInput,
    NonDeterminismError,
    QueueFull,
    RunCancelled,
    RunFailed,
    RunFinished,
    RunNotFound,
    StepFailed,
    Suspend,
    UpdateRejected,
    WaitTimeout,
    WorkflowNotRegistered,
    error_dict,
)

SIMPLE = [
    DurableError,
    ApplicationError,
    StepFailed,
    ChildFailed,
    WaitTimeout,
    NonDeterminismError,
    WorkflowNotRegistered,
    InvalidInput,
    QueueFull,
    UpdateRejected,
    RunNotFound,
    RunFinished,
    RunFailed,
    RunCancelled,
]


def _roundtrip(exc: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(exc))


@pytest.mark.parametrize("cls", SIMPLE, ids=lambda cls: cls.__name__)
def test_error_pickles_with_message_code_and_details(cls: type[DurableError]) -> None:
    back = _roundtrip(cls("it broke", code="broke", details={"n": [1, 2]}))
    assert type(back) is cls
    assert (back.message, back.code, back.details) == ("it broke", "broke", {"n": [1, 2]})
    assert str(back) == "it broke"


@pytest.mark.parametrize("cls", [*SIMPLE, GatherError], ids=lambda cls: cls.__name__)
def test_error_pickles_its_default_message_and_code(cls: type[DurableError]) -> None:
    exc = cls()
    back = _roundtrip(exc)
    assert (back.message, back.code) == (exc.message, exc.code)
    assert back.message


def test_gather_error_pickles_with_its_member_errors() -> None:
    first = StepFailed("card declined", code="declined", details={"n": 1})
    exc = GatherError([first, ChildFailed("child died")], message="gather failed", code="g", details=[1])
    back = _roundtrip(exc)
    assert (back.message, back.code, back.details) == ("gather failed", "g", [1])
    assert [type(e) for e in back.errors] == [StepFailed, ChildFailed]
    assert back.errors[0].code == "declined"


def test_application_error_pickles_non_retryable() -> None:
    assert _roundtrip(ApplicationError("no", non_retryable=True)).non_retryable is True


def test_step_failed_pickles_its_cause() -> None:
    cause = {"message": "m", "type": "ValueError", "code": None, "details": None}
    assert _roundtrip(StepFailed(cause=cause)).cause == cause


def test_suspend_pickles() -> None:
    assert type(_roundtrip(Suspend())) is Suspend


def test_caused_failure_carries_its_cause_message_code_and_details() -> None:
    cause = {"message": "card declined", "type": "ApplicationError", "code": "declined", "details": {"n": 1}}
    exc = StepFailed(cause=cause)
    assert (exc.message, exc.code, exc.details) == ("card declined", "declined", {"n": 1})


def test_caused_failure_explicit_fields_win_over_the_cause() -> None:
    exc = ChildFailed("child failed", code="child", cause={"message": "inner", "code": "inner"})
    assert (exc.message, exc.code) == ("child failed", "child")


def test_gather_error_takes_code_and_message_of_its_first_failure() -> None:
    exc = GatherError([StepFailed("first", code="a"), StepFailed("second", code="b")])
    assert (exc.message, exc.code) == ("first", "a")


def test_error_without_message_uses_its_docstring() -> None:
    assert RunNotFound().message == "No run has that id."


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (WaitTimeout, "timeout"),
        (NonDeterminismError, "non_determinism"),
        (WorkflowNotRegistered, "not_registered"),
        (InvalidInput, "invalid_input"),
        (QueueFull, "queue_full"),
        (UpdateRejected, "update_rejected"),
        (RunNotFound, "not_found"),
        (RunFinished, "finished"),
        (RunCancelled, "cancelled"),
        (ApplicationError, None),
    ],
)
def test_errors_have_their_default_code(cls: type[DurableError], code: str | None) -> None:
    assert cls().code == code


@pytest.mark.parametrize("cls", [*SIMPLE, GatherError], ids=lambda cls: cls.__name__)
def test_every_public_error_derives_from_durable_error(cls: type[DurableError]) -> None:
    assert issubclass(cls, DurableError)
    assert issubclass(cls, Exception)


def test_wait_timeout_is_a_timeout_error() -> None:
    assert isinstance(WaitTimeout("late"), TimeoutError)


def test_run_cancelled_is_not_a_run_failed() -> None:
    assert not issubclass(RunCancelled, RunFailed)


def test_suspend_is_not_an_exception() -> None:
    assert not issubclass(Suspend, Exception)
    assert issubclass(Suspend, BaseException)


def test_suspend_is_not_caught_by_except_exception() -> None:
    with pytest.raises(Suspend):
        try:
            raise Suspend()
        except Exception:  # noqa: BLE001 - what a workflow body might write
            pytest.fail("except Exception caught Suspend")


def test_error_dict_of_durable_error_has_the_stored_shape() -> None:
    exc = ApplicationError("out of stock", code="stock", details={"sku": "A1"})
    assert error_dict(exc) == {
        "message": "out of stock",
        "type": "ApplicationError",
        "code": "stock",
        "details": {"sku": "A1"},
    }


def test_error_dict_of_plain_exception_has_no_code_or_details() -> None:
    assert error_dict(ValueError("bad")) == {
        "message": "bad",
        "type": "ValueError",
        "code": None,
        "details": None,
    }


def test_error_dict_of_exception_without_message_uses_its_type_name() -> None:
    assert error_dict(RuntimeError())["message"] == "RuntimeError"


def test_error_dict_keeps_a_string_code_attribute_of_a_foreign_exception() -> None:
    exc = OSError("refused")
    exc.code = "ECONNREFUSED"  # type: ignore[attr-defined]
    assert error_dict(exc)["code"] == "ECONNREFUSED"


def test_error_dict_ignores_a_non_string_code_attribute() -> None:
    exc = SystemExit(3)
    assert error_dict(exc)["code"] is None


def test_cancelled_error_carries_the_reason_or_says_cancelled() -> None:
    shape = {"type": "Cancelled", "code": "cancelled", "details": None}
    assert errors.cancelled_error("stock ran out") == {"message": "stock ran out", **shape}
    assert errors.cancelled_error() == errors.cancelled_error(None) == {"message": "cancelled", **shape}


def test_step_timeout_error_is_a_stored_error_with_code_timeout() -> None:
    assert errors.step_timeout_error("step 'x' ran past its timeout of 0:00:05") == {
        "message": "step 'x' ran past its timeout of 0:00:05",
        "type": "StepTimeout",
        "code": "timeout",
        "details": None,
    }


def test_module_docstring_draws_every_public_error() -> None:
    doc = errors.__doc__ or ""
    for cls in [*SIMPLE, GatherError, Suspend]:
        assert cls.__name__ in doc
