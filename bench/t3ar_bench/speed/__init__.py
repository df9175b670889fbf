"""The speed benchmark (``t3ar bench speed``): one adaptation step per method against a plain supervised step.

* :mod:`~t3ar_bench.speed.main`: the data, the interleaved measurement and the profile.
* :mod:`~t3ar_bench.speed.report`: ``speed.md``, ``.json`` and ``.png``, with the goals and the verdict.
"""
