"""The MLflow model registry (issue 51): every finished job of an API with ``T3AR_MLFLOW_TRACKING_URI`` set logs one
MLflow run and registers one model version, off the request path, retried with backoff, idempotently.

- :mod:`.settings`: the ``T3AR_MLFLOW_*`` variables; names (team namespaces) and aliases, checked;
- :mod:`.records`: the registration state of each job and the tag updates still owed to the registry (SQLite);
- :mod:`.payload`: what a job registers (params, metrics, tags, files), from its stored artifacts: pure;
- :mod:`.mlflow_ops`: the calls to MLflow, each step found before it is made again (a retry never makes a second
  run or version);
- :mod:`.registrar`: the API's background thread that drives the above and turns withdrawals into stale tags.
"""
