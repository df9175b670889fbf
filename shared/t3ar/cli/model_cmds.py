"""`t3ar train-source`, `t3ar adapt`, `t3ar evaluate`: the method, in-process."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from pydantic import ValidationError

from t3ar.acceptance import DEFAULT_RULE
from t3ar.acceptance_options import candidate_config, candidate_names, parse_options
from t3ar.cli.common import (
    MethodChoice,
    StepBar,
    device_option,
    domain_errors,
    emit,
    holdout_options,
    json_option,
    pct,
)
from t3ar.cli.json_arg import json_object
from t3ar.clients.job_report import AcceptanceRecord, acceptance_table, labelled_summary
from t3ar.data.pool_labels import resolve_pool_labels
from t3ar.errors import DatasetError
from t3ar.method import config as method_config
from t3ar.method.config import AdaptConfig, error_lines
from t3ar.method.presets import DEFAULT_METHOD, DEFAULT_PRESET, PRESET_NAMES, with_default

if TYPE_CHECKING:
    from t3ar.data.datasets import ImageSet

# torch and the models load inside the commands: `t3ar` starts every command, services included, and the
# retriever's process must not carry torch it does not use (~0.6 GB resident).

log = logging.getLogger(__name__)


#: CLI defaults = the configs' defaults (the first registered method's that has the option)
_D = {name: f.default for cls in reversed(method_config.config_classes()) for name, f in cls.flat_fields().items()}


def _groups(value: str) -> int | None:
    return None if value == "all" else int(value)


def _defaulted(param: str) -> bool:
    """The current command's option ``param`` was not given (its value is the default)."""
    return click.get_current_context().get_parameter_source(param) == ParameterSource.DEFAULT


@click.command("train-source")
@click.option("--data", type=click.Path(exists=True, path_type=Path), required=True,
              help="Labelled source dataset: ImageFolder dir, .zip/.tar(.gz) of one, or path,label CSV.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Checkpoint file to write.")
@click.option("--arch", default="efficientnet_lite0", show_default=True,
              help="efficientnet_lite0 | efficientnet_lite1 | efficientnet_lite2 | mobilenetv2_100 (packaged "
                   "weights) | timm:<arch> | clip:<model>.")
@click.option("--weights", default=None, help="Local weights file (timm state dict or open_clip checkpoint).")
@click.option("--pretrained", default=None, help="open_clip pretrained tag (needs the weights cached).")
@click.option("--image-size", default=96, show_default=True, type=click.IntRange(16, 1024))
@click.option("--epochs", default=15, show_default=True, type=click.IntRange(1, 1000))
@click.option("--lr", default=0.02, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(2, 4096))
@click.option("--train-groups", default="2", show_default=True,
              help="How many final backbone stages train ('all' for every one).")
@click.option("--val-fraction", default=0.2, show_default=True, type=click.FloatRange(0, 0.9),
              help="Stratified held-out share for the reported validation accuracy (0 = none).")
