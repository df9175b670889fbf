"""``t3ar bench speed``: the cost of one adaptation step, per method, relative to a plain supervised step.

Same model (the packaged ImageNet EfficientNet-Lite0 with a 96-class head), same real images (a slice of the
Twitter emoji style at 64 px), same batch, on each device asked for. Supervised fine-tuning, T3AR without
retrieval, AdaContrast and T3AR (k retrieved clipart neighbours per image) run interleaved in lock-step
(:func:`interleaved`: one step of each in turn, so a change in machine load hits all alike; the order reversed
every other round), for a warm-up round and then ``rounds`` timed rounds of one epoch each; the first step of
every run (its set-up) is never timed. Each ratio is the method's step throughput over the supervised step's.
A torch.profiler table of one T3AR step per device says where the time goes.

The data (target slice, its retrieved neighbours and their decoded pool images) is prepared once from the
data kits and cached as one tensor file, so a GPU machine without the kits can run from it (``--data``).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from t3ar.cpu_memory import retain_freed_memory
from t3ar.device import seed_everything
from t3ar.method import config as method_config
from t3ar.method.adapt import StepStats, adapt
from t3ar.method.ahead import enabled as ahead_enabled
from t3ar.method.config import AdaptConfig, train_groups, trained, validate
from t3ar.method.contrastive import joint_enabled
from t3ar.method.supervised import TrainConfig, train_supervised
from t3ar.models.backbones import PRESETS
from t3ar.models.classifier import Classifier, ModelSpec, build_classifier
from t3ar.models.fold import FOLD

log = logging.getLogger(__name__)

METHODS: tuple[str, ...] = ("supervised", "t3ar-noretrieval", "adacontrast", "t3ar")
#: approximation options, measured as arms of their own ("method+option") on the devices they apply to; their
#: ratios are stated apart and never count toward a goal by themselves
APPROXIMATIONS: dict[str, tuple[str, ...]] = {"cpu": ("t3ar+cpu_bf16_nograd",), "cuda": ()}
#: what each arm option ("method+option") sets: an approximation (above) or a variant (below)
OPTIONS: dict[str, dict[str, bool]] = {"cpu_bf16_nograd": {"cpu_bf16_nograd": True}}
#: side-by-side variants of the default step (``--variant NAME``): one setting changed, arms "method+NAME" for the
#: methods it concerns; stated apart, each beside the default step (what the default's setting buys on a device)
VARIANTS: dict[str, tuple[dict[str, bool], tuple[str, ...], str]] = {
    "views_ahead": ({"views_ahead": True}, ("supervised", "t3ar-noretrieval", "t3ar"),
                    "views made one step ahead (`views_ahead` on)"),
    "views_inline": ({"views_ahead": False}, ("supervised", "t3ar-noretrieval", "t3ar"),
                     "views made inline (`views_ahead` off)"),
    "joint_pass": ({"joint_pass": True}, ("t3ar-noretrieval", "t3ar"),
                   "the queries in the no-gradient pass, one forward per step (`joint_pass` on)"),
    "separate_passes": ({"joint_pass": False}, ("t3ar-noretrieval", "t3ar"),
                        "the queries' forward apart from the no-gradient pass (`joint_pass` off)"),
}
OPTIONS.update({name: settings for name, (settings, _, _) in VARIANTS.items()})
StepFn = Callable[[StepStats], None]


@dataclass
class SpeedData:
    """Target images with labels, their retrieved neighbours (local indices) and those pool images."""

    target: torch.Tensor  # uint8 [N, 3, S, S]
    labels: torch.Tensor  # [N] long
    classes: list[str]
    neighbours: torch.Tensor  # [N, k] long into pool_images
    pool_images: torch.Tensor  # uint8 [P, 3, S, S]
    pool_size: int  # size of the pool searched
    seconds_retrieval: float

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(self.__dict__, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> SpeedData:
        return cls(**torch.load(path, weights_only=True))


def prepare_data(work: Path, cache: Path, *, n_images: int, k: int, r: int = 5, pool_cap: int = 3000,
                 size: int = 64, device: torch.device | None = None) -> SpeedData:
    """From the data kits (built or reused under ``work``): Twitter emoji as the target, OpenClipart + Tux Paint
    as the pool, neighbours by the packaged ImageNet retriever (exact inner product, top r·k, k sampled)."""
    from t3ar.data.images import open_image, to_tensor_uint8
    from t3ar.embedder import Embedder, EmbedderSpec
    from t3ar.method.retrieval import dedup_sample
    from t3ar_bench.method.data import build_kits, load_style, pool_components

    key = hashlib.sha256(f"{n_images}|{k}|{r}|{pool_cap}|{size}".encode()).hexdigest()[:12]
    path = work / "speed" / f"data-{key}.pt"
    if path.is_file():
        return SpeedData.load(path)
    kits = build_kits(work, cache)
    style = load_style(kits.emoji, "twitter", size)
    pick = torch.randperm(len(style.labels), generator=torch.Generator().manual_seed(0))[:n_images]
    comps = pool_components(kits, [], pool_cap)
    paths = [p for c in comps.values() for p in c.paths]
    t0 = time.perf_counter()
    pool = torch.stack([to_tensor_uint8(open_image(p), size) for p in paths])
    emb = Embedder(EmbedderSpec(image_size=size), device or torch.device("cpu"))
    q, a = torch.from_numpy(emb.embed(style.images[pick])), torch.from_numpy(emb.embed(pool))
    cand = (q @ a.T).topk(k * r, dim=1).indices
    picked = dedup_sample(cand, k, torch.Generator().manual_seed(0))
    distinct, local = torch.unique(picked, return_inverse=True)
    data = SpeedData(style.images[pick], style.labels[pick], style.classes, local, pool[distinct], len(pool),
                     time.perf_counter() - t0)
    data.save(path)
    log.info("speed data: %d target images, %d distinct neighbours from a pool of %d", n_images, len(distinct),
             len(pool))
    return data


def interleaved(runs: Mapping[str, Callable[[StepFn], object]]) -> dict[str, tuple[list[float], list[StepStats]]]:
    """Run training loops in lock-step — one step of each in turn — and time every step (wall seconds).

    Each ``runs[name](on_step)`` runs in its own thread, but a baton passed in ``on_step`` lets only one of
    them compute at any time. The first step (which also covers the run's set-up) is dropped. Exceptions are
    re-raised after every thread finished.
    """
    names = list(runs)
    cond = threading.Condition()
    current: list[str | None] = [names[0] if names else None]
    done: set[str] = set()
    out: dict[str, tuple[list[float], list[StepStats]]] = {n: ([], []) for n in names}
    errors: list[BaseException] = []

    def following(name: str) -> str | None:
        i = names.index(name)
        return next((c for j in range(1, len(names) + 1) if (c := names[(i + j) % len(names)]) not in done), None)

    def worker(name: str) -> None:
        resumed = [0.0]

        def take_turn() -> None:
            with cond:
                cond.wait_for(lambda: current[0] == name)
            resumed[0] = time.perf_counter()

        def on_step(stats: StepStats) -> None:
            out[name][0].append(time.perf_counter() - resumed[0])
            out[name][1].append(stats)
            with cond:
                current[0] = following(name)
                cond.notify_all()
            take_turn()

        try:
            take_turn()
            runs[name](on_step)
        except BaseException as exc:  # noqa: B036 - re-raised in the caller's thread
            errors.append(exc)
        finally:
            with cond:
                done.add(name)
                if current[0] == name:
                    current[0] = following(name)
                cond.notify_all()

    threads = [threading.Thread(target=worker, args=(n,), name=f"speed-{n}") for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {n: (w[1:], st[1:]) for n, (w, st) in out.items()}


def make_model(classes: list[str], size: int, device: torch.device) -> tuple[Classifier, ModelSpec]:
    spec = ModelSpec(backbone=PRESETS["efficientnet_lite0"], classes=tuple(classes), image_size=size)
    torch.manual_seed(0)  # the head's initialisation
    return build_classifier(spec).to(device), spec


def _runner(method: str, model: Classifier, spec: ModelSpec, data: SpeedData, device: torch.device, seed: int,
            batch_size: int, k: int) -> Callable[[StepFn], object]:
    b = spec.backbone

    name, *options = method.split("+")
    settings = {key: value for o in options for key, value in OPTIONS[o].items()}

    def run(on_step: StepFn) -> object:
        m = copy.deepcopy(model)
        if name == "supervised":
            tc = TrainConfig(epochs=1, batch_size=batch_size, lr=1e-3, seed=seed, **settings)
            return train_supervised(m, data.target, data.labels, tc, mean=b.mean, std=b.std, device=device,
                                    generator=seed_everything(seed), on_step=on_step)
        own_k = {"k": k} if "k" in method_config.config_class(name).flat_fields() else {}
        cfg = AdaptConfig.model_validate({"method": name, **own_k, "epochs": 1, "batch_size": batch_size,
                                          "seed": seed, **settings})
        return adapt(m, data.target, cfg, mean=b.mean, std=b.std, neighbours=data.neighbours[:, :k],
                     pool_images=data.pool_images, device=device, generator=seed_everything(seed), on_step=on_step)

    return run


def profile_step(model: Classifier, spec: ModelSpec, data: SpeedData, device: torch.device, *, batch_size: int,
                 k: int, rows: int = 12) -> dict[str, str]:
    """torch.profiler tables of the 3rd step of a T3AR run: top operators by self time on the device
    (``device``), and on CUDA also by self time on the host (``host``: where a launch-bound step's time goes)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sorts = {"device": "self_cuda_time_total", "host": "self_cpu_time_total"} if device.type == "cuda" \
        else {"device": "self_cpu_time_total"}
    tables: dict[str, str] = {}

    def ready(p: Any) -> None:
        averages = p.key_averages()
        tables.update({name: averages.table(sort_by=sort, row_limit=rows) for name, sort in sorts.items()})

    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=1), on_trace_ready=ready) as prof:
        _runner("t3ar", model, spec, data, device, 0, batch_size, k)(lambda _s: prof.step())
    return tables


