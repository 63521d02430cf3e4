"""Test harnesses shipped with the package (a cluster of network namespaces: :mod:`srl.testing.netcluster`)."""
