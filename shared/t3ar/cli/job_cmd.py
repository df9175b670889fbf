"""``t3ar submit``, ``t3ar jobs ...``, ``t3ar models ...``, ``t3ar withdraw``: use the adaptation API over HTTP.

The API URL and tokens come from ``--url``/``--token`` or the environment (``T3AR_API_URL``, ``T3AR_API_TOKEN``,
``T3AR_API_ADMIN_TOKEN``), which ``t3ar up`` prints.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from t3ar.acceptance import DEFAULT_RULE
from t3ar.cli.common import MethodChoice, echo_result, holdout_options, pct, service_options
from t3ar.cli.json_arg import json_object
from t3ar.clients.api import ApiClient, ApiError
from t3ar.clients.api_models import JobOut, JobResult, ModelOut, Progress, Registration, ReportOut
from t3ar.clients.job_report import acceptance_table, candidate_pool_lines, labelled_summary, quality_lines
from t3ar.job_words import noise_words, progress_words, returned_model
from t3ar.method.presets import PRESET_NAMES

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8700"


def _api_options(admin: bool = False) -> Callable[[F], F]:
    token_env = ["T3AR_API_ADMIN_TOKEN", "T3AR_API_TOKEN"] if admin else ["T3AR_API_TOKEN"]
    return service_options("API", "T3AR_API_URL", DEFAULT_URL, token_env)


def console_page(api_url: str, job_id: str) -> str:
    """The job's page in the web console (what a person opens; the JSON route ``/jobs/<id>`` needs a token)."""
    return f"{api_url.rstrip('/')}/ui/jobs/{job_id}"


def _summary(job: JobOut, report: ReportOut | None = None) -> str:
    """A job in lines: id, status, model, what it returns (the base model when that won its holdout), images (and
    how many it adapted on), where it is; then its contribution, acceptance and labelled neighbours."""
    line = f"{job.id}  {job.status:9s} model {job.model_id}  returns {returned_model(job)}"
    line += f"  {job.target.images} images"
    if job.target.adapted is not None:
        line += f" (adapted on {job.target.adapted})"
    if where := progress_words(job):
        line += f"  {where}"
    if job.parent_id:
        line += f"  readapt of {job.parent_id}"
    if job.error:
        line += f"\n    error: {job.error}"
    c = job.contribution
    if c.requested:
        line += f"\n    contribution to the pool ({c.source}): {c.status}"
        if c.added is not None:
            line += (f", {c.added} of {c.images} images added, {c.skipped_exact} exact and "
                     f"{c.skipped_near} near-duplicates skipped")
    for n in job.neighbours_from_contributions:
        by = f"job {n.job_id}" if n.job_id else n.source
        line += f"\n    used {n.items_used} pool image(s) contributed by {by}"
    acc = job.acceptance or (report.acceptance if report is not None else None)
    if acc:  # a job with a holdout: its candidates on it, and the winner
        line += "\n    " + "\n    ".join(acceptance_table(acc))
        if noise := noise_words(acc):
            line += f"\n    {noise}"
        if used := candidate_pool_lines(acc):  # what each candidate drew from the pool, the losers' too
            line += "\n    " + "\n    ".join(used)
    if job.registration is not None:
        line += "\n    " + registration_line(job.registration)
    res = job.result or JobResult()
    gone = set(job.withdrawn_pool_ids or ())
    if res.labelled_neighbours:  # which neighbours served as labelled data, with their labels
        line += "\n    " + labelled_summary([u.model_dump() for u in res.labelled_neighbours],
                                          total=res.labelled_neighbours_total, per_label=res.labelled_per_label,
                                          withdrawn=gone)
    elif report is not None and report.labelled_neighbours:
        line += "\n    " + labelled_summary([u.model_dump() for u in report.labelled_neighbours],
                                          total=report.labelled_neighbours_total, withdrawn=gone)
    quality = res.neighbour_quality or (report.neighbour_quality if report is not None else None)
    if quality is not None:  # how good the neighbours were (issue 52)
        line += "\n    " + "\n    ".join(quality_lines(quality))
    return line


