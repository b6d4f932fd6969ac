#!/usr/bin/env bash
# The network-namespace lab of the multi-host tests (orchestrator/cluster/netns/), by hand:
#   scripts/netns/lab.sh list      namespaces of labs on this machine, and whether their owner still runs
#   scripts/netns/lab.sh cleanup   delete leftover namespaces (and kill what runs in them) of labs whose owner is gone
# Needs root. The tests clean up after themselves, also on failure; this is for runs that were killed.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python -m orchestrator.cluster.netns.leftovers "${1:-list}"
