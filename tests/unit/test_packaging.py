"""pyproject.toml lists the packages (setuptools cannot rename what it finds: services/ installs as
``t3ar_services``): every package folder of the tree must be listed, or a wheel / container would lack it. The
benchmarks (bench/t3ar_bench) are a distribution of their own (bench/pyproject.toml): the product's wheel ships
none of them."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _packages(base: Path, prefix: tuple[str, ...] = ()) -> set[str]:
    return {".".join((*prefix, *p.parent.relative_to(base).parts)) for p in base.rglob("__init__.py")}


def test_every_package_folder_is_listed() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = tool["package-dir"]
    assert dirs == {"": "shared", "t3ar_services": "services"}
    found = _packages(ROOT / "shared") | _packages(ROOT / "services", ("t3ar_services",))
    assert sorted(found) == sorted(tool["packages"])


def test_the_benchmarks_are_a_distribution_of_their_own() -> None:
    project = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())
    assert sorted(_packages(ROOT / "bench")) == sorted(project["tool"]["setuptools"]["packages"])
    assert not (ROOT / "shared" / "t3ar" / "bench").exists()
    assert project["project"]["entry-points"]["t3ar.commands"] == {"bench": "t3ar_bench.cli:bench"}
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "bench" not in root["project"]["entry-points"]["t3ar.commands"]
    assert "-e ./bench" in (ROOT / "scripts" / "setup.sh").read_text()  # installed with the dev environment
