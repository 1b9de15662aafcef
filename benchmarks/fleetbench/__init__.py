"""Pieces of ``benchmarks/fleet.py`` (a package named ``fleetbench`` so that it does not shadow the script): the
numbers (:mod:`.stats`, pure functions, unit-tested without servers), the versioned ``/generate`` load and the timed
rollout calls (:mod:`.load`), the fleet phases against real workers (:mod:`.phases`) and the plot (:mod:`.plot`)."""
