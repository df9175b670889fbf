"""The method benchmark (``t3ar bench adapt``): does retrieval make adaptation better?

* :mod:`~t3ar_bench.method.command`: the click command (light: ``t3ar --help`` imports it).
* :mod:`~t3ar_bench.method.plans`: the plans (quick, cpu, paper, drift, contrastive) and the paired statistics.
* :mod:`~t3ar_bench.method.protocol`: the data protocol, pure: evaluation split, nested fractions, retrieval
  diagnostics.
* :mod:`~t3ar_bench.method.data`: data kits, target styles, pools and their embeddings, source models (cached).
* :mod:`~t3ar_bench.method.runs`: the shared context and one paired run (cached; spread over processes).
* :mod:`~t3ar_bench.method.main`: the driver: select on the validation shift, freeze, run the grid, summarise.
* :mod:`~t3ar_bench.method.report`: ``adaptation-<plan>.md``, ``.json`` and the plots.
* :mod:`~t3ar_bench.method.contrastive_study`: the contrastive-term study (the one term retrieval acts through).
"""
