"""The services' data stay theirs (issue 50: under umask 022 the data dir's databases, logs, the Redis AOF and
checkpoints were world-readable): a service process started under umask 022 writes nothing another user can read.
Each check runs in a fresh interpreter (the umask is the process's)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "shared"), os.environ.get("PYTHONPATH", "")])}
    script = "import os\nos.umask(0o022)\n" + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _open_to_others(root: Path) -> list[str]:
    found = [root, *root.rglob("*")]
    return [f"{p.relative_to(root.parent)} {stat.filemode(p.stat().st_mode)}" for p in found
            if not p.is_symlink() and p.stat().st_mode & 0o077]


@pytest.mark.parametrize("service", ["api", "retriever"])
def test_a_service_started_under_umask_022_writes_nothing_others_can_read(tmp_path: Path, service: str) -> None:
    if service == "api":
        code = f"""
        import fakeredis
        from fastapi.testclient import TestClient
        from t3ar_services.api.main import create_app
        from t3ar_services.api.settings import ApiSettings
        settings = ApiSettings(data_dir={str(tmp_path / 'data')!r}, token="u", admin_token="a", worker_token="w",
                               retriever_admin_token="r", sweep_interval=3600)
        app = create_app(settings, redis=fakeredis.FakeRedis())
        with TestClient(app) as c:
            assert c.get("/health").status_code == 200
        """
    else:
        code = f"""
        from fastapi.testclient import TestClient
        from t3ar_services.retriever.main import create_app
        from t3ar_services.retriever.settings import RetrieverSettings
        settings = RetrieverSettings(data_dir={str(tmp_path / 'data')!r}, auth_disabled=True, embedder="none",
                                     vector_dim=4, vector_identity="t")
        with TestClient(create_app(settings)) as c:
            import time
            while c.get("/ready").status_code != 200:
                time.sleep(0.05)
            assert c.post("/pool/vectors", params={{"identity": "t"}}, content=b"\\0\\0\\x80\\x3f" * 4,
                          headers={{"Content-Type": "application/octet-stream"}}).status_code == 200
        """
    (tmp_path / "data").mkdir(mode=0o755)  # made earlier under umask 022
    _run(code, tmp_path)
    assert _open_to_others(tmp_path / "data") == []


def test_atomic_writes_follow_the_umask(tmp_path: Path) -> None:
    _run(f"""
    from pathlib import Path
    from t3ar.models.checkpoint import write_atomic
    write_atomic(Path({str(tmp_path / 'shared.pt')!r}), b"x")  # a library user's umask 022: 0644, as before
    from t3ar_services.common.private import keep_private
    keep_private()
    write_atomic(Path({str(tmp_path / 'private.pt')!r}), b"x")
    """, tmp_path)
    assert stat.S_IMODE((tmp_path / "shared.pt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.pt").stat().st_mode) == 0o600
