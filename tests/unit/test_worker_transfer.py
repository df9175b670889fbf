"""The worker's transfers (:mod:`t3ar_services.worker.transfer`) and model cache against a mocked API
(httpx MockTransport): digests checked before a file is used, interrupted downloads started over, uploads
rewound for a retry, a base model fetched once per sha256."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import httpx
import pytest

from t3ar.clients.api import ApiNotFoundError
from t3ar_services.worker.cache import ModelCache
from t3ar_services.worker.transfer import ChecksumMismatchError, WorkerApiClient

BLOB = bytes(range(256)) * 5000  # 1.28 MB: more than one chunk
SHA = hashlib.sha256(BLOB).hexdigest()


class _Flaky(httpx.SyncByteStream):
    """Half the body, then the connection drops."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield BLOB[: len(BLOB) // 2]
        raise httpx.ReadError("connection reset")


def _client(handler: object, retries: int = 2) -> WorkerApiClient:
    client = WorkerApiClient("http://api", "worker-t", transport=httpx.MockTransport(handler), retries=retries)  # type: ignore[arg-type]
    client.backoff = 0.001
    return client


def test_download_is_verified_and_atomic(tmp_path: Path) -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.headers["authorization"])
        body = BLOB if req.url.path == "/good" else BLOB[:-1] + b"\x00"  # one byte changed
        return httpx.Response(200, content=body)

    with _client(handler) as api:
        assert api.download("/good", tmp_path / "m.pt", SHA, what="the base model") == len(BLOB)
        assert (tmp_path / "m.pt").read_bytes() == BLOB and seen == ["Bearer worker-t"]
        with pytest.raises(ChecksumMismatchError, match=r"the target: checksum mismatch: .* the job says " + SHA):
            api.download("/tampered", tmp_path / "t.tar", SHA, what="the target")
    assert not (tmp_path / "t.tar").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # no partial file left behind


def test_interrupted_download_starts_over(tmp_path: Path) -> None:
    calls: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(200, stream=_Flaky())
        return httpx.Response(200, content=BLOB)

    with _client(handler) as api:
        api.download("/x", tmp_path / "m.pt", SHA, what="the base model")
    assert len(calls) == 2 and (tmp_path / "m.pt").read_bytes() == BLOB


def test_download_errors_are_not_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no job 'j'"}})

    with _client(handler) as api, pytest.raises(ApiNotFoundError, match="the target: GET /x: no job"):
        api.download("/x", tmp_path / "t.tar", SHA, what="the target")
    assert calls == [1] and not list(tmp_path.iterdir())


def test_upload_streams_with_its_digest_and_is_rewound_for_a_retry(tmp_path: Path) -> None:
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(BLOB)
    got: list[bytes] = []

    def handler(req: httpx.Request) -> httpx.Response:
        got.append(req.read())
        assert req.url.raw_path.startswith(b"/internal/jobs/j%2F1/checkpoint?")  # the id is one path segment
        assert req.url.params["sha256"] == SHA and req.headers["content-type"] == "application/octet-stream"
        if len(got) == 1:
            return httpx.Response(503, json={"error": {"code": "unavailable", "message": "busy"}})
        return httpx.Response(200, json={"job_id": "j/1", "sha256": SHA, "size": len(BLOB), "stored": True})

    with _client(handler) as api:
        assert api.upload_checkpoint("j/1", ckpt, SHA)["stored"] is True
    assert got == [BLOB, BLOB]  # the retry sent the whole file again


def test_model_cache_fetches_once_and_refetches_a_damaged_copy(tmp_path: Path) -> None:
    fetched: list[Path] = []

    def fetch(dest: Path) -> None:
        fetched.append(dest)
        dest.write_bytes(BLOB)

    cache = ModelCache(tmp_path / "cache", max_bytes=10 * len(BLOB))
    first, hit1 = cache.get(SHA, fetch, scratch=tmp_path / "work")
    second, hit2 = cache.get(SHA, fetch, scratch=tmp_path / "work")
    assert first == second == tmp_path / "cache" / SHA and (hit1, hit2) == (False, True) and len(fetched) == 1
    first.write_bytes(b"bit rot")
    third, hit3 = cache.get(SHA, fetch, scratch=tmp_path / "work")
    assert not hit3 and len(fetched) == 2 and third.read_bytes() == BLOB
    with pytest.raises(ValueError, match="not a sha256"):
        cache.get("../../etc/passwd", fetch, scratch=tmp_path)


def test_model_cache_budget(tmp_path: Path) -> None:
    def writer(data: bytes):  # type: ignore[no-untyped-def]
        return lambda dest: dest.write_bytes(data)

    blobs = [bytes([i]) * 1000 for i in range(3)]
    shas = [hashlib.sha256(b).hexdigest() for b in blobs]
    cache = ModelCache(tmp_path / "cache", max_bytes=2500)
    for b, s in zip(blobs, shas, strict=True):
        cache.get(s, writer(b), scratch=tmp_path)
        time.sleep(0.01)  # distinct modification times: the oldest is trimmed first
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(shas[1:])  # oldest one trimmed
    off = ModelCache(tmp_path / "off", max_bytes=0)
    path, hit = off.get(shas[0], writer(blobs[0]), scratch=tmp_path / "work")
    assert path == tmp_path / "work" / shas[0] and not hit and not (tmp_path / "off").exists()


def test_429_and_503_are_retried_with_backoff_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """N1 (issue 50): a worker retries a 429 (a rate limit) or 503 answer to its download and upload, waiting at
    least the Retry-After it was given (capped), a bounded number of times; then it fails with the answer."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    answers = {"n": 0, "busy": 2}

    def handler(req: httpx.Request) -> httpx.Response:
        answers["n"] += 1
        if answers["n"] <= answers["busy"]:
            status = 429 if answers["n"] % 2 else 503
            return httpx.Response(status, headers={"Retry-After": "3"},
                                  json={"error": {"code": "too_many_requests", "message": "slow down"}})
        if req.method == "PUT":
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(200, content=BLOB)

    with _client(handler, retries=3) as api:
        assert api.download("/t", tmp_path / "t.tar", SHA, what="the target") == len(BLOB)
        assert slept == [3.0, 3.0]
        answers.update(n=0)
        ckpt = tmp_path / "m.pt"
        ckpt.write_bytes(b"x")
        assert api.upload_checkpoint("j1", ckpt, "ab" * 32) == {"ok": True}
        answers.update(n=0, busy=99)
        with pytest.raises(Exception, match="HTTP 429|HTTP 503"):
            api.download("/t", tmp_path / "u.tar", SHA, what="the target")
        assert answers["n"] == 4  # bounded: the first try and 3 retries
