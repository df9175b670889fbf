"""``t3ar.stack_process.running_up`` with stand-in commands instead of a real ``t3ar up``: a start that fails
carries its log's end, a stale stack.json is not taken for a started stack, and the process is stopped on exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from t3ar.stack_process import StackStartError, running_up, up_argv


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_command_that_exits_at_once_raises_with_the_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    log.write_text("an earlier run's line\n")
    argv = _python("import sys; print('port 8000 in use', flush=True); sys.exit(3)")
    with pytest.raises(StackStartError) as caught, running_up(tmp_path / "stack", dict(os.environ), log, argv=argv):
        pytest.fail("a stack that exited was yielded")
    assert "exited with code 3" in str(caught.value)
    assert "port 8000 in use" in caught.value.log_tail and "port 8000 in use" in str(caught.value)
    assert log.read_text().startswith("an earlier run's line\n")  # appended to, not replaced


def test_no_stack_json_before_the_deadline_raises_and_stops_the_process(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recording_popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))  # type: ignore[call-overload]
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    with pytest.raises(StackStartError, match="no stack.json after"), running_up(
            tmp_path / "stack", dict(os.environ), tmp_path / "up.log", start_timeout=0.6,
            argv=_python("import time; time.sleep(600)")):
        pytest.fail("a stack without stack.json was yielded")
    assert len(started) == 1 and started[0].returncode == -signal.SIGTERM  # stopped, not left running


def test_waits_for_a_fresh_stack_json_and_stops_the_process_on_exit(tmp_path: Path) -> None:
    data = tmp_path / "stack"
    data.mkdir()
    (data / "stack.json").write_text(json.dumps({"run": "earlier"}))  # a restart in the same data directory
    code = ("import json, pathlib, sys, time; time.sleep(0.3); "
            "pathlib.Path(sys.argv[1], 'stack.json').write_text(json.dumps({'run': 'this'})); time.sleep(600)")
    with running_up(data, dict(os.environ), tmp_path / "up.log", argv=[*_python(code), str(data)]) as (proc, info):
        assert info == {"run": "this"}
        assert proc.poll() is None
    assert proc.returncode == -signal.SIGTERM


def test_up_argv_starts_the_cli_on_free_ports(tmp_path: Path) -> None:
    argv = up_argv(tmp_path, workers=2)
    assert argv[:4] == [sys.executable, "-m", "t3ar.cli.main", "up"]
    assert argv[argv.index("--data-dir") + 1] == str(tmp_path)
    assert argv[argv.index("--api-port") + 1] == argv[argv.index("--retriever-port") + 1] == "0"
    assert argv[argv.index("--workers") + 1] == "2"
