"""Self-play and leagues: ratings of past policies and how opponents are drawn from them."""