@click.option("--seed", default=0, show_default=True, type=int)
@device_option
@json_option
@domain_errors
def train_source(data: Path, out: Path, arch: str, weights: str | None, pretrained: str | None,
                 image_size: int, epochs: int, lr: float, batch_size: int, train_groups: str,
                 val_fraction: float, seed: int, device: str, as_json: bool) -> None:
    """Fine-tune a pretrained backbone on labelled source data: the base model f_S.

    \b
    Example:
      t3ar train-source --data data/emoji/google --out runs/source.pt --epochs 15
    """
    from t3ar.data.datasets import load_tensors, read_labelled, stratified_subsample
    from t3ar.device import resolve_device, seed_everything
    from t3ar.method.augment import Normalizer
    from t3ar.method.evaluate import evaluate
    from t3ar.method.supervised import TrainConfig, train_supervised
    from t3ar.models.backbones import parse_backbone
    from t3ar.models.checkpoint import Lineage, save_checkpoint
    from t3ar.models.classifier import ModelSpec, build_classifier

    dev = resolve_device(device)
    gen = seed_everything(seed)
    ds = read_labelled(data)
    assert ds.labels is not None and ds.classes is not None
    val_idx = stratified_subsample(ds.labels, len(ds), val_fraction, seed) if val_fraction > 0 else []
    held = set(val_idx)
    train_idx = [i for i in range(len(ds)) if i not in held]
    spec = ModelSpec(backbone=parse_backbone(arch, weights_path=weights, pretrained_tag=pretrained),
                     classes=tuple(ds.classes), image_size=image_size)
    model = build_classifier(spec).to(dev)
    images = load_tensors(ds, image_size)
    import torch

    labels = torch.tensor(ds.labels, dtype=torch.long)
    cfg = TrainConfig(epochs=epochs, lr=lr, batch_size=batch_size, train_groups=_groups(train_groups), seed=seed)
    bar = StepBar("train-source", enabled=not as_json)
    res = train_supervised(model, images[train_idx], labels[train_idx], cfg, mean=spec.backbone.mean,
                           std=spec.backbone.std, device=dev, generator=gen, on_step=bar)
    bar.close()
    metrics: dict[str, Any] = {"train_size": len(train_idx), "val_size": len(val_idx),
                               "seconds": round(res.seconds, 2), "seconds_per_epoch": round(res.seconds_per_epoch, 2)}
    if val_idx:
        norm = Normalizer(spec.backbone.mean, spec.backbone.std, dev)
        metrics["val"] = evaluate(model, images[val_idx], labels[val_idx], spec.classes, norm)
    sha = save_checkpoint(out, model, spec, lineage=Lineage(method="source"),
                          metrics={**metrics, "train_config": cfg.model_dump()})
    payload = {"checkpoint": str(out), "sha256": sha, "classes": len(spec.classes), **metrics}
    emit(payload, as_json, lambda p: (
        f"wrote {p['checkpoint']} ({p['classes']} classes, {p['train_size']} train images, "
        f"{p['seconds_per_epoch']} s/epoch)"
        + (f"; held-out accuracy {pct(p['val']['top1'])} on {p['val_size']}" if "val" in p else "")))


def _read_target(path: Path, need_labels: bool) -> ImageSet:
    from t3ar.data.datasets import read_labelled, read_unlabelled

    if need_labels:
        return read_labelled(path)
    try:
        return read_labelled(path)  # labels, when present, are used for evaluation only
    except DatasetError:
        return read_unlabelled(path)


@click.command("adapt")
@click.option("--model", "model_path", type=click.Path(exists=True, path_type=Path), required=True,
              help="Base checkpoint (from train-source).")
@click.option("--target", type=click.Path(exists=True, path_type=Path), required=True,
              help="Target images: folder or archive (class folders are used for evaluation only).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Adapted checkpoint to write.")
@click.option("--pool", type=click.Path(exists=True, path_type=Path), default=None,
              help="Auxiliary pool (folder/archive of images) for t3ar / t3ar-random.")
@click.option("--pool-labels", default=None, metavar="folders|FILE.csv",
              help="Class labels of the --pool images: 'folders' (an image under POOL/<class>/ carries <class>, a "
                   "loose one none) or a CSV of path,label rows. A label that is not one of the model's classes "
                   "counts as none. Labelled neighbours serve as data when the config's pool_label_weight > 0.")
@click.option("--method", type=MethodChoice(), default=None,
              help="Adaptation method [default: the method benchmark's choice, "
                   f"{DEFAULT_METHOD['test']} (test time) / {DEFAULT_METHOD['train']} (train time)].")
@click.option("--preset", type=click.Choice(PRESET_NAMES), default=None,
              help=f"T3AR family: a named configuration (paper | validated); default {DEFAULT_PRESET}, the one "
                   "the method benchmark chose. Options given here win over the preset's.")
