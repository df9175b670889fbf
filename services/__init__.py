"""t3ar services (installed as ``t3ar_services``): retriever, api, worker, their common plumbing and their CLI
commands (thin FastAPI / rq layers over the t3ar core)."""
