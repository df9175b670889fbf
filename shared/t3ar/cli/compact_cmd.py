"""``t3ar pool compact``: remove near-duplicates from the pool through the adaptation API (admin token), so every
removal is an ordinary withdrawal whose lineage is answered. Dry-run by default."""

from __future__ import annotations

import click

from t3ar.cli.common import echo_result, service_options
from t3ar.clients.api import ApiClient
from t3ar.clients.api_models import CompactResponse

DEFAULT_API_URL = "http://127.0.0.1:8700"


def _human(out: CompactResponse) -> str:
    rows = out.remove
    mib = out.bytes_freed / 2**20
    if out.dry_run:
        head = (f"dry-run (nothing removed): {len(rows)} near-duplicate(s) of {out.sources} at cosine >= "
                f"{out.threshold} would be removed, freeing {mib:.2f} MiB; {out.clusters} item(s) kept for "
                f"them; {out.scanned} scanned of {out.items} ({out.method}, "
                f"{out.seconds.get('total', 0):.1f} s)")
    else:
        head = f"removed {len(rows)} item(s), freed {mib:.2f} MiB (plan {out.plan_id})"
    lines = [head] + [f"  {r.id}  ({r.source}, {r.size} B)  duplicate of {r.duplicate_of}  "
                      f"cosine {r.score:.4f}" for r in rows[:50]]
    if len(rows) > 50:
        lines.append(f"  ... and {len(rows) - 50} more (--json lists all)")
    if out.dry_run:
        lines.append(f"plan {out.plan_id}: remove exactly these with  t3ar pool compact --apply {out.plan_id}")
    else:
        lines += [f"used by finished job {j.job_id}: readapt with {j.readapt_url}" for j in out.jobs]
    return "\n".join(lines)


@click.command("compact")
@click.option("--threshold", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Cosine (R's embedding) at or above which two items are near-duplicates, in (0, 1].")
@click.option("--source", "sources", multiple=True,
              help="A source whose items may be removed (repeatable; a trailing * matches a prefix, e.g. "
                   "'target:*' = every contributed target). Items of other sources always stay.")
@click.option("--nprobe", type=click.IntRange(1, 1024), default=2, show_default=True,
              help="IVF cells probed per item (pools above 20k items are scanned through an IVF index).")
@click.option("--apply", "plan_id", default=None, metavar="PLAN_ID",
              help="Remove exactly what this dry-run listed (nothing else; refused if the pool changed since).")
@click.option("--yes", is_flag=True, help="Dry-run, then apply that very plan at once.")
@click.option("--timeout", type=float, default=3600.0, show_default=True,
              help="Seconds to wait for the answer (a scan of a large pool takes minutes).")
@service_options("API", "T3AR_API_URL", DEFAULT_API_URL, ["T3AR_API_ADMIN_TOKEN"])
def compact(threshold: float | None, sources: tuple[str, ...], nprobe: int, plan_id: str | None, yes: bool,
            timeout: float, url: str, token: str | None, as_json: bool) -> None:
    """Find near-duplicates in the pool and (with --apply or --yes) remove them, keeping one item per cluster.

    \b
    Examples:
      t3ar pool compact --threshold 0.97 --source 'target:*'     # dry-run: what would go, bytes freed
      t3ar pool compact --apply PLAN_ID                          # remove exactly that list
    """
    if plan_id is not None and (threshold is not None or sources or yes):
        raise click.UsageError("--apply takes the plan as listed: give no --threshold, --source or --yes")
    if plan_id is None and (threshold is None or not sources):
        raise click.UsageError("a dry-run needs --threshold and at least one --source (what may be removed)")
    with ApiClient(url, token, timeout=timeout) as client:
        if plan_id is None:
            out = client.compact(threshold=threshold, sources=list(sources), nprobe=nprobe)
            if not yes:
                echo_result(as_json, out, _human(out))
                return
            click.echo(_human(out), err=True)
            plan_id = out.plan_id
        applied = client.compact(plan_id=plan_id)
        echo_result(as_json, applied, _human(applied))
