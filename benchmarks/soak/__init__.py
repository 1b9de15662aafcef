"""Helpers of ``benchmarks/live_training_soak.py``: result statistics (``stats``), the malformed-request fuzzer
(``fuzz``), the status-counting proxy in front of the trainer (``proxy``) and the processes of a soak: load
streams, RSS sampling, CPU pinning and the trainer subprocess (``procs``)."""
