"""pyproject.toml lists the packages (setuptools cannot rename what it finds: services/ installs as
``t3ar_services``): every package folder of the tree must be listed, or a wheel / container would lack it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = tool["package-dir"]
    assert dirs == {"": "shared", "t3ar_services": "services"}
    found = {".".join(p.parent.relative_to(ROOT / "shared").parts)
             for p in (ROOT / "shared" / "t3ar").rglob("__init__.py")}
    found |= {".".join(("t3ar_services", *p.parent.relative_to(ROOT / "services").parts))
              for p in (ROOT / "services").rglob("__init__.py")}
    assert sorted(found) == sorted(tool["packages"])
