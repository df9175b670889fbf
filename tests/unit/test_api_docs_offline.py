"""Both services' API docs (/docs: Swagger UI, /redoc: ReDoc) render on a machine without internet: every script
and stylesheet the pages load is served by the service itself, none from a CDN."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient
from test_api_routes import env  # noqa: F401  (the API fixture)
from test_retriever_routes import pool  # noqa: F401  (the retriever fixture)

ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+\.(?:js|css))["']""")


def _check_offline(client: TestClient) -> None:
    for page, marker in (("/docs", "SwaggerUIBundle"), ("/redoc", "<redoc")):
        resp = client.get(page)
        assert resp.status_code == 200 and marker in resp.text, page
        assets = ASSET.findall(resp.text)
        assert assets, f"{page} names no script or stylesheet"
        for url in assets:
            assert url.startswith("/"), f"{page} loads {url} from outside the service"
            got = client.get(url)
            assert got.status_code == 200 and len(got.content) > 10_000, url
    assert client.get("/openapi.json").status_code == 200


def test_api_docs_are_served_offline(env: Any) -> None:  # noqa: F811
    _check_offline(env[0])


def test_retriever_docs_are_served_offline(pool: Any) -> None:  # noqa: F811
    _check_offline(pool[0])
