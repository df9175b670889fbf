"""``t3ar bench continual``: a stream of target styles adapted one after the other, each from the same base
model, with the method benchmark's frozen configuration, under four pool arms (static, growing through the real
contribution mechanism, growing + compaction, no retrieval), paired over seeds.

* :mod:`~t3ar_bench.continual.plan`: the plans (``smoke``: synthetic styles and a tiny model, minutes;
  ``cpu``: the emoji styles, the full run) and the arms' adaptation configs from a frozen selection;
* :mod:`~t3ar_bench.continual.run`: the stream itself;
* :mod:`~t3ar_bench.continual.report`: paired differences, markdown + JSON + plot;
* :mod:`~t3ar_bench.continual.smoke`: the smoke plan's synthetic data.
"""
