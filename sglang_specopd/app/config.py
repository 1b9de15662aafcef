"""Server configs (``server_configs/*.yaml``): a strict pydantic schema, unknown keys rejected."""

from __future__ import annotations

from pathlib import Path
from typing import List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ServeConfig(BaseModel):
    """One serving setup: target, drafter, algorithm and the SGLang flags that go with them.

    ``target`` is a prepared model name (``smollm2``) or a local HF checkpoint directory. ``drafter`` is a DFlash
    drafter directory, ``"default"`` (the drafter ``specopd drafter init`` makes for this target under
    ``$SPECOPD_HOME/drafters``, created on first use), or null for plain autoregressive serving.
    Relative paths are resolved against the config file's directory. ``speculative_algorithm``: SPECOPD (the
    plugin: traces, hot swap, live traffic; launched as ``--speculative-algorithm SPECOPD`` for a DFlash / DFlash V2
    drafter and as ``SPECOPD_DSPARK``, the plugin's worker over SGLang's DSPARK one, for a DSpark drafter, chosen
    from the drafter's ``architectures``), SPECOPD_DSPARK (the same, named explicitly: DSpark drafters only), or
    SGLang's own workers without the plugin's traces: DFLASH (DFlash / V2 drafters) and DSPARK (DSpark drafters).
    For DSPARK and SPECOPD_DSPARK, ``block_size`` B is passed as gamma = B - 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    target: str
    drafter: Optional[str] = None
    speculative_algorithm: Optional[Literal["SPECOPD", "SPECOPD_DSPARK", "DFLASH", "DSPARK"]] = "SPECOPD"
    block_size: Optional[int] = Field(default=None, ge=2, le=64)
    device: Literal["cpu", "cuda"] = "cuda"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attention_backend: Optional[str] = None
    max_total_tokens: Optional[int] = Field(default=None, gt=0)
    mem_fraction_static: Optional[float] = Field(default=None, gt=0, lt=1)
    max_running_requests: Optional[int] = Field(default=None, gt=0)
    disable_cuda_graph: bool = False
    disable_overlap_schedule: bool = False
    sleep_on_idle: bool = False
    score_trees_prefix_cache_mb: int = Field(
        default=0, ge=0, description="MiB of reference-prefix K/V that /specopd/score_trees keeps across calls "
                                     "(sglang_specopd.server.prefix_cache; 0 = off)")
    score_trees_budget_tokens: int = Field(
        default=0, ge=0, description="rows of /specopd/score_trees forward per scheduler iteration, interleaved with "
                                     "decode steps (sglang_specopd.server.scoring.queue; 0 = off: a request runs "
                                     "whole between two batches)")
    score_trees_queue_max: int = Field(
        default=4, ge=0, description="score_trees requests that may wait while one is scored (more: HTTP 429)")
    score_trees_max_request_mb: int = Field(
        default=1024, ge=0, description="cap on one score_trees request's estimated peak scheduler memory in MiB "
                                        "(sglang_specopd.server.scoring.cost; more: HTTP 413; 0 = no cap)")
    score_trees_queue_wait_s: float = Field(
        default=10.0, ge=0, allow_inf_nan=False,
        description="seconds a score_trees request may wait for the ones ahead of it (sglang_specopd.server."
                    "scoring.line; longer, or expected longer: HTTP 429 with Retry-After; 0 = no bound)")
    traffic_spool_mb: float = Field(
        default=0, ge=0, description="MiB of live-traffic items (prompt + output ids and verify trace of every "
                                     "finished request) the server keeps for training, read and purged with the "
                                     "admin key (sglang_specopd.server.traffic.spool, docs/live_traffic.md; 0 = off)")
    traffic_features_mb: float = Field(
        default=0, ge=0, description="MiB of the target's context features captured while serving the spooled "
                                     "items (bf16, K x hidden values per token; sglang_specopd.server."
                                     "traffic.features): a trainer on the traffic then needs no second prefill "
                                     "(0 = off; needs traffic_spool_mb > 0)")
    speculative_policy: Literal["fixed", "goodput"] = Field(
        default="fixed", description="drafts verified per step (SPECOPD with DFlash drafters): fixed = the whole "
                                     "block; goodput = k in 0..block_size-1 chosen before each verify from measured "
                                     "step costs and live acceptance (sglang_specopd.server.goodput.policy, "
                                     "docs/goodput.md); GET /specopd/policy shows what it does")
    drafter_max_payload_mb: Optional[float] = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="largest drafter push (POST /specopd/drafter/swap or /stage body, streamed to a temporary file: "
                    "sglang_specopd.server.drafter.upload; more: HTTP 413 naming this key) in MiB; unset: the "
                    "payload limit, 64 MiB. A drafter directory the worker can read: push {\"path\": DIR} instead")
    served_model_name: Optional[str] = Field(
        default=None, min_length=1, description="the model id the OpenAI API reports (SGLang's --served-model-name; "
                                                "default: the target directory's name)")
    allow_random_drafter: bool = Field(
        default=False, description="`drafter: default` on a target with no shipped drafter serves a random-init "
                                   "drafter only with this set (else the server refuses to start)")
    checked_on_gpu: bool = False
    extra_sglang_args: List[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _features_need_the_spool(self):
        if self.traffic_features_mb > 0 and self.traffic_spool_mb <= 0:
            raise ValueError("traffic_features_mb > 0 needs traffic_spool_mb > 0 (features are kept for the "
                             "spooled items)")
        return self

    @classmethod
    def load(cls, path: str | Path) -> "ServeConfig":
        """Read and validate a YAML config; raises ``ConfigError`` with the file name and every problem."""
        import yaml
        from pydantic import ValidationError

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"server config not found: {path}")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        base = path.resolve().parent
        for key in ("target", "drafter"):
            val = data.get(key)
            if isinstance(val, str) and (val.startswith("./") or val.startswith("../")):
                data[key] = str((base / val).resolve())
        try:
            return cls(**data)
        except ValidationError as exc:
            lines = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
            raise ConfigError(f"{path}: invalid server config:\n  " + "\n  ".join(lines)) from None


class ConfigError(ValueError):
    """A server config file is missing, malformed or has unknown/invalid keys."""
