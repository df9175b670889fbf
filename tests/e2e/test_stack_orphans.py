"""Issue 29 F10: `t3ar up` killed with SIGKILL takes its Redis, retriever, API and workers with it (a parent-death
signal), and `t3ar up` refuses a data directory whose earlier stack still runs. Own stacks (not the session's),
hence slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from stack_helpers import ROOT, inherited_path

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT), *inherited_path()]),
                T3AR_RETRIEVER_EMBEDDER="none", T3AR_RETRIEVER_VECTOR_DIM="8",
                T3AR_RETRIEVER_VECTOR_IDENTITY="synthetic", T3AR_WORKER_TORCH_THREADS="1")


def _up(data: Path, log: str) -> subprocess.Popen[bytes]:
    with open(data.parent / log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "t3ar.cli.main", "up", "--data-dir", str(data), "--api-port",
                                 "0", "--retriever-port", "0", "--workers", "1"], env=_env(), stdout=out,
                                stderr=subprocess.STDOUT, cwd=ROOT)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_up(proc: subprocess.Popen[bytes], data: Path, log: str) -> dict[str, int]:
    deadline = time.monotonic() + 300
    while not (data / "stack.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (data.parent / log).read_text()[-4000:]
        time.sleep(0.5)
    return dict(json.loads((data / "stack.json").read_text())["pids"])


@pytest.fixture()
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()


def test_kill_9_of_up_takes_the_stack_with_it_and_a_new_up_starts(tmp_path: Path,
                                                                   procs: list[subprocess.Popen[bytes]]) -> None:
    data = tmp_path / "stack"
    first = _up(data, "first.log")
    procs.append(first)
    pids = _wait_up(first, data, "first.log")
    assert set(pids) == {"redis", "retriever", "api", "worker-1"} and all(_alive(p) for p in pids.values())
    first.kill()  # SIGKILL: no clean-up of its own runs
    first.wait()
    deadline = time.monotonic() + 90
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [n for n, p in pids.items() if _alive(p)], "children outlived `t3ar up`"
    second = _up(data, "second.log")  # the stale stack.json names dead processes only: it starts
    procs.append(second)
    deadline = time.monotonic() + 300
    while (again := dict(json.loads((data / "stack.json").read_text())["pids"])) == pids:
        assert second.poll() is None and time.monotonic() < deadline, (tmp_path / "second.log").read_text()[-4000:]
        time.sleep(0.5)
    assert set(again) == set(pids) and all(_alive(p) for p in again.values())


def test_up_refuses_a_directory_whose_earlier_stack_still_runs(tmp_path: Path,
                                                               procs: list[subprocess.Popen[bytes]]) -> None:
    """An earlier stack's retriever still serving <data>/retriever (e.g. started by an older t3ar without the
    parent-death signal): the new `t3ar up` starts nothing and names its pid."""
    data = tmp_path / "stack"
    code = ("import sys, time; from pathlib import Path; from t3ar_services.common.dirlock import DataDirLock; "
            "DataDirLock(Path(sys.argv[1]), 'x').acquire(); print('locked', flush=True); time.sleep(300)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(data / "retriever")], stdout=subprocess.PIPE,
                              env=_env(), cwd=ROOT)
    procs.append(holder)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
    up = _up(data, "up.log")
    assert up.wait(60) != 0
    out = (tmp_path / "up.log").read_text()
    assert f"pid {holder.pid}" in out and "still serves" in out, out
    assert not (data / "stack.json").exists() and not (data / "logs" / "redis.log").exists()
