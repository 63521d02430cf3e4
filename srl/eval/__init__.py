"""The eval worker: plays the newest policy every few versions during training and keeps the best one."""