def _accuracy(job: JobOut, report: ReportOut | None) -> tuple[float, float] | None:
    """Top-1 before and after on the target's labels: the job's result, else its report; None without labels."""
    res = job.result or JobResult()
    if res.accuracy_after is not None and res.accuracy_before is not None:
        return res.accuracy_before, res.accuracy_after
    acc = report.accuracy if report is not None else None
    if acc is not None and acc.before is not None and acc.after is not None \
            and acc.before.top1 is not None and acc.after.top1 is not None:
        return acc.before.top1, acc.after.top1
    return None


def show_text(job: JobOut, report: ReportOut | None) -> str:
    """What ``t3ar jobs show`` prints: what the console's job page says, as text (issue 50): the summary, whether
    its checkpoint is stale (pool items it retrieved were withdrawn since) and its re-runs, accuracy before ->
    after on the target's labels, and the times."""
    text = _summary(job, report)
    if job.used_withdrawn:
        ids = ", ".join(job.withdrawn_pool_ids or [])
        more = job.used_withdrawn - len(job.withdrawn_pool_ids or [])
        text += (f"\n    STALE: {job.used_withdrawn} pool item(s) it retrieved were withdrawn since ({ids}"
                 f"{f', and {more} more' if more > 0 else ''}); its checkpoint and exports still carry what it "
                 "learned from them: " + ("use its re-run below" if job.superseded_by else
                                          f"re-adapt it (t3ar jobs readapt {job.id})"))
    if job.superseded_by:
        text += f"\n    re-run as: {', '.join(job.superseded_by)}"
    if (acc := _accuracy(job, report)) is not None:
        used = job.config.mode == "train"
        text += (f"\n    accuracy {pct(acc[0])} -> {pct(acc[1])} on the target's labels"
                 + ((" (trained on)" if used else " (only scored: test-time adaptation never saw them)")
                    if job.target.labelled else ""))
    return text + f"\n    created {job.created_at}  started {job.started_at}  ended {job.ended_at}"


def registration_line(reg: Registration) -> str:
    """One line (two with links) on the job's MLflow registration: pending, done, failed or skipped."""
    if reg.state == "done":
        text = f"MLflow: registered {reg.model_uri}" + (f" (alias {reg.alias})" if reg.alias else "")
        if reg.stale:
            text += "; STALE: a pool item it used was withdrawn"
        if reg.superseded_by:
            text += f"; superseded by {reg.superseded_by}"
        if reg.tags_pending:
            text += f"; {reg.tags_pending} tag(s) not yet in the registry"
        if reg.version_url or reg.run_url:
            text += f"\n    version {reg.version_url or '-'}  run {reg.run_url or '-'}"
        return text
    if reg.state == "pending":
        return f"MLflow: registration pending as {reg.name}" + (
            f" (attempt {reg.attempts} failed: {reg.error}; next at {reg.next_attempt_at})" if reg.attempts else "")
    if reg.state == "failed":
        return f"MLflow: registration as {reg.name} FAILED after {reg.attempts} attempt(s): {reg.error}"
    return f"MLflow: not registered ({reg.error or 'skipped'})"


