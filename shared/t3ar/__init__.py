"""t3ar: Train/Test-Time Adaptation with Retrieval.

The importable core: the method (pure torch), models, checkpoints, the embedder (retriever R),
data readers, the data kit and the clients the services use.
"""

__version__ = "0.1.0"
