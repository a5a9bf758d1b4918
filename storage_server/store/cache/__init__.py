"""Bounded KV chunk capacity on one node: the pure eviction policy and the on-disk chunk cache."""
