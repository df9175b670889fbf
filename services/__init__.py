"""t3ar services: retriever, api, worker (thin FastAPI / rq layers over the t3ar core)."""
