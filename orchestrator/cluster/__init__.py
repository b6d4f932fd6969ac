"""Cluster: local 2-node Ray cluster or an existing one -> driver attached, nodes checked, ports, loopback, registry."""
