"""A background sweep: a daemon thread that calls ``run_pending`` every ``interval`` seconds, or at once when woken
(:meth:`Sweeper.wake`), until stopped. The contributor (contributions.py) and the MLflow registrar
(modelreg/registrar.py) sweep their pending work this way."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Sweeper:
    """Start, wake and stop of a sweep thread; a subclass names the thread (``thread_name``), what a failed sweep
    logs (``sweep_what``), whether the first sweep runs at once or after the first interval (``sweep_first``) and
    how long :meth:`stop` waits for a sweep under way (``join_timeout``)."""

    thread_name: str
    sweep_what: str
    sweep_first: bool
    join_timeout: float

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_pending(self) -> int:
        """One sweep; how many pending items it handled."""
        raise NotImplementedError

    def start(self, interval: float) -> None:
        def loop() -> None:
            first = self.sweep_first
            while not self._stop.is_set():
                if not first:
                    self._wake.wait(interval)
                    self._wake.clear()
                    if self._stop.is_set():
                        return
                first = False
                try:
                    self.run_pending()
                except Exception:
                    log.exception("%s sweep failed; retried at the next one", self.sweep_what)

        self._thread = threading.Thread(target=loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)

    def wake(self) -> None:
        self._wake.set()
