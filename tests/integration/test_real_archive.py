"""A real archive style from npm (`npm pack`, pinned): Streamline Emojis, the smallest, rendered at 64 px and
labelled with emoji-datasource subcategories. About half a minute once the packages are cached, so `slow`."""

import json
import os
from pathlib import Path

import pytest

from t3ar.datakit.archive import build_archive
from t3ar.datakit.common import fetch_npm_package, slug
from t3ar.datakit.emoji import PACKAGES
from t3ar.datakit.iconify import norm_code

pytestmark = pytest.mark.slow


def test_streamline_emojis_archive_style(tmp_path: Path) -> None:
    cache = Path(os.environ.get("T3AR_CACHE_DIR", Path.home() / ".cache" / "t3ar"))
    rep = build_archive(tmp_path / "archive", cache=cache, styles=["streamline-emojis"], size=64)
    st = rep["styles"]["streamline-emojis"]
    assert st["licence"] == "CC-BY-4.0" and st["family"] == "streamline" and st["failed"] == 0
    meta = fetch_npm_package("emoji-datasource-google", PACKAGES["emoji-datasource-google"], cache)
    entries = json.loads((meta / "emoji.json").read_text())
    subcategory = {str(e["unified"]).lower(): slug(e["subcategory"]) for e in entries}
    files = sorted((tmp_path / "archive" / "streamline-emojis").glob("*/*.png"))
    assert len(files) == st["emoji"] > 300  # 378 with 1.2.4: most of its 787 icons have CLDR names
    # every image sits in the folder of its emoji's subcategory, under the emoji kit's file name
    assert all(subcategory[f.stem] == f.parent.name for f in files)
    assert len({norm_code(f.stem) for f in files}) == len(files)
    assert "grinning-face" not in json.dumps(st)  # the report is counts, not names
    assert "Streamline" in (tmp_path / "archive" / "LICENSES.md").read_text()