def follow(client: ApiClient, job_id: str, *, quiet: bool = False, timeout: float | None = None) -> JobOut:
    """Wait for the job, drawing a progress bar of adaptation steps on stderr."""
    from tqdm import tqdm

    bar: tqdm[Any] | None = None
    phase = ""
    tty = sys.stderr.isatty()

    def update(job: JobOut) -> None:
        nonlocal bar, phase
        if quiet:
            return
        p = job.progress or Progress()
        now = p.phase or job.status
        if bar is None and p.total_steps:
            # a log file gets a line every 20 s instead of a redraw every second
            bar = tqdm(total=int(p.total_steps), desc=f"job {job_id[:8]}", unit="step", file=sys.stderr,
                       mininterval=0.5 if tty else 20.0, dynamic_ncols=tty)
        if bar is not None:
            running = f"candidate {p.candidate} " if p.candidate else ""
            bar.set_postfix_str(f"{running}{now} epoch {p.epoch} loss {p.loss} pl-change {pct(p.pl_change_rate)}",
                                refresh=False)
            bar.update(max(0, int(p.step or 0) - bar.n))
        elif now != phase:
            click.echo(f"job {job_id[:8]}: {progress_words(job) or now}", err=True)
        phase = now

    try:
        return client.wait(job_id, on_update=update, poll=1.0, timeout=timeout)
    finally:
        if bar is not None:
            bar.close()


def _finish(client: ApiClient, job: JobOut, out: Path | None, as_json: bool) -> None:
    text = _summary(job)
    res = job.result or JobResult()
    if res.accuracy_after is not None:
        text += f"\naccuracy {pct(res.accuracy_before)} -> {pct(res.accuracy_after)} on the target labels"
    shown: Any = job
    if job.status == "finished" and out is not None:
        client.download_checkpoint(job.id, out)
        text += f"\ncheckpoint written to {out}"
        shown = {**job.model_dump(mode="json", exclude_unset=True), "checkpoint_path": str(out)}
    echo_result(as_json, shown, text)
    if job.status != "finished":
        sys.exit(1)


def _config(config: str, opts: dict[str, Any]) -> dict[str, Any]:
    cfg = json_object(config, "--config")
    cfg.update({k: v for k, v in opts.items() if v is not None})
    return cfg


@click.command("submit")
@click.argument("target", type=click.Path(exists=True, path_type=Path))
@click.option("--model", "model", required=True, help="A model id (t3ar models list), or a checkpoint file to upload.")
@click.option("--method", type=MethodChoice(), default=None,
              help="Adaptation method [default: the server's, the method benchmark's choice].")
@click.option("--preset", type=click.Choice(PRESET_NAMES), default=None,
              help="T3AR family: a named configuration (paper | validated); the server's default is the one the "
                   "method benchmark chose.")
@click.option("--mode", type=click.Choice(["test", "train"]), default=None,
              help="Default: train when the target has labels.csv, else test. test + labels.csv = evaluate only.")
@click.option("--k", type=int, default=None, help="Retrieved neighbours per target image.")
@click.option("--r", type=int, default=None, help="Dedup: sample k of the top r*k.")
@click.option("--epochs", type=int, default=None)
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--fraction", type=float, default=None, help="Share of the target adapted on.")
@click.option("--seed", type=int, default=None)
@click.option("--config", default="{}", help="JSON object of any other AdaptConfig fields.")
@click.option("--skip-bad-images", is_flag=True, help="Drop unreadable files instead of refusing the upload.")
@click.option("--contribute", is_flag=True,
              help="Once the job finished, add the target images to the pool (source target:<job id>; exact and "
                   "near-duplicates of pool items are skipped). Undo with `t3ar withdraw --contribution JOB_ID`.")
@holdout_options(scored="; the job scores its candidates on it and returns the winner.", method="the job's method",
                 no_gain="the job fails", rule_default=None,
                 rule_help="paired (the simpler candidate unless a paired 95 % CI favours another) or argmax "
                           f"[default: the server's, {DEFAULT_RULE}].")
@click.option("--register-as", default=None, help="With an MLflow registry on the API: the registered model's name "
                                                  "(in your team's namespace; default t3ar-<base model's name>).")
@click.option("--register-alias", default=None,
              help="With an MLflow registry: the alias the finished job's version gets (e.g. challenger).")
