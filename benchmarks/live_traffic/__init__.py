"""Helpers of benchmarks/draft_opd_live_traffic.py: the traffic generator (load), window statistics and result
(stats), the plot, and the session that starts the server and the trainer."""
