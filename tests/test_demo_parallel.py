"""The demo's versions measured in worker processes: errors and log records reach the parent whole.

(The whole parallel demo runs in test_reports / test_wheel, from the wheel: ``demo_from_wheel``.)
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from weknora_nb.core.errors import Problem, RequestTimeout, ResultsError, RunLockedError, TestSetError, UsageError
from weknora_nb.demo import VersionJob, _init_worker, _worker_logging, measure_versions

from .test_progress import counts


@pytest.mark.parametrize("error", [
    UsageError(argument="--repeats", allowed=">= 1", got=0),
    TestSetError("t.jsonl", [Problem("t.jsonl", 3, "relevant", "must be an object")]),
    ResultsError("r.parquet", "no rows"),
    RequestTimeout("read timed out after 5 s", status=None, code=None),
    RunLockedError("locked", {"pid": 7}),
])
def test_every_error_pickles_as_what_it_is(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
    assert back.__dict__ == error.__dict__


def test_a_version_failing_in_a_worker_raises_its_own_error_here(tmp_path):
    jobs = [VersionJob(name, tmp_path / "t.jsonl", tmp_path / name, faq=False, judge=False, stages="final",
                       collect={"repeats": 1, "progress": False}) for name in ("no-such-version", "nor-this")]
    workers_at_before: list[int] = []
    with pytest.raises(UsageError) as err:
        measure_versions(jobs, workers=2, progress=False,
                         before=lambda: workers_at_before.append(len(multiprocessing.active_children())))
    assert workers_at_before == [2]   # ran here once, the workers already starting
    assert err.value.argument == "version" and err.value.got in {"no-such-version", "nor-this"}
    assert "baseline" in err.value.allowed
    assert not any((tmp_path / j.version).exists() for j in jobs)  # refused before anything was written


def test_a_worker_s_log_records_reach_this_process_s_handlers(caplog):
    context = multiprocessing.get_context("spawn")
    caplog.set_level(logging.INFO, logger="weknora_nb")
    with _worker_logging(context) as queue, ProcessPoolExecutor(1, mp_context=context, initializer=_init_worker,
                                                                initargs=(queue, logging.INFO)) as pool:
        pool.submit(logging.getLogger("weknora_nb.demo").info, "measured %s", "rerank").result()
        pool.submit(logging.getLogger("weknora_nb.demo").debug, "not shown").result()
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("weknora_nb.demo", logging.INFO, "measured rerank")]


def test_the_versions_bar_moves_as_each_version_ends_and_a_failure_stops_the_wait(capsys):
    import threading
    import time
    from concurrent.futures import Future

    from weknora_nb.demo import _wait_for_versions

    futures: list[Future] = [Future() for _ in range(3)]

    def finish() -> None:   # the versions end one by one, 0.1 s apart
        for f in futures:
            time.sleep(0.1)
            f.set_result(None)
    threading.Thread(target=finish).start()
    _wait_for_versions(futures, ["baseline", "rerank", "faq"], progress=True)
    lines = capsys.readouterr().err.splitlines()   # not a terminal: the bar as lines
    assert counts(lines)[:4] == ["0/3", "1/3", "2/3", "3/3"], lines
    assert lines[3].endswith("baseline, rerank, faq]")

    from concurrent.futures import ThreadPoolExecutor

    def fail() -> None:
        raise RuntimeError("version baseline failed")
    with ThreadPoolExecutor(max_workers=1) as pool:   # one at a time: faq waits its turn
        failing = [pool.submit(fail), pool.submit(time.sleep, 0.2), pool.submit(time.sleep, 0.2)]
        t = time.perf_counter()
        _wait_for_versions(failing, ["baseline", "rerank", "faq"], progress=False)
    assert failing[2].cancelled() and time.perf_counter() - t < 0.35   # the failure stopped what had not started
