"""The API's registrar: a background thread that registers finished jobs in MLflow and sends the version tags owed
to the registry (stale marks after withdrawals, links between a job and its re-run).

Off the request path: a job is finished when its worker's result arrived, whatever the registry does; the result
route only wakes this thread. Each attempt gathers what the job registers (its stored report, lineage and
checkpoint, its ONNX export, a few of its target images as the input example), then calls
:func:`.mlflow_ops.register`, which finds whatever an earlier attempt made (a retry never makes a second version).
A failed attempt waits ``T3AR_MLFLOW_BACKOFF_S`` x 2^(attempt-1) seconds (at most ``T3AR_MLFLOW_BACKOFF_MAX_S``);
after ``T3AR_MLFLOW_MAX_ATTEMPTS`` the registration is ``failed`` with the reason (``POST
/jobs/{id}/registration`` tries again). A job may set only the alias its request named.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t3ar.clients.retriever_models import ItemOut
from t3ar_services.api.modelreg import mlflow_ops
from t3ar_services.api.modelreg.payload import build
from t3ar_services.api.modelreg.records import Registration, RegistrationStore, now_iso
from t3ar_services.api.modelreg.settings import MlflowSettings, scrub
from t3ar_services.api.store import Store
from t3ar_services.api.sweeper import Sweeper
from t3ar_services.common.job_contract import LINEAGE_FILE, MODEL_FILE, REPORT_FILE, artifacts_dir

log = logging.getLogger(__name__)

EXAMPLE_IMAGES = 4  # the input example: the job's first target images, as the ONNX graph takes them
MAX_STALE_ITEMS = 50  # per version: one tag per withdrawn item up to this many (t3ar.stale.count counts them all)


@dataclass(frozen=True)
class Hooks:
    """What the registrar asks of the rest of the API: a job's status, its checkpoint's ONNX export (made once,
    parity-checked) and pool items' records (source, label) by id."""

    job_status: Callable[[str], str]
    export_onnx: Callable[[str], Path]
    pool_items: Callable[[list[str]], dict[str, dict[str, Any]]]


