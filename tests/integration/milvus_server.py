"""A real Milvus standalone server for the tests: PyPI ``milvus`` 2.3.5 ("embedded Milvus", the ``milvus-server``
extra), whose wheel holds the ``milvus`` server binary and its libraries (lzma-packed). No Docker.

We use the package only for what it knows (its config template, how to unpack the binaries) and run the binary
ourselves: its own ``MilvusServer.stop()`` kills after a 1 s grace, and its ports are re-chosen at every start,
while the tests need a graceful stop, a kill -9, and a restart on the same data directory and the same port.
The binaries are unpacked once into ``.cache/milvus-server/<version>/bin`` (~10 s; skipped while their md5
markers match), each server's data (embedded etcd, rocksmq, segments, logs) lives in its own directory.
"""

from __future__ import annotations

import lzma
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from t3ar.ports import free_port

REPO = Path(__file__).resolve().parents[2]
GRACEFUL_STOP_S = 10
VERSION = "2.3.5"  # pyproject.toml's milvus-server extra; pymilvus 3.0.2 talks to it (docs/retriever.md)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 60) -> int:
    """Send ``sig`` (SIGTERM: a graceful stop, SIGKILL: a crash) unless it has exited, wait up to ``timeout``
    (then kill), and return the exit code. Also the retriever fixture's stop (conftest)."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


class MilvusServerError(RuntimeError):
    """The server could not be prepared, exited, or did not become healthy in time: a failure."""


class MilvusServerUnavailable(MilvusServerError):
    """This machine cannot run it at all (the package is missing, or the binary cannot be executed here)."""


class MilvusServer:
    """One Milvus standalone process on 127.0.0.1: ``start()``, ``stop()`` (SIGTERM, graceful), ``kill()``
    (SIGKILL), ``restart()`` (stop + start on the same data directory and ports). ``uri`` is what the retriever's
    ``T3AR_RETRIEVER_MILVUS_URI`` takes."""

    def __init__(self, data_dir: Path, cache_dir: Path | None = None) -> None:
        try:
            import milvus  # the PyPI `milvus` package (embedded Milvus server), not milvus-lite
        except ImportError as e:
            raise MilvusServerUnavailable("PyPI package `milvus` (a real Milvus server) is not installed: "
                                    "pip install 't3ar[milvus-server]'") from e
        if getattr(milvus, "__version__", None) != VERSION:
            raise MilvusServerUnavailable(f"PyPI `milvus` {getattr(milvus, '__version__', '?')} is installed, "
                                    f"the tests expect {VERSION}")
        self._pkg = milvus
        self.data_dir = data_dir.resolve()
        self.bin_dir = (cache_dir or REPO / ".cache" / "milvus-server" / VERSION) / "bin"
        self.ports: dict[str, int] = {}
        self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: list[float] = []  # wall time of each start, until healthy (first one unpacks)

    @property
    def _alias(self) -> str:
        return f"t3ar-test-{self.metrics_port}"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy_port']}"

    def log(self, tail: int = 3000) -> str:
        out = []
        for name in ("milvus-stdout.log", "milvus-stderr.log"):
            p = self.data_dir / "logs" / name
            if p.exists():
                out.append(f"--- {name}\n" + p.read_text(errors="replace")[-tail:])
        return "\n".join(out)

    def _configure(self) -> None:
        """Write configs/milvus.yaml once: every port chosen here and kept across restarts (a restart reuses the
        file: the package's check binds each port without SO_REUSEADDR, which fails for a while after a kill -9
        left connections in TIME_WAIT; the server itself rebinds them)."""
        if self.ports:
            return
        config = self._pkg.MilvusServerConfig(data_dir=str(self.data_dir))
        keys = [k for k in config.configurable_items if k.endswith("_port")]
        self.ports = {k: free_port() for k in keys}
        self.metrics_port = free_port()
        config.update(**self.ports)
        # A SIGTERM'd 2.3.5 standalone with a loaded collection stops its coordinators first, then its query node
        # waits for a coordinator that is gone until this timeout (default 1800 s) and force-quits: bound it.
        config.set("common.gracefulStopTimeout", GRACEFUL_STOP_S)
        config.resolve()  # checks each port binds, fills in the storage paths, writes configs/milvus.yaml

    def _unpack(self) -> None:
        self.bin_dir.parent.mkdir(parents=True, exist_ok=True)
        self._pkg._initialize_data_files(str(self.bin_dir.parent))  # lzma -> bin/, skipped when md5s match

    def start(self, timeout: float = 600) -> float:
        """Start and wait until ``/healthz`` says OK; returns the seconds it took. MilvusServerError when the
        process exits or is not healthy within ``timeout`` (the process is killed then)."""
        if self.proc is not None and self.proc.poll() is None:
            raise MilvusServerError("already running")
        t0 = time.monotonic()
        try:
            self._unpack()
            self._configure()
        except (OSError, RuntimeError, lzma.LZMAError) as e:  # disk, a corrupt wheel, a port taken meanwhile
            raise MilvusServerError(f"cannot prepare the Milvus server: {type(e).__name__}: {e}") from e
        env = {**os.environ, "DEPLOY_MODE": "STANDALONE", "METRICS_PORT": str(self.metrics_port),
               "MILVUS_RUN_DIR": str(self.data_dir / "run"),
               "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(self.bin_dir), os.environ.get("LD_LIBRARY_PATH"))
                                                  if p)}
        logs = self.data_dir / "logs"
        with open(logs / "milvus-stdout.log", "ab") as out, open(logs / "milvus-stderr.log", "ab") as err:
            try:
                # -alias: the pid file (/run/milvus/standalone-<alias>.pid, locked) is per server, not one per machine
                self.proc = subprocess.Popen(
                    [str(self.bin_dir / "milvus"), "run", "standalone", "-alias", self._alias],
                    cwd=self.data_dir, env=env, stdout=out, stderr=err, start_new_session=True)
            except OSError as e:  # e.g. not Linux x86-64, or a noexec cache directory
                raise MilvusServerUnavailable(f"cannot run {self.bin_dir / 'milvus'}: {e}") from e
        health = f"http://127.0.0.1:{self.metrics_port}/healthz"
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise MilvusServerError(f"the Milvus server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(health, timeout=5) as resp:
                    if b"OK" in resp.read():
                        break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        else:
            self.kill()
            raise MilvusServerError(f"the Milvus server was not healthy after {timeout:.0f} s:\n{self.log()}")
        self.start_seconds.append(time.monotonic() - t0)
        return self.start_seconds[-1]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        """Stop (SIGTERM: Milvus' graceful stop; SIGKILL: a crash); the exit code (None if never started)."""
        if self.proc is None:
            return None
        code = stop_process(self.proc, sig, timeout)
        for run_dir in ("/run/milvus", "/tmp/milvus"):  # the binary's pid file (its run dir is fixed), left by a kill
            Path(run_dir, f"standalone-{self._alias}.pid").unlink(missing_ok=True)
        return code

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM, timeout: float = 600) -> float:
        self.stop(sig)
        return self.start(timeout)
