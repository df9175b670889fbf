"""``t3ar bench speed``: its report logic, and its --json shape on a tiny prepared data file."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from t3ar_bench.speed.main import SpeedData
from t3ar_bench.speed.report import merge, verdict, write_report


def _dev(t3ar: float, noret: float) -> dict[str, object]:
    return {"ratios": {"t3ar": t3ar, "t3ar-noretrieval": noret, "adacontrast": 0.2},
            "step_s": {"supervised": 0.1, "t3ar": 0.1 / t3ar, "t3ar-noretrieval": 0.1 / noret, "adacontrast": 0.5}}


def test_verdict_checks_each_measured_goal() -> None:
    assert verdict({"devices": {"cpu": _dev(0.31, 0.75)}})["met"] is True
    v = verdict({"devices": {"cpu": _dev(0.31, 0.75), "cuda": _dev(0.45, 0.9)}})
    assert v["met"] is False
    bad = [c for c in v["checks"] if not c["met"]]
    assert [(c["device"], c["method"]) for c in bad] == [("cuda", "t3ar")]
    assert verdict({"devices": {}})["met"] is False  # nothing measured is not a pass


def test_merge_keeps_devices_not_measured_now() -> None:
    old = {"devices": {"cuda": {**_dev(0.6, 0.8), "measured_at": "earlier"}, "cpu": _dev(0.1, 0.1)}}
    new = {"devices": {"cpu": _dev(0.3, 0.7)}, "images": 64}
    out = merge(new, old)
    assert out["devices"]["cuda"]["measured_at"] == "earlier"
    assert out["devices"]["cpu"]["ratios"]["t3ar"] == 0.3 and "commit" in out["devices"]["cpu"]


def test_merge_stamps_the_commit_given_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree copied onto another machine (stale git metadata there) names the code's commit itself."""
    monkeypatch.setenv("T3AR_BENCH_COMMIT", "abc1234")
    assert merge({"devices": {"cpu": _dev(0.3, 0.7)}}, None)["devices"]["cpu"]["commit"] == "abc1234"


def test_write_report(tmp_path: Path) -> None:
    bank = {"size": 16384, "filled_at_last_step": 1272, "scan_s_at_fill": 0.002, "scan_s_full": 0.02,
            "t3ar_ratio_full_bank": 0.23}
    extra = {"bank": bank, "round_ratios": {"t3ar": [0.25, 0.27], "t3ar+separate_passes": [0.4]},
             "machine": {"load_start": 1.0, "load_end": 2.0, "steal_share": 0.12},
             "views_ahead": True, "joint_pass": True,
             "variants": {"separate_passes": {"description": "the queries apart", "step_s": {"t3ar": 0.6},
                                              "ratios": {"t3ar": 0.18}, "default_speedup": {"t3ar": 1.5}}}}
    res = {"devices": {"cpu": {**_dev(0.25, 0.6), "device_name": "cpu", "profile_t3ar_step": "TABLE",
                               "profile_t3ar_step_host": "HOSTTABLE", **extra}},
           "images": 64, "image_size": 32, "batch_size": 32, "k": 5, "rounds": 1, "distinct_pool_images": 10,
           "pool_size": 20}
    merged = write_report(res, tmp_path)
    text = (tmp_path / "speed.md").read_text()
    assert "NOT met" in text and "TABLE" in text and "by self time on the host" in text and "HOSTTABLE" in text
    assert "cuda: pending" not in text and "pending" in text
    assert "T3AR 0.25 / 0.27; T3AR, separate passes 0.40." in text and "took 12 % of this machine's CPU time" in text
    assert "one step ahead, on a background thread" in text
    assert "Variant, the queries apart, in the same rounds: T3AR 0.600 s/step (1.50x the default step's time)" in text
    assert "T3AR 0.18." in text and "(`joint_pass`, on for CUDA by default)" in text
    assert "1,272 of its 16,384 slots" in text and "20.0 ms with every slot written" in text and "**0.23**" in text
    assert json.loads((tmp_path / "speed.json").read_text())["verdict"] == merged["verdict"]


def test_cli_json_shape(tmp_path: Path) -> None:
    from t3ar.cli.main import cli

    g = torch.Generator().manual_seed(0)
    # the smallest run that still has a timed step per arm (2 steps of 8: the first of each arm is never timed);
    # the shape is what this test checks, not the figures
    data = SpeedData(target=torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=g),
                     labels=torch.arange(16) % 4, classes=["a", "b", "c", "d"],
                     neighbours=torch.randint(0, 40, (16, 5), generator=g),
                     pool_images=torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=g),
                     pool_size=40, seconds_retrieval=0.0)
    path = tmp_path / "data.pt"
    data.save(path)
    res = CliRunner().invoke(cli, ["bench", "speed", "--device", "cpu", "--data", str(path), "--rounds", "1",
                                   "--batch-size", "8", "--no-profile", "--no-write", "--json", "--views-inline",
                                   "--variant", "joint_pass"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    cpu = out["devices"]["cpu"]
    assert set(cpu["ratios"]) == {"t3ar", "t3ar-noretrieval", "adacontrast"}
    assert set(cpu["step_s"]) == {"supervised", "t3ar", "t3ar-noretrieval", "adacontrast"}
    assert all(v > 0 for v in cpu["ratios"].values())
    # --views-inline (= --variant views_inline): the same steps with views made inline, stated apart (never in the
    # ratios or approximations)
    inline = cpu["variants"]["views_inline"]
    assert set(inline["step_s"]) == {"supervised", "t3ar", "t3ar-noretrieval"}
    assert set(inline["ratios"]) == {"t3ar", "t3ar-noretrieval"}
    assert set(cpu["approximations"]) == {"t3ar+cpu_bf16_nograd"}
    # --variant joint_pass: the T3AR family with its queries in the no-gradient pass, beside the default step
    joint = cpu["variants"]["joint_pass"]
    assert set(joint["step_s"]) == {"t3ar", "t3ar-noretrieval"} == set(joint["ratios"]) == set(joint["default_speedup"])
    assert all(v > 0 for v in joint["ratios"].values())