class Registrar(Sweeper):
    """Registers finished jobs' models in MLflow; its background sweep (:meth:`start`) runs :meth:`run_pending` at
    once, then every interval."""

    thread_name = "t3ar-api-registrar"
    sweep_what = "MLflow registration"
    sweep_first = True
    join_timeout = 60.0

    def __init__(self, settings: MlflowSettings, records: RegistrationStore, store: Store, data_dir: Path,
                 hooks: Hooks) -> None:
        self.settings = settings
        self.records = records
        self.store = store
        self.data_dir = data_dir
        self.hooks = hooks
        self.on_step: Callable[[str], None] | None = None  # tests interrupt attempts here (mlflow_ops.register)
        self._lock = threading.Lock()
        super().__init__()

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    # --- the background thread ---------------------------------------------------------------------------
    def start(self, interval: float) -> None:
        if not self.enabled:
            return
        try:
            import mlflow  # noqa: F401
        except ImportError:
            log.error("T3AR_MLFLOW_TRACKING_URI is set but mlflow is not installed (pip install 't3ar[mlflow]'): "
                      "every registration will fail, with that reason")
        # MLflow's client retries each HTTP request itself (7 times, minutes in all, by default): this registrar
        # retries whole attempts with its own backoff, so one attempt against a registry that is down ends quickly
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(self.settings.http_timeout_s)))

        super().start(interval)

    # --- requests ----------------------------------------------------------------------------------------
    def request(self, job_id: str, name: str, alias: str | None) -> None:
        if self.enabled:
            self.records.request(job_id, name, alias)

    def retry(self, job_id: str) -> bool:
        done = self.records.retry(job_id)
        self.wake()
        return done

    def mark_stale(self, pool_ids: list[str], reason: str) -> int:
        """Owe a stale mark to the version of every registered job that used one of ``pool_ids`` (withdrawn now,
        for ``reason``); how many versions. Never raises: the withdrawal itself is done."""
        if not self.enabled:
            return 0
        at = now_iso()
        marked: set[str] = set()
        try:
            for pool_id in pool_ids:
                for job_id, _ in self.store.jobs_using(pool_id):
                    if self.records.get(job_id) is None:
                        continue
                    known = self.records.tags_of(job_id)
                    count = sum(1 for k in known if k.startswith("t3ar.stale.item."))
                    tags = {"t3ar.stale": "true", "t3ar.stale.at": at}
                    if f"t3ar.stale.item.{pool_id}" not in known:
                        count += 1
                        if count <= MAX_STALE_ITEMS:
                            tags[f"t3ar.stale.item.{pool_id}"] = f"withdrawn {at} ({reason})"
                    self.records.owe_tags(job_id, tags)
                    self.records.owe_tags(job_id, {"t3ar.stale.count": str(count)}, replace=True)
                    marked.add(job_id)
        except Exception:
            log.exception("stale marks for %d withdrawn pool item(s) not recorded", len(pool_ids))
        if marked:
            log.info("%d registered version(s) owe a stale mark (%d pool item(s) withdrawn)", len(marked),
                     len(pool_ids))
            self.wake()
        return len(marked)

    # --- the work ----------------------------------------------------------------------------------------
    def run_pending(self) -> int:
        """Attempt every due registration of a finished job (skip those of failed or canceled jobs), then send the
        owed tags. How many registrations were made."""
        made = 0
        with self._lock:
            for reg in self.records.due():
                status = self.hooks.job_status(reg.job_id)
                if status in ("failed", "canceled"):
                    self.records.skip(reg.job_id, f"the job {status}: there is no model to register")
                elif status == "finished":
                    made += self._attempt(reg)
            self._send_tags()
        return made

    def _attempt(self, reg: Registration) -> int:
        uri = self.settings.tracking_uri
        assert uri is not None
        t = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="t3ar-mlflow-") as scratch:
                sub = self.submission(reg, Path(scratch))
                done = mlflow_ops.register(uri, sub, on_step=self.on_step)
        except Exception as e:
            attempts = reg.attempts + 1
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            error = scrub(f"{type(e).__name__}: {text}"[:500], uri)
            last = attempts >= self.settings.max_attempts
            wait = self.settings.backoff(attempts)
            self.records.failed_attempt(reg.job_id, error, None if last else time.time() + wait)
            if last:
                log.warning("job %s: MLflow registration failed after %d attempt(s): %s", reg.job_id, attempts, error)
            else:
                log.warning("job %s: MLflow registration attempt %d failed (%s); next in %.0f s", reg.job_id,
                            attempts, error, wait)
            return 0
        self.records.done(reg.job_id, done.experiment_id, done.run_id, done.version)
        log.info("job %s: registered as %s version %s (run %s) in %.1f s", reg.job_id, done.name, done.version,
                 done.run_id, time.perf_counter() - t)
        row = self.store.get_job(reg.job_id)
        parent = self.records.get(row.parent_id) if row is not None and row.parent_id else None
        if parent is not None and parent.state == "done":
            self.records.owe_tags(parent.job_id, {"t3ar.superseded_by": f"{done.name}/{done.version}",
                                                  "t3ar.superseded_by.job_id": reg.job_id}, replace=True)
        return 1

    def _send_tags(self) -> None:
        uri = self.settings.tracking_uri
        assert uri is not None
        for job_id, tags in self.records.owed().items():
            reg = self.records.get(job_id)
            if reg is None or reg.version is None:
                continue
            try:
                mlflow_ops.set_version_tags(uri, reg.name, reg.version, tags)
            except Exception as e:
                log.warning("job %s: %d tag(s) for %s version %s not sent yet: %s", job_id, len(tags), reg.name,
                            reg.version, scrub(f"{type(e).__name__}: {e}"[:300], uri))
                return  # the registry is likely down: the next sweep sends them
            self.records.tags_set(job_id, tags)

    # --- what a job registers ----------------------------------------------------------------------------
    def submission(self, reg: Registration, scratch: Path) -> mlflow_ops.Submission:
        """What the finished job ``reg`` registers, from its stored artifacts (module docstring); the lineage
        document is written in ``scratch``."""
        from t3ar.export.probe import images_for_parity

        row = self.store.get_job(reg.job_id)
        if row is None:
            raise LookupError(f"job {reg.job_id} has no record")
        model = self.store.get_model(row.model_id)
        folder = artifacts_dir(self.data_dir, reg.job_id)
        report = json.loads((folder / REPORT_FILE).read_text())
        lineage = json.loads((folder / LINEAGE_FILE).read_text())
        teams = sorted(self.store.teams_of("job", reg.job_id))
        pool_ids = [str(p) for p in lineage.get("pool_ids") or []]
        items = self.hooks.pool_items(pool_ids[: self.settings.max_lineage_items]) if pool_ids else {}
        payload = build(report, lineage, job_id=reg.job_id, base_model_id=row.model_id,
                        base_model_name=model.name if model else row.model_id,
                        base_model_sha256=model.sha256 if model else "", team=teams[0] if teams else None,
                        items=items)
        onnx_path = self.hooks.export_onnx(reg.job_id)
        size = model.image_size if model else int(report.get("config", {}).get("image_size", 224))
        images, _ = images_for_parity(size, self.data_dir / row.target_dir, EXAMPLE_IMAGES, name="the job's target")
        lineage_file = scratch / LINEAGE_FILE
        lineage_file.write_text(json.dumps(payload.lineage, indent=1))
        supersedes = None
        if row.parent_id and (parent := self.records.get(row.parent_id)) is not None and parent.state == "done":
            supersedes = f"{parent.name}/{parent.version}"
        return mlflow_ops.Submission(
            job_id=reg.job_id, name=reg.name, experiment=self.settings.experiment, params=payload.params,
            metrics=payload.metrics, tags=payload.tags,
            files={"": [folder / REPORT_FILE, lineage_file], "checkpoint": [folder / MODEL_FILE]},
            onnx_path=onnx_path, example=images.permute(0, 2, 3, 1).contiguous().numpy(), alias=reg.alias,
            supersedes=supersedes, pip_requirements=_pins("onnx", "onnxruntime"),
            description=f"t3ar job {reg.job_id}: {payload.params.get('method')} on {row.n_images} target images "
                        f"from base model {row.model_id}")


def _pins(*names: str) -> list[str]:
    import importlib.metadata as md

    out = []
    for name in names:
        try:
            out.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            out.append(name)
    return out


def pool_items_via(get_item: Callable[[str], ItemOut], workers: int = 8) -> Callable[
        [list[str]], dict[str, dict[str, Any]]]:
    """A :attr:`Hooks.pool_items` that reads each item's record (``GET /pool/{id}``) in parallel; an item gone from
    the pool (withdrawn since) is left out."""

    def lookup(ids: list[str]) -> dict[str, dict[str, Any]]:
        def one(pool_id: str) -> tuple[str, dict[str, Any] | None]:
            try:
                item = get_item(pool_id)
            except Exception:
                return pool_id, None
            return pool_id, {"source": item.source, "label": item.label}

        with ThreadPoolExecutor(max_workers=workers) as ex:
            return {k: v for k, v in ex.map(one, ids) if v is not None}

    return lookup