#: the arm name prefix of a ceiling's no-gradient pass ("nograd:ROWS"), timed in the rounds like a step
NOGRAD = "nograd:"


def _nograd_runner(model: Classifier, rows: int, size: int, device: torch.device, steps: int
                   ) -> Callable[[StepFn], object]:
    """A loop of ``steps`` no-gradient passes alone, each reported as a step: the T3AR step's pass over ``rows``
    images (the batch's strong views and its distinct neighbours), with the same layout, BatchNorm mode, folded
    frozen layers and AMP as in the step. Timed in lock-step with the steps, so that it meets the same machine
    (standalone, a median of 5 once read 0.154 s right after the rounds for a pass of 0.045-0.055 s)."""
    from t3ar.method.adapt import fast_layout, folded_layers
    from t3ar.method.segments import segmented_batch_stats
    from t3ar.models.classifier import configure_trainable, freeze_frozen_norms

    def run(on_step: StepFn) -> object:
        m = copy.deepcopy(model)
        fast_layout(m, device)
        configure_trainable(m, train_groups(trained(validate({"method": "t3ar"}))))
        m.train()
        freeze_frozen_norms(m)
        x = torch.randn(rows, 3, size, size, device=device)
        if device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        with folded_layers(m, device):  # once, as a job does (it traces)
            for step in range(steps):
                with torch.no_grad(), segmented_batch_stats(m, [rows]), \
                        torch.autocast(device.type, enabled=device.type == "cuda"):
                    m.features(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                on_step(StepStats(1, step + 1, steps, 0.0, 0.0))
        return None

    return run


def cpu_ticks() -> tuple[int, int] | None:
    """(all CPU ticks, steal ticks) from /proc/stat (Linux), else None: the hypervisor's share of this machine's
    CPU time over an interval (other guests on the host), which no interleaving can cancel out."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def bank_scan_seconds(feat_dim: int, num_classes: int, filled: int, device: torch.device, *, batch_size: int,
                      k: int, bank_size: int, repeats: int = 7) -> float:
    """Median seconds of one T3AR step's bank work at ``filled`` of ``bank_size`` slots written: pseudo-label
    means, the negative mask, InfoNCE and its backward to the queries, the pool's denominator share."""
    import torch.nn.functional as F

    from t3ar.method import losses
    from t3ar.method.bank import MemoryBank

    gen = torch.Generator().manual_seed(0)
    bank = MemoryBank(bank_size, feat_dim, num_classes, device)
    n_pool = filled // 2
    bank.enqueue(F.normalize(torch.randn(filled - n_pool, feat_dim, generator=gen), dim=1).to(device),
                 torch.randint(0, 1000, (filled - n_pool,), generator=gen).to(device),
                 logits=torch.randn(filled - n_pool, num_classes, generator=gen).to(device))
    bank.enqueue(F.normalize(torch.randn(n_pool, feat_dim, generator=gen), dim=1).to(device),
                 torch.randint(0, 5000, (n_pool,), generator=gen).to(device), from_pool=True)
    ids = torch.arange(batch_size, device=device)
    nbr = torch.randint(0, 5000, (batch_size, k), generator=gen).to(device)
    q0 = F.normalize(torch.randn(batch_size, feat_dim, generator=gen), dim=1).to(device)
    key = F.normalize(torch.randn(batch_size, feat_dim, generator=gen), dim=1).to(device)
    times = []
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        q = q0.clone().requires_grad_(True)
        live = bank.live()
        y = live.mean_logits(ids)[0].argmax(1)
        labels = torch.where(live.from_pool | ~live.valid, 0, live.ids) % num_classes
        neg = losses.negative_mask(live, ids, y, labels, nbr)
        logits = losses.info_nce_logits(q, key, live.feats, neg, 0.07)
        losses.info_nce_from_logits(logits).backward()
        losses.denominator_share(logits.detach(), neg & live.from_pool[None, :])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def measure_device(data: SpeedData, device: torch.device, *, rounds: int, batch_size: int, k: int,
                   methods: tuple[str, ...] | None = None, profile: bool = True,
                   variants: tuple[str, ...] = ()) -> dict[str, Any]:
    """All ``methods`` (default: :data:`METHODS` and the device's :data:`APPROXIMATIONS`, plus the arms of each
    of ``variants`` (:data:`VARIANTS`)) interleaved on ``device``: a warm-up round, then ``rounds`` timed
    rounds."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    variant_arms = tuple(f"{m}+{v}" for v in variants for m in VARIANTS[v][1])
    methods = methods or METHODS + APPROXIMATIONS.get(device.type, ()) + variant_arms
    # the compute ceilings: a supervised step plus the step's no-gradient pass, over the batch's strong views and
    # its distinct neighbours (T3AR) or the strong views alone (no retrieval); everything else, views and bank
    # included, is overhead. The passes run as arms of their own in the rounds.
    per_step = statistics.mean(len(torch.unique(data.neighbours[i:i + batch_size, :k]))
                               for i in range(0, len(data.neighbours) - batch_size + 1, batch_size))
    rows = batch_size + round(per_step)
    passes = tuple(f"{NOGRAD}{n}" for n in dict.fromkeys((rows, batch_size)))
    steps = max(2, len(data.target) // batch_size)  # the first of each arm is never timed
    if device.type == "cpu":
        retain_freed_memory()  # before the runs' threads start: they then share the main malloc arena
    model, spec = make_model(data.classes, data.target.shape[-1], device)
    arms = methods + passes
    walls: dict[str, list[float]] = {m: [] for m in arms}
    stats: dict[str, list[StepStats]] = {m: [] for m in arms}
    round_ratios: dict[str, list[float]] = {m: [] for m in methods if m != "supervised"}
    load0, ticks0 = os.getloadavg()[0], cpu_ticks()
    for r in range(rounds + 1):
        # the lock-step order reversed every other round: no method always runs right after the same one (with a
        # fixed order the first arm ran measurably slower than its twin elsewhere in the order; evicted caches
        # after the heaviest arm are the likely cause, not verified)
        order = arms if r % 2 == 0 else arms[::-1]
        res = interleaved({m: _nograd_runner(model, int(m[len(NOGRAD):]), data.target.shape[-1], device, steps)
                           if m.startswith(NOGRAD) else _runner(m, model, spec, data, device, r, batch_size, k)
                           for m in order})
        if r == 0:
            continue  # warm-up: caches, allocator, cuDNN plans
        for m, (w, st) in res.items():
            walls[m] += w
            stats[m] += st
            if m in round_ratios:
                round_ratios[m].append(statistics.median(res["supervised"][0]) / statistics.median(w))
        log.info("%s round %d: %s", device, r, ", ".join(f"{m} {statistics.median(w):.3f} s" for m, (w, _) in
                                                            res.items()))
    ticks1 = cpu_ticks()
    machine: dict[str, Any] = {"load_start": load0, "load_end": os.getloadavg()[0]}
    if ticks0 is not None and ticks1 is not None and ticks1[0] > ticks0[0]:
        machine["steal_share"] = (ticks1[1] - ticks0[1]) / (ticks1[0] - ticks0[0])
    med = {m: statistics.median(walls[m]) for m in methods}
    step_s = {m: s for m, s in med.items() if "+" not in m}
    out: dict[str, Any] = {
        "step_s": step_s,
        "ratios": {m: step_s["supervised"] / step_s[m] for m in step_s if m != "supervised"},
        "approximations": {m: {"step_s": s, "ratio": med["supervised"] / s} for m, s in med.items()
                           if m in APPROXIMATIONS.get(device.type, ())},
        "views_ahead": ahead_enabled(None, device),
        "joint_pass": joint_enabled(validate({"method": "t3ar"}), device),
        "folded_frozen_norms": FOLD.get(device.type, False),
        "steps_timed": {m: len(walls[m]) for m in methods},
        "round_ratios": round_ratios,
        "machine": machine,
        "augment_s": {m: statistics.median(s.seconds_augment for s in stats[m]) for m in methods},
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
        else f"{os.cpu_count()} CPU cores, {platform.machine()}",
        "threads": torch.get_num_threads(),
    }
    for v in variants:  # one setting changed, side by side: the ratio against the variant's own supervised step
        changed = {m: med[f"{m}+{v}"] for m in VARIANTS[v][1]}
        sup = changed.get("supervised", step_s["supervised"])
        out.setdefault("variants", {})[v] = {
            "description": VARIANTS[v][2], "step_s": changed,
            "ratios": {m: sup / s for m, s in changed.items() if m != "supervised"},
            "default_speedup": {m: s / step_s[m] for m, s in changed.items()}}
    nograd = statistics.median(walls[f"{NOGRAD}{rows}"])
    out["ceiling"] = {"nograd_rows": rows, "nograd_s": nograd,
                      "pass_statistic": f"the median of {len(walls[f'{NOGRAD}{rows}'])} passes timed in the rounds",
                      "t3ar_ratio": step_s["supervised"] / (step_s["supervised"] + nograd)}
    out["ceiling"]["t3ar_share_of_ceiling"] = out["ratios"]["t3ar"] / out["ceiling"]["t3ar_ratio"] \
        if "t3ar" in out["ratios"] else None
    # the same for the step without retrieval: a supervised step plus the no-gradient pass over the strong views
    nograd_b = statistics.median(walls[f"{NOGRAD}{batch_size}"])
    out["ceiling"].update(noretrieval_nograd_rows=batch_size, noretrieval_nograd_s=nograd_b,
                          noretrieval_ratio=step_s["supervised"] / (step_s["supervised"] + nograd_b))
    out["ceiling"]["noretrieval_share_of_ceiling"] = (
        out["ratios"]["t3ar-noretrieval"] / out["ceiling"]["noretrieval_ratio"]
        if "t3ar-noretrieval" in out["ratios"] else None)
    if "t3ar" in step_s:  # the bank: what its fill in these first-epoch steps saves against a full one
        bank_size = validate({"method": "t3ar"}).bank_entries
        n = len(data.target)
        filled = min(bank_size, n + (n // batch_size) * rows)  # initial entries + each step's keys and pool
        args = (model.feature_dim, model.num_classes)
        at_fill = bank_scan_seconds(*args, filled, device, batch_size=batch_size, k=k, bank_size=bank_size)
        full = bank_scan_seconds(*args, bank_size, device, batch_size=batch_size, k=k, bank_size=bank_size)
        out["bank"] = {"size": bank_size, "filled_at_last_step": filled, "scan_s_at_fill": at_fill,
                       "scan_s_full": full,
                       "t3ar_ratio_full_bank": step_s["supervised"] / (step_s["t3ar"] + max(0.0, full - at_fill))}
    if profile:
        tables = profile_step(model, spec, data, device, batch_size=batch_size, k=k)
        out["profile_t3ar_step"] = tables.get("device", "")
        if "host" in tables:
            out["profile_t3ar_step_host"] = tables["host"]
    return out


def run_speed_benchmark(devices: list[torch.device], data: SpeedData, *, rounds: int = 3, batch_size: int = 32,
                        k: int = 5, profile: bool = True, variants: tuple[str, ...] = ()) -> dict[str, Any]:
    """Measure every device; the result's ``devices`` maps 'cpu'/'cuda' to its figures."""
    t0 = time.perf_counter()
    res: dict[str, Any] = {"devices": {}, "batch_size": batch_size, "k": k, "rounds": rounds,
                           "images": len(data.target), "image_size": int(data.target.shape[-1]),
                           "distinct_pool_images": len(data.pool_images), "pool_size": data.pool_size,
                           "torch": torch.__version__}
    for dev in devices:
        res["devices"][dev.type] = measure_device(data, dev, rounds=rounds, batch_size=batch_size, k=k,
                                                  profile=profile, variants=variants)
    res["seconds"] = time.perf_counter() - t0
    return res
