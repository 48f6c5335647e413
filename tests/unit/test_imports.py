"""train/imports.py: the collector is off inside `without_gc`, back on after it (also when the
import fails), and what was alive is frozen, so later collections skip it."""

from __future__ import annotations

import gc

import pytest

from train.imports import without_gc


@pytest.fixture(autouse=True)
def restore_gc():
    yield
    gc.unfreeze()
    gc.enable()


def test_the_collector_is_off_inside_and_on_after_with_the_imports_frozen():
    gc.unfreeze()
    assert gc.isenabled()
    with without_gc():
        assert not gc.isenabled()
        loaded = [object() for _ in range(100)]  # stands in for what an import creates
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert loaded


def test_a_failed_import_turns_the_collector_back_on():
    with pytest.raises(ModuleNotFoundError):
        with without_gc():
            import hpcdp_no_such_module  # noqa: F401
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with without_gc():
        pass
    assert not gc.isenabled()
