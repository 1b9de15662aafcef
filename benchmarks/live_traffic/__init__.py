"""Does Draft-OPD trained from the traffic a server records raise that server's served tau while it serves?

Command: ``python benchmarks/live_traffic/run.py --drafter DIR --minutes 15`` (from the repository root; ``--help`` lists every option).
Result: ``benchmarks/results/draft_opd_live_traffic_smollm2_cpu.json (+ .png)``.
Runtime: --minutes plus warm-up and after windows (wall_s 1003 s for 15 minutes).

Helpers of benchmarks/live_traffic/run.py: the traffic generator (load), window statistics and result
(stats), the plot, and the session that starts the server and the trainer.
"""
