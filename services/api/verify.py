"""What a worker uploads is checked completely before anything is written.

- :func:`check_checkpoint`: the uploaded file loads as a t3ar checkpoint (``weights_only``; the weights fit the
  architecture it declares), that architecture and class list are the base model's, and its lineage is this
  job's: the base model's sha256, the sha256 of the very target images the job adapts to (recorded when the
  target was validated: :class:`~t3ar_services.api.uploads.Subsample`; the target is not read again), the job's
  adaptation config and method (for a job with a holdout, those of one of its candidates: the winner's).
- :func:`check_result`: the result's lineage is the stored checkpoint's (every :class:`~t3ar.models.checkpoint
  .Lineage` field, plus the job's model and parent), and the report holds only text and finite numbers.

Either raises a :class:`~t3ar.errors.CheckpointError` (422 ``bad_checkpoint``) or
:class:`~t3ar.errors.InvalidInputError` (422) naming what differs; nothing is stored then.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from t3ar.errors import CheckpointError, InvalidInputError
from t3ar_services.api.holdout import holdout_of
from t3ar_services.api.registry import model_path
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.store import JobRow, ModelRow
from t3ar_services.api.uploads import read_subsample
from t3ar_services.common.text import check_text


def check_checkpoint(path: Path, settings: ApiSettings, row: JobRow, model: ModelRow) -> None:
    """Raise unless ``path`` is a t3ar checkpoint adapted by this job (see the module)."""
    from t3ar.method.config import AdaptConfig
    from t3ar.models.checkpoint import check_compatible, load_checkpoint, read_info

    try:
        info = read_info(path)
        load_checkpoint(path)  # the weights must fit the architecture it declares
    except CheckpointError as e:
        raise CheckpointError(f"the uploaded checkpoint is not a t3ar checkpoint: "
                              f"{str(e).replace(str(path), 'the upload')}") from None
    except Exception as e:  # a forged spec can fail model construction in many ways
        raise CheckpointError(f"the uploaded checkpoint's model cannot be built: {type(e).__name__}") from None
    base = read_info(model_path(settings.data_dir, model.id))
    check_compatible(info.spec, base.spec, what="the uploaded checkpoint")
    lineage = info.lineage
    job = f"job {row.id}"
    if lineage.base_model_sha256 != model.sha256:
        raise CheckpointError(f"the uploaded checkpoint was adapted from base model sha256 "
                              f"{lineage.base_model_sha256}, not {job}'s ({model.sha256})")
    try:
        given = AdaptConfig.model_validate(info.adapt_config or {})
    except Exception as e:
        raise CheckpointError(f"the uploaded checkpoint's adaptation config is invalid: {e}") from None
    wanted = AdaptConfig.model_validate(row.config)
    found = holdout_of(settings.data_dir, row.target_dir)
    if found is not None and given != wanted:  # a job with a holdout returns its winning candidate
        from t3ar.acceptance_options import candidate_config, candidate_names

        wanted = next((c for c in (candidate_config(wanted, n) for n in candidate_names(found[1], wanted))
                       if c == given), wanted)
    if given != wanted:
        differ = sorted(k for k in type(wanted).model_fields if getattr(given, k, None) != getattr(wanted, k))
        raise CheckpointError(f"the uploaded checkpoint's adaptation config is not {job}'s (differs in "
                              f"{', '.join(differ[:10])})")
    if lineage.method != wanted.method:
        raise CheckpointError(f"the uploaded checkpoint's lineage names method {lineage.method!r}, {job} runs "
                              f"{wanted.method!r}")
    target = read_subsample(settings.data_dir, row.target_dir).sha256
    if lineage.target_sha256 != target:
        raise CheckpointError(f"the uploaded checkpoint was adapted to target sha256 {lineage.target_sha256}, not "
                              f"{job}'s images ({target})")
    check_text(list(lineage.pool_ids), "the checkpoint's lineage.pool_ids")


def check_result(path: Path, row: JobRow, lineage: dict[str, Any], report: dict[str, Any]) -> None:
    """Raise unless ``lineage`` (the result's, as JSON) is the lineage inside the stored checkpoint ``path`` and
    names this job's model and parent, and ``report`` can be stored and served as JSON."""
    from t3ar.models.checkpoint import Lineage, read_info

    check_text(report, "report")
    check_text(lineage, "lineage")
    inside = read_info(path).lineage.model_dump(mode="json")
    differ = sorted(k for k in Lineage.model_fields if lineage.get(k) != inside[k])
    if differ:
        raise InvalidInputError(f"the result's lineage differs from the uploaded checkpoint's in "
                                f"{', '.join(differ)}: send the lineage the checkpoint carries")
    if lineage.get("model_id") not in (None, row.model_id) or lineage.get("parent_id") != row.parent_id:
        raise InvalidInputError(f"the result's lineage names model {lineage.get('model_id')!r} / parent "
                                f"{lineage.get('parent_id')!r}; job {row.id} has {row.model_id!r} / {row.parent_id!r}")
