"""``srl bench``: measurements of this machine and of the system on it (JSON out).

``throughput`` (env ceiling, sampling path against a plain loop, compute bound, training, time to solve),
``costs`` (per-stage costs, the input of the capacity model) and ``params`` (the parameter service's root
egress, flat against hierarchical). They start runs through ``srl.runtime`` and sit above it; nothing in
``srl.runtime`` imports them.
"""