@click.option("--k", default=_D["k"], show_default=True, type=int, help="Retrieved neighbours per target image.")
@click.option("--r", default=_D["r"], show_default=True, type=int, help="Dedup ratio: sample k of the top r*k.")
@click.option("--epochs", default=_D["epochs"], show_default=True, type=int)
@click.option("--min-steps", default=_D["min_steps"], show_default=True, type=int)
@click.option("--batch-size", default=_D["batch_size"], show_default=True, type=int)
@click.option("--lr", default=_D["lr"], show_default=True, type=float)
@click.option("--fraction", default=_D["fraction"], show_default=True, type=float, help="Share of T adapted on.")
@click.option("--labels", "use_labels", is_flag=True, help="Train-time mode: use the target's labels.")
@click.option("--eval", "eval_path", type=click.Path(exists=True, path_type=Path), default=None,
              help="Held-out labelled set to report accuracy on (default: the whole target, if labelled).")
@click.option("--train-groups", default=str(_D["train_groups"]), show_default=True,
              help="How many final backbone stages train ('all' for every one).")
@click.option("--bank-size", default=_D["bank_size"], show_default=True, type=int)
@click.option("--retriever", default="efficientnet_lite0", show_default=True,
              help="Embedder R for the pool: efficientnet_lite0 | efficientnet_lite1 | efficientnet_lite2 "
                   "(packaged weights) | clip:<model> | timm:<arch>.")
@click.option("--retriever-weights", default=None, help="Local weights file for R.")
@click.option("--retriever-tag", default=None, help="open_clip pretrained tag for R.")
@click.option("--retriever-image-size", default=96, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--config", "config_json", default="{}", show_default=True,
              help='JSON object of any other AdaptConfig fields, e.g. \'{"dedup_threshold": 0.95, '
                   '"false_negatives": "mask"}\'.')
@click.option("--contribute", is_flag=True,
              help="After a successful run, copy the target images into the --pool folder as target-<run id>/ "
                   "(exact and R's near-duplicates of pool images skipped); delete that folder to withdraw them.")
