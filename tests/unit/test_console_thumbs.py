"""The console's thumbnails are made once per image and cached, and decoding is bounded (issue 34, G3): decodes
are counted through the module's ``render`` seam, never timed."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_kit import console_client, finished_job, new_pool, png_image, signed_in
from fastapi.testclient import TestClient
from PIL import Image

from t3ar_services.api.console import thumbs


@pytest.fixture()
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per image decoded for a thumbnail."""
    made: list[int] = []
    real = thumbs.render

    def counting(data: bytes, size: int, max_pixels: int = thumbs.MAX_PIXELS) -> bytes:
        made.append(len(data))
        return real(data, size, max_pixels)

    monkeypatch.setattr(thumbs, "render", counting)
    return made


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    yield from console_client(tmp_path, new_pool())


def test_a_pool_thumbnail_is_decoded_once(client: TestClient, decodes: list[int]) -> None:
    signed_in(client)
    first = client.get("/ui/pool/p-1/image")
    assert first.status_code == 200 and first.headers["content-type"] == "image/png" and len(decodes) == 1
    second = client.get("/ui/pool/p-1/image")
    assert second.content == first.content and len(decodes) == 1  # from the cache: not decoded again


def test_a_target_thumbnail_is_decoded_once(client: TestClient, tmp_path: Path, decodes: list[int]) -> None:
    job_id = finished_job(client, tmp_path, signed_in(client))
    for _ in range(3):
        assert client.get(f"/ui/jobs/{job_id}/target/imgs/a0.png").headers["content-type"] == "image/png"
    assert len(decodes) == 1


def test_the_search_upload_goes_through_the_same_bounded_path(client: TestClient, decodes: list[int]) -> None:
    csrf = signed_in(client)
    image = png_image(7)
    for _ in range(2):
        resp = client.post("/ui/pool/search", data={"csrf": csrf}, files={"image": ("q.png", image, "image/png")})
        assert resp.status_code == 200 and "data:image/png;base64," in resp.text, resp.text[:300]
    assert len(decodes) == 1


def test_an_image_over_the_pixel_limit_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.BytesIO()
    Image.new("1", (7000, 6000)).save(buf, "PNG")  # 42 MP in a few KB
    loads: list[int] = []
    real_load = Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(1) or real_load(self))
    with pytest.raises(ValueError, match="over the limit"):
        thumbs.render(buf.getvalue(), 128)
    assert loads == []


def test_a_jpeg_is_decoded_reduced() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (2048, 1024), (200, 10, 10)).save(buf, "JPEG")
    seen: list[tuple[int, int]] = []
    real = Image.Image.thumbnail

    def spy(self: Image.Image, size: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(self.size)  # after draft(): what the decoder will produce
        real(self, size, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Image.Image, "thumbnail", spy)
        png = thumbs.render(buf.getvalue(), 128)
    assert seen == [(256, 128)]  # 1/8 scale straight from the DCT, not 2048 x 1024
    assert Image.open(io.BytesIO(png)).size == (128, 64)


def test_concurrent_requests_for_one_image_decode_it_once(decodes: list[int]) -> None:
    cache = thumbs.Thumbnails(32)
    gate = threading.Event()
    loads: list[int] = []

    def load() -> bytes:
        loads.append(1)
        gate.wait(10)
        return png_image(3)

    out: list[bytes] = []
    threads = [threading.Thread(target=lambda: out.append(cache.get("k", load))) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(out) == 4 and len(set(out)) == 1 and loads == [1] and len(decodes) == 1


def test_the_cache_is_bounded(decodes: list[int]) -> None:
    cache = thumbs.Thumbnails(16, max_bytes=1)  # room for nothing: every image is made again
    cache.of(png_image(1))
    cache.of(png_image(1))
    assert len(decodes) == 2 and cache.cached("sha256:x") is None
