"""``specopd adapt``: a drafter that keeps learning from the traffic its server serves, deployed only when better.

A long-running loop against one live SPECOPD server with the live-traffic spool on (``traffic_spool_mb > 0``;
``traffic_features_mb > 0`` also hands over the target's context features captured while serving):

1. :mod:`.reader` pages through the spool with a persisted cursor, validates every item on its own (a malformed or
   truncated item is counted and skipped) and holds out ~1/``holdout_every`` of the prompts (by a hash of the
   prompt, :mod:`.slices`: a repeated prompt is never both held out and trained on);
2. :mod:`.features` gives each item its context features: the rows captured while serving (one cached score_trees
   call per distinct radix-cached prefix fills the rows SGLang did not recompute), else one features-only
   ``score_trees`` call (the second pass; counted);
3. :mod:`.buffer` keeps the training and held-out traffic in memory and on disk under byte caps (oldest dropped,
   counted);
4. the candidate drafter trains with the registered algorithm named by ``--algorithm`` (its ``adapt`` step: SFT on
   the target's served responses, Draft-OPD replayed from the served traces, SpecOPD from the served responses as
   references);
5. :mod:`.guard` compares the candidate with the deployed drafter on the held-out slice (greedy-walk tau per
   request, paired bootstrap interval) without deploying it, and pushes it only when it is better (by default: the
   interval's lower bound above 0); a deployed drafter that later measures worse than the one before it is rolled
   back the same way;
6. :mod:`.loop` checkpoints atomically (drafter, optimiser, deployed weights, cursor, counters) and resumes, prints
   one progress line, and stops cleanly on SIGINT / SIGTERM.
"""
