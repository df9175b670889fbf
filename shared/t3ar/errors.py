"""Domain errors. Services map these to HTTP status codes in one place; the CLI prints them.

Every error message says what went wrong *and what to do about it*.
"""

import re


class T3arError(Exception):
    """Base class for all errors raised by the t3ar core."""


class InvalidInputError(T3arError):
    """The caller gave something we cannot use (bad option, bad file, empty dataset...). Maps to 4xx."""


class ImageDecodeError(InvalidInputError):
    """A file is not a readable image."""


class UnsafeArchiveError(InvalidInputError):
    """An archive contains traversal, absolute paths, links, or exceeds size/count limits."""


class DatasetError(InvalidInputError):
    """A dataset is empty, malformed, or its labels do not fit the model."""


class CheckpointError(InvalidInputError):
    """A checkpoint is not ours, is corrupt, or does not match what it is loaded into."""


class WeightsUnavailableError(T3arError):
    """Pretrained weights are not installed / not present at the given path (no silent random init)."""


class DeviceUnavailableError(T3arError):
    """The requested device (e.g. cuda) is not available on this machine."""


class DivergedError(T3arError):
    """A model's weights or statistics are not finite (an adaptation or a training run diverged): no checkpoint
    of it is written."""


class ExportError(T3arError):
    """An exported model does not reproduce the checkpoint's (the parity check at export failed), or the export
    could not be made. Nothing is left at the destination."""


class ExportTooLargeError(ExportError):
    """An export would take more memory than the caller allows (refused before any of it is made)."""


class MissingDependencyError(T3arError):
    """An optional package that a feature needs is not installed; the message names the extra to install."""


class ToolMissingError(T3arError):
    """An external tool (npm, apt-get, dpkg-deb) needed by the data kit is missing."""


_SERVER_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^/\s'\"`,;()\[\]{}<>]+/)+")  # the directories of an absolute path


def without_paths(text: str) -> str:
    """``text`` with the directories of every absolute path removed (``/srv/t3ar/jobs/ab/x.png`` -> ``x.png``),
    for error messages that leave the server: they name what the client sent, never where the server keeps it.
    URLs are left alone."""
    return _SERVER_PATH.sub("", text)
