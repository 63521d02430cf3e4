"""Population-based training: the exploit and explore rules, and the population state the worker keeps."""
