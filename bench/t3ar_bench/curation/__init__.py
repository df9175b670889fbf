"""``t3ar bench compaction``: the pool compaction's scan (near-duplicates through an index) timed at a large
synthetic pool, over HTTP against a real retriever: :mod:`~t3ar_bench.curation.main`."""