@click.option("--follow/--no-follow", default=True, show_default=True, help="Wait for the job with a progress bar.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Download the adapted checkpoint here when the job finishes (implies --follow).")
@click.option("--timeout", type=float, default=None, help="Give up following after this many seconds.")
@_api_options()
def submit(target: Path, model: str, method: str | None, preset: str | None, mode: str | None, k: int | None,
           r: int | None, epochs: int | None, batch_size: int | None, lr: float | None, fraction: float | None,
           seed: int | None, config: str, skip_bad_images: bool, contribute: bool, holdout: Path | None,
           candidates: str, require_gain: bool, winner_rule: str | None, register_as: str | None,
           register_alias: str | None, follow: bool, out: Path | None, timeout: float | None, url: str,
           token: str | None, as_json: bool) -> None:
    """Adapt a base model to TARGET (a folder, zip or tar of images; labels.csv at its root = labelled).

    \b
    Example:
      t3ar submit data/twitter-subset --model runs/source.pt --k 5 --epochs 2 --out runs/adapted.pt
    """
    cfg = _config(config, {"method": method, "preset": preset, "mode": mode, "k": k, "r": r, "epochs": epochs,
                           "batch_size": batch_size, "lr": lr, "fraction": fraction, "seed": seed})
    with ApiClient(url, token) as client:
        model_id = model
        if Path(model).is_file():
            model_id = client.upload_model(Path(model)).id
            click.echo(f"model {model} uploaded as {model_id}", err=True)
        if holdout is None and (candidates or require_gain or winner_rule):
            raise click.UsageError("--candidates, --require-gain and --winner-rule decide on a holdout: pass --holdout")
        accepted = client.adapt(target, model_id, cfg, skip_bad_images=skip_bad_images, contribute=contribute,
                                holdout=holdout, candidates=[c.strip() for c in candidates.split(",") if c.strip()],
                                require_gain=require_gain, winner_rule=winner_rule, register_as=register_as,
                                register_alias=register_alias)
        for w in accepted.warnings:
            click.echo(f"warning: {w}", err=True)
        if not (follow or out):
            echo_result(as_json, accepted, f"job {accepted.id} queued: {console_page(url, accepted.id)}")
            return
        click.echo(f"job {accepted.id} queued ({accepted.target.images} images): "
                   f"{console_page(url, accepted.id)}", err=True)
        _finish(client, follow_job(client, accepted.id, as_json, timeout), out, as_json)


def follow_job(client: ApiClient, job_id: str, as_json: bool, timeout: float | None) -> JobOut:
    """Progress goes to stderr, so it is shown with --json too (stdout stays machine-readable)."""
    return follow(client, job_id, timeout=timeout)


@click.group("jobs")
def jobs() -> None:
    """List, follow, cancel, download and re-run adaptation jobs."""


def _ask(url: str, token: str | None, call: Callable[[ApiClient], T]) -> T:
    """One call on a client of its own (closed after)."""
    with ApiClient(url, token) as client:
        return call(client)


def _job_command(name: str) -> Callable[[F], click.Command]:
    """A ``t3ar jobs NAME JOB_ID`` command with the API options."""
    return lambda fn: jobs.command(name)(click.argument("job_id")(_api_options()(fn)))


@jobs.command("list")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 200))
@_api_options()
def jobs_list(limit: int, url: str, token: str | None, as_json: bool) -> None:
    """The newest jobs first."""
    page = _ask(url, token, lambda client: client.jobs(limit=limit))
    echo_result(as_json, page, "\n".join(_summary(j) for j in page.jobs) or "(no jobs)")


@_job_command("show")
def jobs_show(job_id: str, url: str, token: str | None, as_json: bool) -> None:
    """Status, progress, timings and error of one job."""
    def both(client: ApiClient) -> tuple[JobOut, ReportOut | None]:
        job = client.job(job_id)
        if job.status != "finished" or as_json:
            return job, None
        try:  # what a job forgotten by the queue keeps: accuracy, labelled neighbours, acceptance
            return job, client.report(job_id)
        except ApiError:
            return job, None

    job, report = _ask(url, token, both)
    echo_result(as_json, job, show_text(job, report))


