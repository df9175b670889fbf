"""The services' commands of the ``t3ar`` CLI (``serve``, ``up``, ``worker``).

They plug into the ``t3ar`` click group through the ``t3ar.commands`` entry-point group (pyproject.toml): the
library's CLI loads whatever that group names and never names the services itself. Heavy dependencies
(uvicorn, rq, the apps) are imported inside the commands, so loading them keeps ``t3ar --help`` fast.
"""
