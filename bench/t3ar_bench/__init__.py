"""Benchmarks: commands that measure and write results files (never timed tests), one subpackage each.

* :mod:`t3ar_bench.method`: ``t3ar bench adapt``, does retrieval make adaptation better (accuracy).
* :mod:`t3ar_bench.speed`: ``t3ar bench speed``, the cost of an adaptation step against a supervised one.
* :mod:`t3ar_bench.retrieval`: ``t3ar bench retrieval``, the retriever service against in-process baselines.
"""
