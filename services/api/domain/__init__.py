"""The API's domain layer: what a caller can ask of the service, as plain functions with typed inputs and outputs
(no ``Request``, no ``Response``), called by both the JSON routes (:mod:`t3ar_services.api.routes`) and the web
console (:mod:`t3ar_services.api.console`), so the console is a client of the same code paths, never a second
implementation.

- :mod:`.jobs`: submit, readapt, cancel, list and describe jobs, their report and checkpoint;
- :mod:`.models`: upload, list and describe base models;
- :mod:`.pool`: lineage, withdrawal of one item or of a contribution, compaction.

Failures are domain errors (:class:`~t3ar.errors.T3arError` subclasses, Redis and retriever errors), mapped to
HTTP in one place (:mod:`t3ar_services.api.errors`) for the JSON API and, with the same status, to an HTML error
page by the console.
"""

from __future__ import annotations

from typing import Protocol


class Links(Protocol):
    """The URL of a named route for a job (the JSON API's own names: ``get_job``, ``get_checkpoint``,
    ``get_report``, ``readapt``): what a job view links to, without the domain knowing about requests."""

    def __call__(self, route: str, job_id: str) -> str: ...
