"""docker-compose.yml read as Compose reads it (no Docker engine here): the `milvus` profile runs the stack on the
Milvus server with nothing set by hand, and the default (no profile) stays on faiss.

The retriever's start command is run for real with ``sh``, with ``getent`` (the compose network's name lookup) and
``t3ar`` replaced by stubs on PATH: the stub ``t3ar`` prints the backend the retriever would be started with.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation of one value: ${VAR:-default}, ${VAR:?message}, ${VAR} and $$ (a literal $)."""
    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        got = env.get(name, "")
        if op == ":?" and not got:
            raise KeyError(name)
        return got if got or op != ":-" else arg

    out = re.sub(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", one, value.replace("$$", "\0"))
    return out.replace("\0", "$")


SECRETS = {"REDIS_PASSWORD": "x", "T3AR_RETRIEVER_TOKEN": "c", "T3AR_RETRIEVER_ADMIN_TOKEN": "d"}


def start_retriever(tmp_path: Path, *, milvus_on_network: bool, host_env: dict[str, str],
                    expect_exit: int = 0) -> str:
    """Run the retriever service's command as its container would (its volume: ``tmp_path/volume``); -> the
    backend ``t3ar serve`` gets, or with ``expect_exit`` the command's stderr."""
    svc = compose()["services"]["retriever"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    getent = bin_dir / "getent"
    getent.write_text("#!/bin/sh\n" + ('[ "$2" = milvus ] && echo "172.18.0.5 milvus" && exit 0\n'
                                       if milvus_on_network else "") + "exit 2\n")
    t3ar = bin_dir / "t3ar"
    t3ar.write_text('#!/bin/sh\necho "backend=$T3AR_RETRIEVER_BACKEND uri=$T3AR_RETRIEVER_MILVUS_URI args=$*"\n')
    for f in (getent, t3ar):
        f.chmod(0o755)
    env = {k: interpolate(str(v), {**SECRETS, **host_env}) for k, v in svc["environment"].items()}
    assert env["T3AR_RETRIEVER_DATA_DIR"] == "/data/retriever"
    env["T3AR_RETRIEVER_DATA_DIR"] = str(tmp_path / "volume")  # the volume's mount, here
    command = [interpolate(part, {**SECRETS, **host_env}) for part in svc["command"]]
    sh = shutil.which("sh")
    assert sh is not None and command[0] == "sh"
    run = subprocess.run([sh, *command[1:]], env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == expect_exit, (run.returncode, run.stdout, run.stderr)
    if expect_exit:
        assert "args=" not in run.stdout  # the retriever never started
        return run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert last.endswith(f"args=serve retriever --host 0.0.0.0 --port 8701 --data-dir {tmp_path / 'volume'}"), last
    return last


def test_the_milvus_profile_runs_the_retriever_on_the_milvus_server(tmp_path: Path) -> None:
    services = compose()["services"]
    assert services["milvus"]["profiles"] == ["milvus"]
    dep = services["retriever"]["depends_on"]["milvus"]
    assert dep["condition"] == "service_healthy" and dep["required"] is False  # waits for it, only in the profile
    out = start_retriever(tmp_path, milvus_on_network=True, host_env={})
    assert out.startswith("backend=milvus uri=http://milvus:19530 ")


def test_without_the_profile_the_retriever_stays_on_faiss(tmp_path: Path) -> None:
    assert "profiles" not in compose()["services"]["retriever"]
    assert start_retriever(tmp_path, milvus_on_network=False, host_env={}).startswith("backend=faiss ")


@pytest.mark.parametrize("forced", ["faiss", "milvus"])
def test_a_backend_set_on_the_host_wins(tmp_path: Path, forced: str) -> None:
    for on_network in (True, False):
        out = start_retriever(tmp_path, milvus_on_network=on_network, host_env={"T3AR_RETRIEVER_BACKEND": forced})
        assert out.startswith(f"backend={forced} ")


def test_a_pool_once_on_milvus_never_falls_back_to_faiss(tmp_path: Path) -> None:
    """After a host reboot Docker restarts containers in its own order: a retriever that starts before Milvus is on
    the network must not serve the pool from faiss; it exits (its restart policy tries again) until Milvus is up,
    or until the host says faiss."""
    assert start_retriever(tmp_path, milvus_on_network=True, host_env={}).startswith("backend=milvus ")
    err = start_retriever(tmp_path, milvus_on_network=False, host_env={}, expect_exit=1)
    assert "milvus profile's server, which is not up" in err and "T3AR_RETRIEVER_BACKEND=faiss" in err
    assert start_retriever(tmp_path, milvus_on_network=True, host_env={}).startswith("backend=milvus ")
    forced = start_retriever(tmp_path, milvus_on_network=False, host_env={"T3AR_RETRIEVER_BACKEND": "faiss"})
    assert forced.startswith("backend=faiss ")  # leaving Milvus on purpose, once
    assert start_retriever(tmp_path, milvus_on_network=False, host_env={}).startswith("backend=faiss ")
    assert compose()["services"]["retriever"]["restart"] == "unless-stopped"


def test_interpolation_as_compose_does_it() -> None:
    assert interpolate("${A:-d}|${B:?m}|$$X|${C}", {"B": "b", "C": "c"}) == "d|b|$X|c"
    with pytest.raises(KeyError):
        interpolate("${B:?m}", {})
