"""A stage on the sample path: a worker that keeps or drops each segment by a plugin's decision (``stage.worker``)."""
