"""The replay: a worker on the sample path that keeps segments and serves the trainers sampled batches."""
