"""The adaptation worker: an rq worker whose job runs :func:`t3ar.pipeline.run_adaptation`.

This package must stay importable without torch (the forking worker parent never imports it); only
:mod:`t3ar_services.worker.jobs` imports torch, inside the job.
"""
