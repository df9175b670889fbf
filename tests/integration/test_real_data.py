"""Real data, real pretrained weights, on CPU: a source model trained on one emoji style, adapted to
another with T3AR (pool: a third style), must beat source-only on the target. Minutes, so `slow`."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from t3ar.cli.main import cli
from t3ar.datakit.emoji import build_emoji

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def emoji() -> Path:
    """Google (source), Twitter (target) and OpenMoji line-art (pool), 10 emoji categories, 64 px."""
    cache = Path(os.environ.get("T3AR_CACHE_DIR", Path.home() / ".cache" / "t3ar"))
    out = REPO / ".cache" / "testdata" / "emoji-cat"
    build_emoji(out, cache=cache, styles=("google", "twitter", "openmoji-black"), label="category", size=64)
    return out


def _run(*args: str) -> dict[str, object]:
    res = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_t3ar_beats_source_only_on_a_real_style_shift(emoji: Path, tmp_path: Path) -> None:
    src = _run("train-source", "--data", str(emoji / "google"), "--image-size", "64", "--epochs", "4",
               "--out", str(tmp_path / "source.pt"))
    assert float(src["val"]["top1"]) > 0.5  # type: ignore[index]  # 10 classes: chance is 0.1
    before = _run("evaluate", "--model", str(tmp_path / "source.pt"), "--data", str(emoji / "twitter"))
    res = _run("adapt", "--model", str(tmp_path / "source.pt"), "--target", str(emoji / "twitter"),
               "--pool", str(emoji / "openmoji-black"), "--method", "t3ar", "--k", "2", "--fraction", "0.5",
               "--epochs", "2", "--retriever-image-size", "64", "--out", str(tmp_path / "t3ar.pt"))
    after = _run("evaluate", "--model", str(tmp_path / "t3ar.pt"), "--data", str(emoji / "twitter"))
    print(f"source-only {before['top1']:.4f} -> t3ar {after['top1']:.4f}; "
          f"{res['seconds_per_epoch']} s/epoch; pool images used {res['pool_ids_used']}")
    assert res["before"]["top1"] == pytest.approx(before["top1"])  # type: ignore[index]
    assert float(after["top1"]) > float(before["top1"]) + 0.01  # type: ignore[arg-type]
    assert int(res["pool_ids_used"]) > 0  # type: ignore[call-overload]
