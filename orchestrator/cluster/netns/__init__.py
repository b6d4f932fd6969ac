"""Separate hosts on one machine: a network-namespace lab (lab), a Ray cluster across its hosts (ray_cluster), and the cleanup of labs a killed run left (leftovers)."""
