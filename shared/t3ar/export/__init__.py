"""Export an adapted (or source) checkpoint for serving: ONNX with its preprocessing inside, or safetensors with
its spec and lineage as metadata. :func:`export_checkpoint` checks parity before it writes anything."""

from t3ar.export.exporter import FORMATS, MEDIA_TYPES, SUFFIXES, ExportReport, check_format, export_checkpoint
from t3ar.export.parity import TOLERANCE, Parity, ParityError

__all__ = ["FORMATS", "MEDIA_TYPES", "SUFFIXES", "TOLERANCE", "ExportReport", "Parity", "ParityError",
           "check_format", "export_checkpoint"]
