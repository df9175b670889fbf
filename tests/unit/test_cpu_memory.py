"""retain_freed_memory: freed large blocks are reused instead of being page-faulted in again (real glibc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "confstr"),
                           reason="glibc malloc tuning")

PROBE = textwrap.dedent("""
    import resource, threading, torch
    from t3ar.cpu_memory import retain_freed_memory
    print(retain_freed_memory())
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU6(),
                              torch.nn.Conv2d(64, 16, 3, padding=1))
    x = torch.randn(64, 16, 64, 64)  # activations of 64 MiB: far above malloc's mmap threshold
    faults = []
    def steps():
        for i in range(6):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            with torch.no_grad():
                net(x)
            if i >= 3:  # warmed up
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    t = threading.Thread(target=steps)  # the loops may run in threads (t3ar bench speed does)
    t.start(); t.join()
    print(sum(faults))
""")

def _probe(enabled: str) -> tuple[bool, int]:
    env = {**os.environ, "T3AR_CPU_RETAIN_MEMORY": enabled, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1])


@glibc
def test_freed_blocks_are_reused_in_threads_once_retained() -> None:
    on, faults_on = _probe("true")
    off, faults_off = _probe("false")
    assert on and not off
    # each pass allocates ~200 MiB of activations: without retention every page is faulted in again
    assert faults_off > 3 * 40_000
    assert faults_on * 10 < faults_off


def test_a_bad_setting_falls_back_to_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from t3ar import cpu_memory

    monkeypatch.setenv(cpu_memory.ENV, "maybe")
    assert cpu_memory._enabled() is True
    monkeypatch.setenv(cpu_memory.ENV, "off")
    assert cpu_memory._enabled() is False