@click.option("--run-id", default=None, help="Id of this run's contribution (default: the checkpoint's sha256[:16]).")
@click.option("--contribute-threshold", default=0.98, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Cosine (R) at or above which a target image is a near-duplicate of a pool image.")
@holdout_options(scored=". The candidates are scored on it and the winner is written.", method="--method",
                 no_gain="fail (write nothing)", rule_default=DEFAULT_RULE,
                 rule_help="paired = the simpler candidate unless a paired 95 % CI favours another; argmax = the "
                           "highest top-1 (ties to the simpler).")
@device_option
@json_option
@domain_errors
def adapt_cmd(model_path: Path, target: Path, out: Path, pool: Path | None, pool_labels: str | None,
              method: str | None, preset: str | None,
              k: int, r: int,
              epochs: int, min_steps: int, batch_size: int, lr: float, fraction: float, use_labels: bool,
              eval_path: Path | None, train_groups: str, bank_size: int, retriever: str,
              retriever_weights: str | None, retriever_tag: str | None, retriever_image_size: int, seed: int,
              config_json: str, contribute: bool, run_id: str | None, contribute_threshold: float,
              holdout: Path | None, candidates: str, require_gain: bool, winner_rule: str, device: str,
              as_json: bool) -> None:
    """Adapt a base model to target data (in-process; the pool is indexed in memory with faiss).

    \b
    Example (test-time, 10% of the target, 5 retrieved negatives per image):
      t3ar adapt --model runs/source.pt --target data/emoji/twitter --pool data/pool \\
                 --method t3ar --k 5 --fraction 0.1 --epochs 10 --out runs/t3ar.pt
    """
    from t3ar.data.datasets import read_labelled, read_unlabelled
    from t3ar.device import resolve_device
    from t3ar.embedder import Embedder, EmbedderSpec
    from t3ar.local_pool import LocalPool
    from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
    from t3ar.pipeline import run_adaptation

    extra = json_object(config_json, "--config")
    options = {"k": k, "r": r, "epochs": epochs, "min_steps": min_steps, "batch_size": batch_size, "lr": lr,
               "fraction": fraction, "train_groups": _groups(train_groups), "bank_size": bank_size, "seed": seed}
    # options left at their defaults (AdaptConfig's own) are not given, so that a preset's values apply
    given = {name: v for name, v in options.items() if not _defaulted(name)}
    fields = {**({"method": method} if method else {}), "mode": "train" if use_labels else "test", **given,
              **({"preset": preset} if preset else {}), **extra}
    try:
        cfg = AdaptConfig.model_validate(with_default(fields))
    except ValidationError as e:
        raise click.BadParameter("; ".join(error_lines(e)), param_hint="--config / options") from e
    method = cfg.method  # the default's when none was given
    accept = parse_options(candidates, require_gain, winner_rule)
    if holdout is None and (candidates or require_gain):
        raise click.UsageError("--candidates and --require-gain decide on a holdout: pass --holdout DIR")
    retrieving = cfg.uses_retrieval or (holdout is not None and any(
        candidate_config(cfg, name).uses_retrieval for name in candidate_names(accept, cfg)))
    if contribute and (pool is None or not pool.is_dir()):
        raise click.UsageError("--contribute adds the target to the pool folder: pass --pool DIR (a folder)")
    dev = resolve_device(device)
    model, info = load_checkpoint(model_path, device=dev)
    tgt = _read_target(target, use_labels)
    ev = read_labelled(eval_path) if eval_path else None
    provider = None
    if retrieving or contribute:
        if pool is None:
            raise click.UsageError(f"--method {method} (or a candidate) retrieves from a pool: pass --pool DIR")
        emb = Embedder(EmbedderSpec.parse(retriever, weights_path=retriever_weights, pretrained_tag=retriever_tag,
                                          image_size=retriever_image_size), device=dev)
        pool_set = read_unlabelled(pool)
        if holdout is not None and retrieving:  # a retrieval candidate must not draw a holdout image
            from t3ar.data.holdout import image_digests, read_holdout, refuse_pooled

            held = read_holdout(holdout).images
            refuse_pooled(dict(zip(held.ids, image_digests(held), strict=True)),
                          {sha: pid for pid, sha in zip(pool_set.ids, image_digests(pool_set), strict=True)})
        provider = LocalPool.from_imageset(pool_set, emb, labels=_local_pool_labels(pool, pool_set, pool_labels))
    bar = StepBar(f"adapt:{method}", enabled=not as_json)
    record: AcceptanceRecord | None = None
    if holdout is not None:
        from t3ar.acceptance import gain_refusal
        from t3ar.candidates import run_candidates
        from t3ar.data.holdout import MAX_HOLDOUT_IMAGES, read_holdout

        done = run_candidates(model, info, tgt, cfg, accept, read_holdout(holdout), provider=provider, device=dev,
                              on_step=bar, eval_set=ev, max_holdout=MAX_HOLDOUT_IMAGES)
        bar.close()
        record = done.record(require_gain=require_gain)
        if require_gain and (why := gain_refusal(done.acceptance)) is not None:
            click.echo("\n".join(acceptance_table(record)), err=True)
            raise click.ClickException(why)
        outcome, cfg = done.winner.outcome, done.winner.config
    else:
        outcome = run_adaptation(model, info, tgt, cfg, provider=provider if cfg.uses_retrieval else None,
                                 device=dev, eval_set=ev, on_step=bar)
        bar.close()
    metrics = outcome.checkpoint_metrics()
    if record is not None:
        metrics["acceptance"] = record.model_dump(mode="json")  # in the checkpoint and its ONNX / safetensors metadata
    sha = save_checkpoint(out, model, info.spec, adapt_config=cfg.model_dump(), lineage=outcome.lineage,
                          metrics=metrics)
    payload = {"checkpoint": str(out), "sha256": sha, "method": cfg.method, "adapted_on": outcome.lineage.target_size,
               "pool_ids_used": len(outcome.lineage.pool_ids), **metrics,
               "labelled_neighbours": [asdict(u) for u in outcome.labelled_neighbours]}
    if contribute:
        from t3ar.local_contribute import contribute_local

        assert pool is not None and provider is not None
        payload["contribution"] = contribute_local(pool, list(tgt.paths), run_id or sha[:16], provider,
                                                   threshold=contribute_threshold)
    emit(payload, as_json, _adapt_summary)


def _local_pool_labels(pool: Path, pool_set: ImageSet, spec: str | None) -> list[str | None] | None:
    """The labels of a local pool's images under ``--pool-labels`` (paths relative to the pool folder, or to the
    extracted archive's root); None without the option."""
    if spec is None:
        return None
    base = pool if pool.is_dir() else pool_set.root
    rels = [_relative(p, base) or pid for p, pid in zip(pool_set.paths, pool_set.ids, strict=True)]
    resolved = resolve_pool_labels(rels, spec)
    log.info("local pool: %d of %d images carry a label (%s)", resolved.labelled, len(rels), spec)
    return resolved.labels


def _relative(path: Path, base: Path | None) -> str | None:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix() if base is not None else None
    except ValueError:
        return None


def _adapt_summary(p: dict[str, Any]) -> str:
    line = (f"wrote {p['checkpoint']} ({p['method']}, {p['adapted_on']} target images, {p['steps']} steps, "
            f"{p['seconds_per_epoch']} s/epoch, {p['pool_ids_used']} pool images used)")
    if "collapse_fallback_step" in p:
        line += (f"\ncollapse detected after step {p['collapse_fallback_step']}: the checkpoint is the bn-adapt state "
                 "(collapse_fallback)")
    if "before" in p:
        line += f"\naccuracy {pct(p['before']['top1'])} -> {pct(p['after']['top1'])} on {p['after']['n']} images"
    if p.get("labelled_neighbours"):
        line += "\n" + labelled_summary(p["labelled_neighbours"])
    if p.get("acceptance"):
        line += "\n" + "\n".join(acceptance_table(AcceptanceRecord.model_validate(p["acceptance"])))
    if c := p.get("contribution"):
        line += (f"\n{'already contributed' if c['repeated'] else 'contributed'} {c['added']} of {c['images']} "
                 f"target images to the pool as {c['source']} ({c['skipped_exact']} exact and {c['skipped_near']} "
                 "near-duplicates skipped)")
    return line


@click.command("evaluate")
@click.option("--model", "model_path", type=click.Path(exists=True, path_type=Path), required=True)
@click.option("--data", type=click.Path(exists=True, path_type=Path), required=True,
              help="Labelled dataset (ImageFolder dir, archive or CSV) whose classes the model knows.")
@click.option("--per-class", is_flag=True, help="Also print per-class accuracy.")
@click.option("--batch-size", default=256, show_default=True, type=int)
@device_option
@json_option
@domain_errors
def evaluate_cmd(model_path: Path, data: Path, per_class: bool, batch_size: int, device: str,
                 as_json: bool) -> None:
    """Top-1 and per-class accuracy of a checkpoint on a labelled dataset.

    \b
    Example:
      t3ar evaluate --model runs/t3ar.pt --data data/emoji/twitter --per-class
    """
    from t3ar.data.datasets import load_tensors, read_labelled
    from t3ar.device import resolve_device
    from t3ar.method.augment import Normalizer
    from t3ar.method.evaluate import evaluate
    from t3ar.models.checkpoint import load_checkpoint
    from t3ar.pipeline import labels_for_model

    dev = resolve_device(device)
    model, info = load_checkpoint(model_path, device=dev)
    ds = read_labelled(data)
    y = labels_for_model(ds, info.spec.classes)
    x = load_tensors(ds, info.spec.image_size)
    norm = Normalizer(info.spec.backbone.mean, info.spec.backbone.std, dev)
    report = evaluate(model, x, y, info.spec.classes, norm, batch_size)
    payload = {"checkpoint": str(model_path), "data": str(data), **report}

    def human(p: dict[str, Any]) -> str:
        s = f"top-1 {pct(p['top1'])}, mean per-class {pct(p['mean_class_accuracy'])} on {p['n']} images"
        if per_class:
            s += "".join(f"\n  {c:30s} {pct(v['accuracy']):>7s}  (n={v['n']})" for c, v in p["per_class"].items())
        return s

    emit(payload, as_json, human)
