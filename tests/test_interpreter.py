"""Interpreter settings held for a block (core/interpreter.py, issue 17): set while any block is open, restored by
the last one to close, whichever thread opens or closes it; never below what the process had."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from weknora_nb.collect import collector
from weknora_nb.core.errors import UsageError
from weknora_nb.core.interpreter import YOUNG_THRESHOLD, fewer_collections, short_switches


@pytest.fixture(autouse=True)
def _settings_kept():
    before = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.set_threshold(*before[0])
    sys.setswitchinterval(before[1])


def test_fewer_collections_raises_the_young_threshold_only_and_restores_it():
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        with fewer_collections(10_000):   # nested: what the first block set stays until the last one closes
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(20_000, 5, 7)   # a caller's own slower pace is kept
    with fewer_collections():
        assert gc.get_threshold() == (20_000, 5, 7)
    assert gc.get_threshold() == (20_000, 5, 7)


def test_short_switches_shortens_the_interval_only_and_restores_it():
    sys.setswitchinterval(0.005)
    with short_switches():
        assert sys.getswitchinterval() == pytest.approx(0.0005, rel=0.05)
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)
    sys.setswitchinterval(0.0002)   # a caller's own shorter interval is kept
    with short_switches():
        assert sys.getswitchinterval() == pytest.approx(0.0002, rel=0.05)


def test_blocks_overlapping_across_threads_restore_when_the_last_one_closes():
    gc.set_threshold(700, 10, 10)
    opened, close_other, closed = threading.Event(), threading.Event(), threading.Event()

    def other() -> None:
        with fewer_collections():
            opened.set()
            close_other.wait(10)
        closed.set()

    with fewer_collections():
        worker = threading.Thread(target=other)
        worker.start()
        assert opened.wait(10)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD   # the other thread's block is still open
    close_other.set()
    assert closed.wait(10)
    worker.join(10)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_collection_runs_with_fewer_collections_and_leaves_the_collector_as_it_was(monkeypatch):
    seen = []

    async def failing(*args, **kwargs):
        seen.append(gc.get_threshold())
        raise UsageError(argument="stages", allowed=["vector"], got="nope")

    monkeypatch.setattr(collector, "collect_async", failing)
    gc.set_threshold(700, 10, 10)
    with pytest.raises(UsageError):
        collector.collect()
    assert seen == [(YOUNG_THRESHOLD, 10, 10)] and gc.get_threshold() == (700, 10, 10)


def test_a_rendering_runs_with_fewer_collections_and_leaves_the_collector_as_it_was(monkeypatch):
    from weknora_nb.reports import render

    seen = []

    def failing() -> None:
        seen.append(gc.get_threshold())
        raise RuntimeError("stopped before any kernel")

    monkeypatch.setattr(render, "_import_before_threads", failing)
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError, match="stopped before any kernel"):
        render.render_reports([])
    assert seen == [(YOUNG_THRESHOLD, 10, 10)] and gc.get_threshold() == (700, 10, 10)
