"""The research hook of :func:`t3ar.method.adapt.adapt`: controls and measurements that exist for the benchmarks
(``t3ar_bench``) alone. The product never sets a probe: no CLI option, API field or job config reaches one, and a
run without it (``probe=None``, the default) is the product's method.

What a probe does (all on top of the method's inputs, none of them a product option):

* ``diagnostic_labels`` ([N] true labels of the target): score the labels each step trained on
  (``StepStats.pl_accuracy``); never part of a loss.
* ``diagnostics``: add the T3AR family's per-term gradient norms (``StepStats.grad_norm_*``); a costly measurement
  that changes nothing trained.
* ``pool_diagnostic_labels`` ([P] true class per pool image, -1 = unknown): score the neighbours that served as
  data (``StepStats.pool_data_known`` / ``pool_data_correct``).
* ``pool_label_oracle``: the known pool images serve as data with their true labels (``pool_diagnostic_labels``),
  an upper bound for neighbours as data; it changes what is trained.
* ``pool_label_draw``: how the labelled data items are drawn (:mod:`t3ar.method.pool_labels`): 'retrieved' (what
  the product does), or the benchmark's controls 'random' and 'all', which draw from every labelled image in the
  pool images; it changes what is trained.
* ``bn_start``: a switch of the T3AR family that no benchmark round kept, out of the product (docs/method.md): the
  target's BatchNorm statistics first (what bn-adapt does, on the layers that train), then the steps.
* ``bn_fixed``: another, out of the product (docs/method.md):
  every BatchNorm layer normalises with its running statistics during the steps and never updates them (with
  ``batchnorm.start``: bn-adapt's, kept; on the validation shift it collapsed accuracy to 8.2 %). It changes what
  is trained.
* ``teacher_ema``: another such switch: keys, pool features and the logits behind the filtered pseudo-labels come
  from an EMA teacher of the model with this momentum (AdaContrast's 0.999); 0 = the current model (the paper's).
* ``pool_negatives``: another: 'own' (the product's): a query's negatives from the pool are its own retrieved
  neighbours in the bank; 'all': every pool entry in the bank.
* ``redraw_neighbours``: another (the paper's sampling; no round kept it): k of each row's r·k candidates are
  drawn anew at every visit instead of once per job. It reaches retrieval (:func:`t3ar.pipeline.retrieve` then
  returns the candidates) and the method (:func:`t3ar.method.adapt.method_setup`).
* ``reliable_entropy``, ``reliable_reweight``, ``collapse_fallback``: the safeguards no round kept
  (:mod:`t3ar.method.safeguards`), test time only: the cross-entropy counts only the samples whose prediction
  entropy is under ``reliable_entropy`` x ln C (SAR and EATA: 0.4), weighted by 1 / exp(H - E0) with
  ``reliable_reweight`` (EATA); when the entropy of the pseudo-labels' class histogram falls under
  ``collapse_fallback`` x its start value, the bn-adapt state is restored and the job ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from t3ar.method.config import PROBE_SWITCHES
from t3ar.method.pool_labels import LabelDrawMode


@dataclass(frozen=True)
class Probe:
    """Benchmark-only controls and measurements of one adaptation run (see the module docstring)."""

    diagnostic_labels: torch.Tensor | None = None
    diagnostics: bool = False
    pool_diagnostic_labels: torch.Tensor | None = None
    pool_label_oracle: bool = False
    pool_label_draw: LabelDrawMode = "retrieved"
    bn_start: bool = False
    bn_fixed: bool = False
    teacher_ema: float = 0.0
    pool_negatives: Literal["own", "all"] = "own"
    redraw_neighbours: bool = False
    reliable_entropy: float | None = None
    reliable_reweight: bool = False
    collapse_fallback: float | None = None

    def test_time_only(self) -> list[str]:
        """The switches set that need a test-time run (they filter or watch pseudo-labels)."""
        return [name for name, on in (("reliable_entropy", self.reliable_entropy is not None),
                                      ("collapse_fallback", self.collapse_fallback is not None)) if on]

    def check(self, n: int, n_pool: int) -> None:
        """Raise ValueError when the probe does not fit a run of ``n`` target and ``n_pool`` pool images (what
        the label draw controls need of the method, the T3AR family checks: its pool stage)."""
        if self.diagnostic_labels is not None and self.diagnostic_labels.shape != (n,):
            raise ValueError(f"diagnostic_labels must be [N={n}], got {list(self.diagnostic_labels.shape)}")
        if self.pool_diagnostic_labels is not None and self.pool_diagnostic_labels.shape != (n_pool,):
            raise ValueError(f"pool_diagnostic_labels must be [P={n_pool}], "
                             f"got {list(self.pool_diagnostic_labels.shape)}")
        if self.reliable_entropy is not None and not 0 < self.reliable_entropy <= 1:
            raise ValueError(f"reliable_entropy is a share of ln C in (0, 1], got {self.reliable_entropy}")
        if self.reliable_reweight and self.reliable_entropy is None:
            raise ValueError("reliable_reweight weights the reliable samples: it needs reliable_entropy (SAR and "
                             "EATA: 0.4)")
        if self.collapse_fallback is not None and not 0 < self.collapse_fallback < 1:
            raise ValueError(f"collapse_fallback is a share in (0, 1), got {self.collapse_fallback}")
        if not 0 <= self.teacher_ema < 1:
            raise ValueError(f"teacher_ema is a momentum in [0, 1), got {self.teacher_ema}")
        if self.pool_label_oracle and self.pool_diagnostic_labels is None:
            raise ValueError("pool_label_oracle needs pool_diagnostic_labels")


#: the switches of the T3AR family that left the product for the probe: the benchmarks set them as arm options
#: and hand them to the probe; a job config naming one is refused saying so
SWITCHES: tuple[str, ...] = PROBE_SWITCHES

#: the product's run: no measurement, no control
NO_PROBE = Probe()
