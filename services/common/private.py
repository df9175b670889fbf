"""The services' files are theirs alone (issue 50: under umask 022 the data dir's databases, logs, the Redis
append-only file and the checkpoints were world-readable). Each service process (the API, the retriever, a
worker, and ``t3ar up``, whose children Redis included inherit it) sets the umask 077 before it opens anything
(new files 0600, new folders 0700), and makes its data directory 0700 when it owns it, so files made earlier
under another umask are out of reach of other users too. Atomic writes take their mode from the umask
(:func:`t3ar.filemode.new_file_mode`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077


def keep_private(data_dir: Path | None = None) -> None:
    """Set the process's umask to 077 and make ``data_dir`` (created if missing) 0700 when this user owns it."""
    os.umask(PRIVATE_UMASK)
    if data_dir is None:
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        if data_dir.stat().st_uid == os.getuid() and data_dir.stat().st_mode & 0o077:
            data_dir.chmod(0o700)
    except OSError as e:  # a mount that refuses it: its files still get 0600 from now on
        log.warning("could not make %s private (0700): %s", data_dir, e)
