"""The adaptation API: models, jobs (validated before enqueueing), checkpoints, pool withdrawal with lineage."""
