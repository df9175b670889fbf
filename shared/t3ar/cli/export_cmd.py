"""``t3ar export``: a checkpoint as ONNX or safetensors, for serving; checked for parity before it is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from t3ar.cli.common import domain_errors, emit, json_option

FORMAT_CHOICES = ("onnx", "safetensors")  # t3ar.export.FORMATS, without importing torch for --help


def _summary(p: dict[str, Any]) -> str:
    parity = p["parity"]
    same = round(parity["top1_agreement"] * parity["images"])
    return (f"wrote {p['path']} ({p['format']}, {p['size'] / 1e6:.1f} MB, sha256 {p['sha256'][:16]}...)\n"
            f"parity on {parity['images_source']}: max abs logit diff {parity['max_abs_diff']:.2e} "
            f"(limit {parity['tolerance']:.0e}), top-1 agreement {same}/{parity['images']} "
            f"({100 * parity['top1_agreement']:.1f}%)")


@click.command("export")
@click.argument("checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMAT_CHOICES), required=True,
              help="onnx: the whole classifier, uint8 NHWC images in, logits out (preprocessing inside); "
                   "safetensors: the weights plus spec and lineage as metadata (t3ar loads it as a checkpoint).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="File to write.")
@click.option("--images", type=click.Path(exists=True, path_type=Path), default=None,
              help="Images to check parity on (a folder or archive, e.g. the target): the first 64. Default: 64 "
                   "generated pictures (deterministic).")
@json_option
@domain_errors
def export_cmd(checkpoint: Path, fmt: str, out: Path, images: Path | None, as_json: bool) -> None:
    """Export CHECKPOINT (a t3ar .pt or .safetensors file) as ONNX or safetensors.

    The exported model is run on 64 images before anything is written: its logits must be within 1e-3 of the
    checkpoint's and give the same top-1 class for every image; both figures are printed. When they do not hold,
    the command fails and leaves nothing at --out.

    \b
    Examples:
      t3ar export runs/adapted.pt --format onnx --out runs/adapted.onnx --images data/twitter-subset
      t3ar export runs/adapted.pt --format safetensors --out runs/adapted.safetensors
    """
    from t3ar.export import export_checkpoint
    from t3ar.export.probe import images_for_parity
    from t3ar.models.checkpoint import read_info

    given = None
    source = ""
    if images is not None:
        given, source = images_for_parity(read_info(checkpoint).spec.image_size, images)
    report = export_checkpoint(checkpoint, fmt, out, images=given, images_source=source)
    emit(report.as_dict(), as_json, _summary)
