"""Invalid UTF-8 in a multipart field (its value, its name, a file name: bytes ED A0 80, a lone surrogate's
encoding) is refused with 422, as in a JSON body, instead of being stored as other characters (issue 34, G7).
In-process on a vectors-only retriever (the parse comes before anything else); with images on a real server:
tests/integration/test_retriever_bad_input.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from retriever_kit import vector_retriever

ADMIN = {"Authorization": "Bearer admin-t"}
BAD = b"\xed\xa0\x80"


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    with vector_retriever(tmp_path / "pool", 8) as c:
        yield c


def multipart(fields: list[tuple[bytes, bytes]], filename: bytes = b"a.png") -> tuple[bytes, dict[str, str]]:
    parts = [b'--b\r\nContent-Disposition: form-data; name="' + name + b'"\r\n\r\n' + value + b"\r\n"
             for name, value in fields]
    parts.append(b'--b\r\nContent-Disposition: form-data; name="files"; filename="' + filename +
                 b'"\r\nContent-Type: image/png\r\n\r\nnot really a png\r\n')
    return b"".join(parts) + b"--b--\r\n", {**ADMIN, "Content-Type": "multipart/form-data; boundary=b"}


@pytest.mark.parametrize(("fields", "filename"), [
    ([(b"source", b"web" + BAD)], b"a.png"),
    ([(b"metadata", b'{"caption": "' + BAD + b'"}')], b"a.png"),
    ([], b"a" + BAD + b".png"),
    ([(b"sour" + BAD, b"x")], b"a.png"),
])
def test_invalid_utf8_in_a_multipart_field_is_422(client: TestClient, fields: list[tuple[bytes, bytes]],
                                                  filename: bytes) -> None:
    body, headers = multipart(fields, filename)
    resp = client.post("/pool", content=body, headers=headers)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_input" and "UTF-8" in error["message"], error


def test_valid_utf8_still_parses(client: TestClient) -> None:
    body, headers = multipart([(b"source", "café".encode())], "é.png".encode())
    resp = client.post("/pool", content=body, headers=headers)
    assert "UTF-8" not in resp.text and resp.status_code < 500, resp.text  # refused later: a vectors-only pool