@_job_command("register")
def jobs_register(job_id: str, url: str, token: str | None, as_json: bool) -> None:
    """Try a job's failed MLflow registration again (POST /jobs/{id}/registration; an API with
    T3AR_MLFLOW_TRACKING_URI set registers every finished job by itself)."""
    reg = _ask(url, token, lambda client: client.retry_registration(job_id))
    echo_result(as_json, reg, registration_line(reg))


@jobs.command("follow")
@click.argument("job_id")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Download the checkpoint here when finished.")
@_api_options()
def jobs_follow(job_id: str, out: Path | None, url: str, token: str | None, as_json: bool) -> None:
    """Wait for a job with a progress bar; exit status 1 unless it finishes."""
    with ApiClient(url, token) as client:
        _finish(client, follow(client, job_id), out, as_json)


@_job_command("cancel")
def jobs_cancel(job_id: str, url: str, token: str | None, as_json: bool) -> None:
    """Cancel a queued job at once, or a running one at its next step."""
    out = _ask(url, token, lambda client: client.cancel(job_id))
    echo_result(as_json, out, f"job {job_id}: {out.status}")


@jobs.command("download")
@click.argument("job_id")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["pt", "onnx", "safetensors"]), default="pt", show_default=True,
              help="pt: the t3ar checkpoint; onnx: the whole classifier for ONNX Runtime (uint8 NHWC RGB images in, "
                   "logits out); safetensors: the weights with spec and lineage as metadata. The API makes an "
                   "export on its first request, checked for parity on the job's target images.")
@_api_options()
def jobs_download(job_id: str, out: Path, fmt: str, url: str, token: str | None, as_json: bool) -> None:
    """Save a finished job's adapted checkpoint to OUT, as it is or exported for serving."""
    _ask(url, token, lambda client: client.download_checkpoint(job_id, out, fmt))
    echo_result(as_json, {"job_id": job_id, "path": str(out), "format": fmt}, f"wrote {out} ({fmt})")


@_job_command("report")
def jobs_report(job_id: str, url: str, token: str | None, as_json: bool) -> None:
    """A finished job's report: what ran, timings, pool items used, accuracy when labels were given; with --json
    the whole report (losses per epoch and step, the neighbours drawn, the contribution)."""
    from t3ar.clients.job_report import report_summary

    data = _ask(url, token, lambda client: client.report(job_id))
    echo_result(as_json, data, report_summary(data))


