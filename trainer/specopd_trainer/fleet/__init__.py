"""The trainer's side of a fleet: one training run against N workers behind a router.

:mod:`.client` talks to every worker, :mod:`.routing` maps requests to workers, :mod:`.push` pushes a drafter to
all of them, :mod:`.rollout` runs the fleet-wide stage/commit rollout, :mod:`.check` checks the workers agree,
:mod:`.worker` is one worker's view.
May import :mod:`specopd_trainer.client.http`, :mod:`sglang_specopd.wire` and :mod:`specopd_kernels`; never SGLang.
"""
