"""SWAT's second stage (a :class:`~t3ar.method.base.Stage`): after the steps, a few more that retrain only the
bottleneck and head on the target alone, with cross-entropy of weak views against the labels the method ends with
(:meth:`~t3ar.method.base.MethodStep.final_labels`: the T3AR family's filtered pseudo-labels, the true labels in
train mode). The T3AR family builds it from its ``second_stage`` group (:meth:`t3ar.method.contrastive.T3AR.stages`);
any method that keeps final labels could. Its steps are the group's declaration (``added_steps``), which the API's
step cap counts."""

from __future__ import annotations

import torch

from t3ar.method.base import Run, Stage
from t3ar.method.schedule import Optimiser, scheduled
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier, eval_norms


class SecondStage(Stage):
    """``steps`` steps at ``lr`` (with the job's momentum, weight decay and batch size) after the method's; none
    when a stage ended the steps early (a collapse) or fewer than 2 images have a label."""

    def __init__(self, steps: int, *, lr: float, momentum: float, weight_decay: float, batch_size: int) -> None:
        self.steps, self.lr, self.momentum, self.weight_decay = steps, lr, momentum, weight_decay
        self.batch_size = batch_size

    def added_steps(self) -> int:
        return self.steps

    def after_steps(self, run: Run) -> None:
        labels = run.method.final_labels() if (run.method is not None and not run.stopped) else None
        if labels is not None:
            run.result.second_stage_steps = self.run(run.model, run.setup.target, labels, run.setup.views,
                                                     run.generator, run.amp)

    def run(self, model: Classifier, target: torch.Tensor, labels: torch.Tensor, views: Views,
            gen: torch.Generator, amp: bool) -> int:
        """The stage on ``target`` with ``labels`` ([N]; -1 = none: such images sit out): the backbone frozen and
        every BatchNorm layer normalising with its running statistics (the target's, as the first stage left
        them). Returns the steps taken (0 when fewer than 2 images have a label)."""
        ok = (labels.cpu() >= 0).nonzero().flatten()
        if len(ok) < 2:
            return 0
        for p in model.parameters():
            p.requires_grad_(False)
        params = [p for m in (model.bottleneck, model.head) for p in m.parameters()]
        for p in params:
            p.requires_grad_(True)
        total = self.added_steps()
        optim = Optimiser(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                          total_steps=total, warmup_frac=0.0, amp=amp)
        y_all = labels.to(target.device)
        device = next(model.parameters()).device
        model.train()
        eval_norms(model)
        done = 0
        for _, pos in scheduled(len(ok), min(self.batch_size, len(ok)), total, gen):
            idx = ok[pos].to(target.device)
            with torch.autocast(device.type, enabled=amp):
                x = views.weak(target[idx].to(device, non_blocking=True))
                with torch.no_grad():
                    h = model.backbone(x)
                logits = model.head(model.bottleneck(h))
                loss = torch.nn.functional.cross_entropy(logits.float(), y_all[idx].to(device))
            optim.update(loss)
            done += 1
        return done

