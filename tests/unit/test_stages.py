"""A method's stages (t3ar.method.base.Stage) and per-step record (MethodStep.stats): the loop runs a method's own
stage and records its own metrics without knowing the method, and the T3AR family's stages declare what the job
cap counts."""

import ast
import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_problem

from t3ar.jobsize import planned_steps, steps_per_epoch
from t3ar.method import config as method_config
from t3ar.method import registry
from t3ar.method.adapt import adapt
from t3ar.method.base import MethodSetup, Run, Stage, StatelessMethod, StepOut
from t3ar.method.config import AdaptConfig
from t3ar.method.contrastive import T3AR
from t3ar.method.record import StepStats
from t3ar.method.second_stage import SecondStage
from t3ar.models.classifier import Classifier

SHARED = Path(__file__).resolve().parents[2] / "shared" / "t3ar"
NAME = "test-staged"
CALLS: list[str] = []


@dataclasses.dataclass
class StagedStats(StepStats):
    stage_signal: float = math.nan


class Counting(Stage):
    """Records each hook it sees; its per-step part is the step's number; stops after ``stop_at`` steps."""

    def __init__(self, stop_at: int | None) -> None:
        self.stop_at = stop_at

    def setup(self, setup: MethodSetup) -> MethodSetup:
        CALLS.append("setup")
        return setup

    def before(self, run: Run) -> None:
        CALLS.append("before" if run.method is None else "before with a method?")

    def start(self, run: Run) -> None:
        CALLS.append("start" if run.method is not None else "start without a method?")

    def step_parts(self, run: Run) -> dict[str, torch.Tensor]:
        return {"stage_signal": torch.tensor(float(len(run.result.history) + 1))}

    def stop(self, run: Run, stats: StepStats) -> bool:
        CALLS.append("step")
        return self.stop_at is not None and stats.step >= self.stop_at

    def after_steps(self, run: Run) -> None:
        CALLS.append(f"after_steps stopped={run.stopped}")

    def after(self, run: Run) -> None:
        CALLS.append("after")


class Staged(StatelessMethod):
    stats = StagedStats
    stop_at: int | None = None

    @classmethod
    def stages(cls, config: AdaptConfig) -> Sequence[Stage]:
        return [Counting(cls.stop_at)]

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.views.weak(x)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: torch.Tensor) -> StepOut:
        logits = model(prepared)
        labels = logits.detach().argmax(1)
        loss = F.cross_entropy(logits.float(), labels)
        return StepOut(loss, {"loss_ce": loss.detach()}, labels)


@pytest.fixture
def staged() -> Iterator[type[Staged]]:
    registry.register(registry.MethodSpec(NAME, "a method with a stage of its own", step=Staged))
    CALLS.clear()
    yield Staged
    Staged.stop_at = None
    registry.unregister(NAME)


def _run(method: str, **options: object) -> list[StepStats]:
    model, target, pool, nbr = tiny_problem()
    cfg = method_config.config_adapter().validate_python({"method": method, "epochs": 2, "batch_size": 4,
                                                     "train_groups": None, **options})
    return adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"),
                 neighbours=nbr if cfg.uses_retrieval else None, pool_images=pool if cfg.uses_retrieval else None,
                 ).history


def test_the_loop_runs_a_methods_own_stage_and_records_its_parts(staged: type[Staged]) -> None:
    history = _run(NAME)
    assert CALLS == ["setup", "before", "start", *["step"] * 6, "after_steps stopped=False", "after"]
    assert all(type(s) is StagedStats for s in history)
    assert [s.stage_signal for s in history] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert all(s.loss_ce == s.loss for s in history)


def test_a_stage_may_end_the_steps(staged: type[Staged]) -> None:
    staged.stop_at = 2
    history = _run(NAME)
    assert len(history) == 2 and CALLS[-2:] == ["after_steps stopped=True", "after"]


def test_a_part_the_record_has_no_field_for_is_an_error_not_dropped(staged: type[Staged],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Counting, "step_parts", lambda self, run: {"unheard_of": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="unheard_of"):
        _run(NAME)


@pytest.mark.parametrize("options", [{}, {"second_stage": {"steps": 3}}, {"safeguards": {"anchor": "fisher"}},
                                     {"second_stage": {"steps": 7},
                                      "safeguards": {"wise_alpha": 0.5}}])
def test_the_family_stages_declare_what_the_job_cap_counts(options: dict[str, object]) -> None:
    cfg = method_config.config_adapter().validate_python({"method": "t3ar", **options})
    stages = T3AR.stages(cfg)
    assert sum(s.added_steps() for s in stages) == cfg.added_steps()
    n = 40
    first = planned_steps(method_config.config_adapter().validate_python({"method": "t3ar"}), n)
    passes = planned_steps(cfg, n) - first - cfg.added_steps()
    fisher = cfg.safeguards.anchor == "fisher"  # its pass over the target counts as an epoch of steps
    assert passes == (steps_per_epoch(n, cfg.batch_size) if fisher else 0)


def test_the_second_stage_runs_the_steps_it_declares() -> None:
    model, target, _, _ = tiny_problem()
    cfg = method_config.config_adapter().validate_python({"method": "t3ar-noretrieval", "epochs": 1, "batch_size": 4,
                                                     "train_groups": None, "second_stage": {"steps": 5}})
    stage = next(s for s in T3AR.stages(cfg) if isinstance(s, SecondStage))
    res = adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, device=torch.device("cpu"))
    assert res.second_stage_steps == stage.added_steps() == 5


def test_no_module_outside_the_family_names_its_config() -> None:
    """The loop, the harness and job sizing read the config's hooks, never the family's config class."""
    family = {SHARED / "method" / "contrastive.py", SHARED / "method" / "specs" / "family.py"}
    names = []
    for path in SHARED.rglob("*.py"):
        if path in family:
            continue
        tree = ast.parse(path.read_text())
        names += [f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "T3ARConfig"]
    assert names == []