@jobs.command("readapt")
@click.argument("job_id")
@click.option("--follow/--no-follow", default=False, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@_api_options()
def jobs_readapt(job_id: str, follow: bool, out: Path | None, url: str, token: str | None, as_json: bool) -> None:
    """Re-run a job (same model, target and options) against the current pool."""
    with ApiClient(url, token) as client:
        accepted = client.readapt(job_id)
        if not (follow or out):
            echo_result(as_json, accepted, f"job {accepted.id} queued (readapt of {job_id}): "
                                           f"{console_page(url, accepted.id)}")
            return
        _finish(client, follow_job(client, accepted.id, as_json, None), out, as_json)


@click.group("models")
def models() -> None:
    """Upload and list base models on the adaptation API."""


@models.command("upload")
@click.argument("checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", default="", help="A readable name (default: the file name).")
@_api_options()
def models_upload(checkpoint: Path, name: str, url: str, token: str | None, as_json: bool) -> None:
    """Upload a base checkpoint (from t3ar train-source); prints its id."""
    m = _ask(url, token, lambda client: client.upload_model(checkpoint, name))
    echo_result(as_json, m, _model_line(m))


@models.command("list")
@_api_options()
def models_list(url: str, token: str | None, as_json: bool) -> None:
    ms = _ask(url, token, lambda client: client.list_models())
    echo_result(as_json, ms, "\n".join(_model_line(m) for m in ms) or "(no models)")


def _model_line(m: ModelOut) -> str:
    return f"{m.id}  {m.name}  ({m.num_classes} classes, {m.image_size} px)"


@click.command("withdraw")
@click.argument("pool_ids", nargs=-1)
@click.option("--contribution", "contributions", multiple=True, metavar="JOB_ID",
              help="Withdraw every pool image this job contributed (submitted with --contribute), as one unit.")
@click.option("--readapt", is_flag=True, help="Re-run every job that used a withdrawn item.")
@_api_options(admin=True)
def withdraw(pool_ids: tuple[str, ...], contributions: tuple[str, ...], readapt: bool, url: str, token: str | None,
             as_json: bool) -> None:
    """Withdraw pool items through the API (admin token) and list the checkpoints that used them.

    \b
    Examples:
      t3ar withdraw POOL_ID...                 # single pool images
      t3ar withdraw --contribution JOB_ID      # all the images a job's target contributed
    With --readapt, every affected job is re-run against the pool without them.
    """
    if not pool_ids and not contributions:
        raise click.UsageError("name pool ids to withdraw, or --contribution JOB_ID")
    if not as_json:
        click.echo(f"withdrawing with {_token_source(token)}", err=True)
    results: list[Any] = []
    lines: list[str] = []
    with ApiClient(url, token) as client:
        affected: dict[str, None] = {}
        for job_id in contributions:
            out = client.withdraw_contribution(job_id)
            results.append(out)
            lines.append(f"withdrew the contribution of job {job_id} ({len(out.withdrawn)} pool image(s), "
                         f"source {out.source}): used by {len(out.jobs)} later finished job(s)"
                         + "".join(f"\n  {j.job_id}  {j.checkpoint_url}" for j in out.jobs)
                         + (f"\n  running now (may have used them): {', '.join(out.in_flight)}"
                            if out.in_flight else ""))
            affected.update({j.job_id: None for j in out.jobs})
        for pid in pool_ids:
            gone = client.delete_pool_item(pid)
            results.append(gone)
            lines.append(f"withdrew {pid}: used by {len(gone.jobs)} finished job(s)"
                         + "".join(f"\n  {j.job_id}  {j.checkpoint_url}" for j in gone.jobs)
                         + (f"\n  running now (may have used it): {', '.join(gone.in_flight)}"
                            if gone.in_flight else ""))
            affected.update({j.job_id: None for j in gone.jobs})
        if readapt:
            for job_id in affected:
                acc = client.readapt(job_id)
                lines.append(f"readapt of {job_id} queued as {acc.id}")
                results.append({"readapt_of": job_id, **acc.model_dump(mode="json", exclude_unset=True)})
        elif affected:
            lines.append(f"{len(affected)} finished job(s) used what was withdrawn: their checkpoints still carry "
                         "it. Re-adapt them against the pool without it: `t3ar jobs readapt JOB_ID` for each, or "
                         "run this withdrawal with --readapt")
    echo_result(as_json, results, "\n".join(lines))


def _token_source(token: str | None) -> str:
    """Which token a command uses, in words: given with --token, or from which environment variable (never the
    token itself)."""
    import os

    if not token:
        return "no token (set T3AR_API_ADMIN_TOKEN or pass --token)"
    if click.get_current_context().get_parameter_source("token") == click.core.ParameterSource.COMMANDLINE:
        return "the token given with --token"
    for env, name in (("T3AR_API_ADMIN_TOKEN", "the admin token"), ("T3AR_API_TOKEN", "the user token")):
        if os.environ.get(env) == token:
            return f"{name} from {env}"
    return "the token from the environment"


@click.group("t3ar-api")
def standalone() -> None:
    """These commands without the rest of the CLI (``python -m t3ar.cli.job_cmd ...``)."""


for _cmd in (submit, jobs, models, withdraw):
    standalone.add_command(_cmd)

if __name__ == "__main__":
    standalone()
