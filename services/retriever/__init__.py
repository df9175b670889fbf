"""The retriever service: owns the auxiliary pool (image blobs, metadata, embeddings, faiss index).

OpenMP threads (faiss, torch) wait passively unless told otherwise: the retriever shares its cores with request
handling and, in the embedded stack, with other services; busy-waiting OpenMP threads were measured to burn
3-4x the CPU per image on a loaded 2-core machine. Only effective if set before libgomp is first loaded.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
