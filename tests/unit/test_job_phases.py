"""A job's phase table (services/worker/phases.py): every phase present, ``other`` the remainder of the worker
total, queue wait outside it, unknown phases refused."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from t3ar.pipeline import PIPELINE_PHASES
from t3ar_services.worker.phases import PHASES, WORKER_PHASES, build_phases, queue_seconds


def test_phases_add_up_to_the_total_with_other_as_the_remainder() -> None:
    table = build_phases({"steps": 3.0, "evaluation": 1.25, "inputs_fetched": 0.5}, 7.0)
    assert list(table) == list(WORKER_PHASES)
    assert table["other"] == pytest.approx(7.0 - 3.0 - 1.25 - 0.5)
    assert sum(table.values()) == pytest.approx(7.0)
    assert table["model_loaded"] == 0.0  # not measured: shown as zero, not left out


def test_queue_wait_comes_first_and_is_not_part_of_the_total() -> None:
    table = build_phases({"steps": 2.0}, 5.0, queue_wait=4.0)
    assert list(table) == list(PHASES)
    assert sum(v for k, v in table.items() if k != "queue_wait") == pytest.approx(5.0)


def test_other_never_goes_negative_and_unknown_phases_are_refused() -> None:
    assert build_phases({"steps": 5.0000001}, 5.0)["other"] == 0.0  # rounding, not time
    with pytest.raises(ValueError, match="unknown"):
        build_phases({"stepz": 1.0}, 2.0)
    with pytest.raises(ValueError, match="unknown"):
        build_phases({"other": 1.0}, 2.0)  # other is computed, never measured


def test_every_pipeline_phase_is_a_worker_phase() -> None:
    assert set(PIPELINE_PHASES) <= set(WORKER_PHASES)


def test_queue_seconds_reads_rq_utc_times_naive_or_aware() -> None:
    aware = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert queue_seconds(aware, aware.timestamp() + 2.5) == pytest.approx(2.5)
    assert queue_seconds(aware.replace(tzinfo=None), aware.timestamp() + 1.0) == pytest.approx(1.0)
    assert queue_seconds(None, 1.0) is None and queue_seconds(aware, None) is None
