"""``t3ar submit`` and ``t3ar jobs readapt`` print the job's console page (``/ui/jobs/<id>``: what a person opens in a
browser), not the JSON route (a 401 page there), against a real API on 127.0.0.1."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import httpx
from click.testing import CliRunner
from console_kit import app_for, model_file, new_pool, png_image, settings_for
from uvicorn_kit import serving

from t3ar.cli.job_cmd import jobs, submit


def test_submit_and_readapt_print_the_console_page_of_the_job(tmp_path: Path) -> None:
    (tmp_path / "m.pt").write_bytes(model_file(tmp_path))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(2):
            zf.writestr(f"x{i}.png", png_image(i))
    (tmp_path / "t.zip").write_bytes(buf.getvalue())
    with serving(app_for(settings_for(tmp_path), new_pool())) as port:
        url = f"http://127.0.0.1:{port}"
        run = CliRunner().invoke(submit, [str(tmp_path / "t.zip"), "--model", str(tmp_path / "m.pt"),
                                          "--method", "tent", "--epochs", "1", "--no-follow", "--url", url, "--token",
                                          "user-t"])
        assert run.exit_code == 0, run.output
        m = re.search(r"job (\w+) queued: (\S+)$", run.stdout.strip())
        assert m and m.group(2) == f"{url}/ui/jobs/{m.group(1)}", run.stdout
        page = httpx.get(m.group(2), follow_redirects=False)
        assert page.status_code in (200, 303) and "/ui/login" in page.headers.get("location", "/ui/login")
        again = CliRunner().invoke(jobs, ["readapt", m.group(1), "--url", url, "--token", "user-t"])
        assert again.exit_code == 0, again.output
        r = re.search(rf"job (\w+) queued \(readapt of {m.group(1)}\): (\S+)$", again.stdout.strip())
        assert r and r.group(2) == f"{url}/ui/jobs/{r.group(1)}", again.stdout
