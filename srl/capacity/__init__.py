"""The capacity model behind ``srl plan``: predicted throughput, the bottleneck and a recommended layout.

``model`` turns measured per-stage costs (``srl bench costs``) into a prediction for a cluster;
``recommend`` searches it for the best layout and the scale table. Pure arithmetic on config values: it
imports only ``srl.api``, starts no process and places nothing (placement is ``srl.runtime``'s job).
"""
