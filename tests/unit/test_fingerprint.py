"""`t3ar.fingerprint` and the demo's use of it: a cached source model is reused only when everything its
weights depend on (data, code, libraries, torch threads, CPU ISA, training options) is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from t3ar import fingerprint as fp

REPO = Path(__file__).resolve().parents[2]
RUNTIME = {"threads": 1, "cpu_capability": "AVX2", "machine": "x86_64"}
LIBS = {"torch": "2.14.1", "pillow": "13.0.0"}


def _data(root: Path) -> Path:
    for cls, names in {"cat": ["b.png", "a.png"], "dog": ["c.png"]}.items():
        (root / cls).mkdir(parents=True)
        for n in names:
            (root / cls / n).write_bytes(f"{cls}/{n}".encode())
    return root


def _record(data: Path, **kw: Any) -> dict[str, Any]:
    args = kw.pop("args", ["--epochs", "8"])
    return fp.training_fingerprint(data, args, runtime=kw.pop("runtime", RUNTIME),
                                   libraries=kw.pop("libraries", LIBS), code=kw.pop("code", "c0"))


def test_files_digest_ignores_listing_order_and_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _data(tmp_path / "a")
    b = _data(tmp_path / "elsewhere" / "b")
    d = fp.files_digest(a)
    assert fp.files_digest(b) == d
    real = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, pat: reversed(list(real(self, pat))))
    assert fp.files_digest(a) == d
    monkeypatch.undo()
    (a / "dog" / "c.png").write_bytes(b"changed")
    assert fp.files_digest(a) != d
    (a / "dog" / "c.png").write_bytes(b"dog/c.png")
    (a / "dog" / "c.png").rename(a / "cat" / "c.png")  # same bytes, other class: other data
    assert fp.files_digest(a) != d


@pytest.mark.parametrize("change", [
    {"runtime": {**RUNTIME, "threads": 2}},
    {"runtime": {**RUNTIME, "cpu_capability": "AVX512"}},
    {"libraries": {**LIBS, "torch": "2.15.0"}},
    {"code": "c1"},
    {"args": ["--epochs", "9"]},
])
def test_digest_changes_with_every_input(tmp_path: Path, change: dict[str, Any]) -> None:
    data = _data(tmp_path / "d")
    base = fp.fingerprint_digest(_record(data))
    assert fp.fingerprint_digest(_record(data)) == base
    assert fp.fingerprint_digest(_record(data, **change)) != base


def test_code_digest_covers_the_training_code_only(tmp_path: Path) -> None:
    pkg = tmp_path / "t3ar"
    for rel in ("method/adapt.py", "models/classifier.py", "data/images.py", "device.py", "cli/main.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(f"# {rel}\n")
    d = fp.code_digest(pkg)
    (pkg / "cli" / "main.py").write_text("# changed\n")
    (pkg / "method" / "__pycache__").mkdir()
    (pkg / "method" / "__pycache__" / "adapt.cpython-311.pyc").write_bytes(b"\0")
    assert fp.code_digest(pkg) == d
    (pkg / "method" / "adapt.py").write_text("# changed\n")
    assert fp.code_digest(pkg) != d


def test_main_prints_the_record_with_its_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _data(tmp_path / "d")
    assert fp.main([str(data), "--epochs", "8"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["args"] == ["--epochs", "8"] and record["digest"] == fp.fingerprint_digest(record)
    assert {"threads", "cpu_capability"} <= set(record["runtime"]) and "torch" in record["libraries"]


def _demo_block(start: str, end: str) -> str:
    lines = (REPO / "scripts" / "demo.sh").read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(f'step "{start}'))
    j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith(f'step "{end}'))
    return "\n".join(lines[i + 1:j])


def test_demo_retrains_the_source_model_when_its_inputs_change(tmp_path: Path) -> None:
    """The demo's source-model step, with a stub trainer: reuse on identical inputs, retrain on other threads."""
    d = tmp_path / "demo"
    _data(d / "emoji" / "google")
    trainer = tmp_path / "t3ar"
    trainer.write_text('#!/usr/bin/env bash\n# stub train-source: --out FILE\n'
                       'while [ $# -gt 0 ]; do [ "$1" = --out ] && echo "model" >"$2"; shift; done\n'
                       'echo trained >>"$(dirname "$0")/calls"\n')
    trainer.chmod(0o755)
    script = "set -euo pipefail\n" + _demo_block("source model", "target")

    def run(threads: str) -> str:
        env = {**os.environ, "OMP_NUM_THREADS": threads, "T": str(trainer), "PY": sys.executable, "D": str(d),
               "DEVICE": "cpu", "PYTHONPATH": str(REPO / "shared")}
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr

    calls = tmp_path / "calls"
    run("1")
    assert calls.read_text().count("trained") == 1 and (d / "source.pt").is_file()
    assert json.loads((d / "source.json").read_text())["runtime"]["threads"] == 1
    assert "reusing" in run("1") and calls.read_text().count("trained") == 1
    assert "retraining" in run("2") and calls.read_text().count("trained") == 2
    assert json.loads((d / "source.json").read_text())["runtime"]["threads"] == 2
    (d / "emoji" / "google" / "dog" / "c.png").write_bytes(b"new data")
    assert "retraining" in run("2") and calls.read_text().count("trained") == 3


def test_demo_pins_threads_and_device_for_every_process_and_starts_a_fresh_stack() -> None:
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert "T3AR_WORKER_TORCH_THREADS=$OMP_NUM_THREADS" in demo
    assert "export T3AR_WORKER_DEVICE=$DEVICE" in demo
    assert demo.count('--device "$DEVICE"') == 3  # train-source (in TRAIN_ARGS) and both evaluations
    up = demo.index('"$T" up ')
    assert 'rm -rf "$D/stack"' in demo[:up]


def test_the_cpu_model_is_the_vendor_and_model_name(tmp_path: Path) -> None:
    from t3ar.fingerprint import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
                    "processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert cpu_model(info) == "AuthenticAMD AMD EPYC 9654 96-Core Processor"
    assert cpu_model(tmp_path / "absent")  # platform.processor() or "unknown": never empty
