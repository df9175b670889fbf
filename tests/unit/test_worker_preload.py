"""The worker parent's preload (services/worker/preload.py): it imports what a job imports and runs no torch op,
so a work horse forked from it runs torch with several threads and finishes; a parent holding a CUDA context is
refused; the worker starts with it on and off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from t3ar_services.worker import preload as preload_mod

ROOT = Path(__file__).resolve().parents[2]

FORK_AFTER_PRELOAD = textwrap.dedent("""
    import os, sys
    from t3ar_services.worker.preload import MODULES, preload
    assert "torch" not in sys.modules
    preload()
    assert all(m in sys.modules for m in MODULES)
    import torch
    assert not torch.cuda.is_initialized()
    for _ in range(2):  # two horses in a row, as a worker forks one per job
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(2)
            x = torch.randn(256, 256)
            y = (x @ x).sum() + torch.nn.functional.conv2d(torch.randn(4, 3, 32, 32), torch.randn(8, 3, 3, 3)).sum()
            os._exit(0 if torch.isfinite(y) else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok")
""")


def test_a_horse_forked_after_the_preload_runs_torch_with_several_threads() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "shared"), str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", FORK_AFTER_PRELOAD], capture_output=True, text=True, env=env,
                         timeout=300, cwd=ROOT)  # a deadlocked child would hang: the timeout fails the test
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_parent_holding_a_cuda_context_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(preload_mod.PreloadError, match="CUDA is initialised"):
        preload_mod.check_untouched()
    with pytest.raises(preload_mod.PreloadError):
        preload_mod.preload(("os",))
    monkeypatch.setattr(fake.cuda, "is_initialized", lambda: False)
    assert preload_mod.preload(("os",)) >= 0.0


def test_the_setting_defaults_on_and_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar_services.worker.settings import WorkerSettings

    assert WorkerSettings().preload is True
    monkeypatch.setenv("T3AR_WORKER_PRELOAD", "false")
    assert WorkerSettings().preload is False
