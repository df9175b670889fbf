"""Issue 29 F10 (and F6), the parts: one process per data directory (a flock naming its holder), and children that
die with their parent (a parent-death signal), with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t3ar_services.common.dirlock import DataDirBusyError, DataDirLock, holder

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_one_holder_per_data_directory_named_by_pid(tmp_path: Path) -> None:
    assert holder(tmp_path / "pool") is None
    first = DataDirLock(tmp_path / "pool", "the retriever").acquire()
    assert holder(tmp_path / "pool") == os.getpid()
    with pytest.raises(DataDirBusyError, match=f"in use by process {os.getpid()}") as err:
        DataDirLock(tmp_path / "pool", "the retriever").acquire()
    assert err.value.pid == os.getpid()
    first.release()
    assert holder(tmp_path / "pool") is None
    DataDirLock(tmp_path / "pool", "the retriever").acquire().release()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from t3ar_services.common.dirlock import DataDirLock; "
            "DataDirLock(Path(sys.argv[1]), 'x').acquire(); print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "d")], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"locked"
    assert holder(tmp_path / "d") == proc.pid
    with pytest.raises(DataDirBusyError, match=str(proc.pid)):
        DataDirLock(tmp_path / "d", "x").acquire()
    proc.kill()
    proc.wait()
    DataDirLock(tmp_path / "d", "x").acquire().release()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_child_dies_with_its_parent(tmp_path: Path, sig: int) -> None:
    """The parent starts a child the way `t3ar up` does and is killed with SIGKILL: the child goes too."""
    code = ("import subprocess, sys, time; from t3ar_services.common.lifeline import child_preexec; "
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True, "
            f"preexec_fn=child_preexec({int(sig)})); print(c.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the child outlived its parent"
