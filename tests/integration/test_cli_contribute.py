"""`t3ar adapt --pool DIR --contribute` end to end on small generated data: the target joins the pool folder
after the run, the next run retrieves from it (its lineage names the contributed files), a repeat adds
nothing, and deleting the folder withdraws it."""

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from test_cli_core import data  # noqa: F401 - the data fixture of the CLI tests

from t3ar.cli.main import cli
from t3ar.models.checkpoint import load_checkpoint


def _adapt(data: dict[str, Path], pool: Path, out: Path, *extra: str) -> dict[str, object]:  # noqa: F811
    res = CliRunner().invoke(cli, ["adapt", "--model", str(data["base"]), "--target", str(data["target"]), "--pool",
                                   str(pool), "--method", "t3ar", "--k", "2", "--r", "1", "--epochs", "1",
                                   "--batch-size", "8", "--retriever-image-size", "32", "--out", str(out), *extra,
                                   "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return dict(json.loads(res.stdout))


def test_target_joins_the_local_pool_and_is_retrieved_next_time(data: dict[str, Path],  # noqa: F811
                                                                tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    shutil.copytree(data["pool"], pool)
    first = _adapt(data, pool, tmp_path / "a.pt", "--contribute", "--run-id", "run-a")
    c = first["contribution"]
    assert isinstance(c, dict) and c["source"] == "target:run-a" and c["images"] == 16
    assert c["added"] + c["skipped_exact"] + c["skipped_near"] == 16 and c["added"] >= 1
    folder = pool / "target-run-a"
    assert len([p for p in folder.iterdir() if p.suffix == ".png"]) == c["added"]

    again = _adapt(data, pool, tmp_path / "a2.pt", "--contribute", "--run-id", "run-a")
    assert again["contribution"]["repeated"] is True  # type: ignore[index]
    assert len(list(folder.iterdir())) == c["added"] + 1

    _, info = load_checkpoint(tmp_path / "a2.pt")  # the same target: its own contributed copies are nearest
    assert any(p.startswith("target-run-a/") for p in info.lineage.pool_ids)

    shutil.rmtree(folder)  # withdrawn: the next run never sees it
    _adapt(data, pool, tmp_path / "b.pt")
    _, info = load_checkpoint(tmp_path / "b.pt")
    assert info.lineage.pool_ids and not any(p.startswith("target-") for p in info.lineage.pool_ids)
