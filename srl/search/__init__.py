"""Tree search as a policy: batched trees (:mod:`srl.search.tree`)."""
