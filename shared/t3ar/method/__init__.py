"""The method: T3AR and its baselines, pure torch (tensors and typed arguments in, no I/O, no global state).

Importing the package imports nothing; :mod:`~t3ar.method.config`, :mod:`~t3ar.method.registry` and
:mod:`~t3ar.method.specs` need no torch (the services validate configs with them).

* :mod:`~t3ar.method.config`: ``AdaptConfig``, every knob of a run.
* :mod:`~t3ar.method.adapt`: ``adapt()``, the loop that drives every method: optimiser, schedule, AMP, timing,
  ``StepStats`` and ``AdaptResult``.
* :mod:`~t3ar.method.base`: the interface a method implements (``MethodStep``), what it is built from
  (``MethodSetup``) and returns per step (``StepOut``); the seeded random streams.
* :mod:`~t3ar.method.registry`: every method's name and properties (``MethodSpec``), registered once where the
  method is declared: the built-in ones in :mod:`~t3ar.method.specs`, torch-free (their step classes load on use).
* :mod:`~t3ar.method.bn_adapt`: ``bn-adapt`` (AdaBN: the target's BatchNorm statistics, no loss).
* :mod:`~t3ar.method.tent`: TENT (entropy, BatchNorm affine parameters only).
* :mod:`~t3ar.method.shot`: SHOT-IM (information maximisation, frozen classifier head).
* :mod:`~t3ar.method.sar`: SAR (reliable entropy, sharpness-aware step, reset on collapse).
* :mod:`~t3ar.method.eata`: EATA (reliable and non-redundant entropy, Fisher anchor to the start weights).
* :mod:`~t3ar.method.reliable`: what SAR and EATA share: the entropy filter, normalisation-layer parameters,
  forwards that keep the running statistics, the Fisher information and its penalty.
* :mod:`~t3ar.method.contrastive`: the T3AR family (``t3ar``, ``t3ar-random``, ``t3ar-noretrieval``): bank,
  filtered pseudo-labels, InfoNCE with retrieved pool negatives, retrieved neighbours as data.
* :mod:`~t3ar.method.adacontrast`: AdaContrast (momentum key encoder, soft-kNN refined pseudo-labels).
* :mod:`~t3ar.method.pool_data`: retrieved neighbours as data and the false negatives among them.
* :mod:`~t3ar.method.bank`: the memory bank of the T3AR family.
* :mod:`~t3ar.method.losses`: the losses (negative mask, InfoNCE, entropy, diversity, information maximisation).
* :mod:`~t3ar.method.retrieval`: neighbour sampling (dedup, random) and the pool-provider interface.
* :mod:`~t3ar.method.segments`: one no-gradient forward over several batches, each with its own BatchNorm
  statistics.
* :mod:`~t3ar.method.views`: weak and strong views a batch at a time, drawn per image; their parameters
  (:mod:`~t3ar.method.view_params`) and image operations (:mod:`~t3ar.method.view_ops`).
* :mod:`~t3ar.method.ahead`: the next batch's views made on a background thread while the current step runs.
* :mod:`~t3ar.method.augment`: normalisation of uint8 batches (the models' input contract).
* :mod:`~t3ar.method.schedule`: learning-rate schedule, seeded epoch batches, the shared optimiser update.
* :mod:`~t3ar.method.supervised`: supervised fine-tuning (the source model f_S).
* :mod:`~t3ar.method.evaluate`: top-1 and per-class accuracy.
"""
