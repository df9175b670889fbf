"""Absolute links in the API's answers (a job's ``url``, its checkpoint's and report's, ``Location``) are built
from ``T3AR_API_PUBLIC_URL``, else from the address the server accepted the connection on: never from the
client's ``Host`` header (a client chose where a link in the answer, or in a cache in front, points)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_kit import app_for, model_file, new_pool, png_image, settings_for
from pydantic import ValidationError
from uvicorn_kit import serving

USER = {"Authorization": "Bearer user-t"}
EVIL = "evil.example:666"


def _submit(http: httpx.Client, tmp_path: Path) -> httpx.Response:
    model = http.post("/models", files={"file": ("m.pt", model_file(tmp_path))}, headers=USER)
    assert model.status_code == 201, model.text
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(2):
            zf.writestr(f"x{i}.png", png_image(i))
    return http.post("/adapt", files={"archive": ("t.zip", buf.getvalue())}, headers={**USER, "Host": EVIL},
                     data={"model_id": model.json()["id"], "config": json.dumps({"method": "tent", "epochs": 1})})


def _links(body: Any) -> list[str]:
    text = json.dumps(body)
    return [part.split('"')[0] for part in text.split('"http')[1:]]


@pytest.mark.parametrize("public_url", [None, "https://t3ar.example.com/base/"])
def test_links_never_come_from_the_host_header(tmp_path: Path, public_url: str | None) -> None:
    settings = settings_for(tmp_path, public_url=public_url)
    with serving(app_for(settings, new_pool())) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        base = "https://t3ar.example.com/base" if public_url else f"http://127.0.0.1:{port}"
        sent = _submit(http, tmp_path)
        assert sent.status_code == 202, sent.text
        job_id = sent.json()["id"]
        assert sent.json()["url"] == sent.headers["location"] == f"{base}/jobs/{job_id}"
        for path in (f"/jobs/{job_id}", "/jobs"):
            body = http.get(path, headers={**USER, "Host": EVIL}).json()
            links = _links(body)
            assert links and all(("http" + link).startswith(base + "/jobs/") for link in links), links
            assert "evil.example" not in json.dumps(body)


def test_the_public_url_must_be_an_http_base(tmp_path: Path) -> None:
    for bad in ("t3ar.example.com", "ftp://x", "https://x/?a=1", "https:///path"):
        with pytest.raises(ValidationError, match="T3AR_API_PUBLIC_URL"):
            settings_for(tmp_path, public_url=bad)
