"""The retriever benchmark (``t3ar bench retrieval``): the HTTP service against in-process baselines.

* :mod:`~t3ar_bench.retrieval.main`: the services as subprocesses, the measurements side by side.
* :mod:`~t3ar_bench.retrieval.report`: ``docs/benchmarks/retrieval.md`` from its results.
"""
