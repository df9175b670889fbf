"""The background sweep the contributor and the MLflow registrar share (t3ar_services.api.sweeper.Sweeper): the
first sweep at once or only when woken, a failed sweep logged and the next one still run, stop ends the thread."""

import threading

from t3ar_services.api.sweeper import Sweeper


class Counting(Sweeper):
    thread_name = "test-sweeper"
    sweep_what = "test"
    join_timeout = 10.0

    def __init__(self, first: bool, fail_first: bool = False) -> None:
        super().__init__()
        self.sweep_first = first
        self.fail_first = fail_first
        self.calls = 0
        self.swept = threading.Event()

    def run_pending(self) -> int:
        self.calls += 1
        if self.fail_first and self.calls == 1:
            raise RuntimeError("boom")
        self.swept.set()
        return 0


def test_the_first_sweep_runs_at_once_when_asked() -> None:
    s = Counting(first=True)
    s.start(interval=3600)
    assert s.swept.wait(10)
    s.stop()
    assert s._thread is not None and not s._thread.is_alive() and s.calls == 1


def test_otherwise_the_first_sweep_waits_to_be_woken_and_a_failed_one_is_retried() -> None:
    s = Counting(first=False, fail_first=True)
    s.start(interval=3600)
    assert not s.swept.wait(0.2) and s.calls == 0
    s.wake()  # this sweep fails (logged), the loop goes on
    s.wake()
    while not s.swept.is_set():
        s.wake()
        s.swept.wait(0.05)
    s.stop()
    assert s._thread is not None and not s._thread.is_alive() and s.calls >= 2


def test_stop_before_any_sweep_ends_the_thread_without_one() -> None:
    s = Counting(first=False)
    s.start(interval=3600)
    s.stop()
    assert s._thread is not None and not s._thread.is_alive() and s.calls == 0
