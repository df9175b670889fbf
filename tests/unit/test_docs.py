"""The documentation stays true to the repository: the README is short and names CI's test command, every
relative link in the README, ``docs/*.md`` and the services' READMEs resolves (file and heading), and every
``T3AR_*`` environment variable the code reads is in ``docs/configuration.md``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 400  # issue 34 item 7: a README a newcomer reads in one sitting

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#+ (.*)$", re.M)
_ENV = re.compile(r"\bT3AR_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("services/*/README.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, link targets dropped, punctuation but ``-``/``_`` removed,
    spaces to hyphens."""
    text = re.sub(r"\]\([^)]*\)", "]", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in _HEADING.findall(_FENCE.sub("", path.read_text()))}


def _links(path: Path) -> list[str]:
    return [t for t in _LINK.findall(_FENCE.sub("", path.read_text())) if not re.match(r"[a-z]+:", t)]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move references under docs/"


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    ci_command = shlex.split(re.search(r"^exec (.+)$", ci, re.M).group(1))  # type: ignore[union-attr]
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in quickstart.splitlines() if "CI runs exactly this" in ln]
    assert len(lines) == 1, "the quickstart names CI's test command on one line"
    assert shlex.split(lines[0].split("#", 1)[0]) == ci_command


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_every_environment_variable_is_documented() -> None:
    used: set[str] = set()
    for folder in ("shared", "services", "scripts", "bench"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".sh"}:
                used |= set(_ENV.findall(path.read_text()))
    from t3ar_services.api.modelreg.settings import MlflowSettings
    from t3ar_services.api.settings import ApiSettings
    from t3ar_services.retriever.settings import RetrieverSettings
    from t3ar_services.worker.settings import WorkerSettings

    for settings in (ApiSettings, RetrieverSettings, WorkerSettings, MlflowSettings):
        prefix = str(settings.model_config.get("env_prefix", ""))
        used |= {prefix + field.upper() for field in settings.model_fields}
    documented = set(_ENV.findall((ROOT / "docs" / "configuration.md").read_text()))
    assert sorted(used - documented) == []
