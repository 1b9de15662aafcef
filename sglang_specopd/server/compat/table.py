"""The table of every SGLang symbol the plugin touches: the ONE place that names SGLang's internals.

:data:`SYMBOLS` lists each as a :class:`Symbol` (dotted path, how the plugin uses it, the parameter names it
relies on, the attributes it reads, the plugin modules that use it; the types are in
:mod:`sglang_specopd.server.compat.symbol`). Pure data: importing it imports nothing of SGLang. The accessors
(``compat.get`` / ``hook`` / ``patch``) are in :mod:`sglang_specopd.server.compat`; the check against the installed
SGLang in :mod:`sglang_specopd.server.compat.check`.
"""

from __future__ import annotations

from typing import Dict, Tuple

from sglang_specopd.server.compat.symbol import Kind, Symbol

PINNED_SGLANG = "0.5.23"

R, SUB, OVR, MP = Kind.READ, Kind.SUBCLASS, Kind.OVERRIDE, Kind.MONKEYPATCH
BEFORE, AFTER, AROUND, REPLACE = Kind.HOOK_BEFORE, Kind.HOOK_AFTER, Kind.HOOK_AROUND, Kind.HOOK_REPLACE

_HOOKS = "sglang.srt.plugins.hook_registry"
_SPEC_INFO = "sglang.srt.speculative.spec_info"
_SPEC_REG = "sglang.srt.speculative.spec_registry"
_DFLASH_W = "sglang.srt.speculative.dflash_worker_v2"
_DSPARK_W = "sglang.srt.speculative.dspark_components.dspark_worker_v2"
_SPEC_HOOK = "sglang.srt.arg_groups.speculative_hook"
_IO = "sglang.srt.managers.io_struct"
_SCHED = "sglang.srt.managers.scheduler"
_HTTP = "sglang.srt.entrypoints.http_server"
_WU = "sglang.srt.model_executor.model_runner_components.weight_updater"
_RADIX = "sglang.srt.layers.radix_attention"
_FB = "sglang.srt.model_executor.forward_batch_info"
_TN = "sglang.srt.layers.attention.torch_native_backend"
_DFLASH_M = "sglang.srt.models.dflash"
_DSPARK_ACCEPT = "sglang.kernels.ops.speculative.dspark.dspark_accept"
_PLATFORM = "sglang.srt.platforms.interface"
_HYBRID_ARCH = "sglang.srt.configs.hybrid_arch"
_QSA_IDX = "sglang.srt.layers.attention.qsa.qsa_indexer"
_QSA_META = "sglang.srt.layers.attention.qsa.metadata"
_QSA_CFG = "sglang.srt.layers.attention.qsa.config"
_QWEN4 = "sglang.srt.models.qwen4_exp"
_WEIGHT_UPDATES = ("update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_ipc",
                   "load_weights_from_distributed", "begin_weight_update")
#: The WeightUpdater methods (every target weight update SGLang offers) the prefix cache clears itself before.
WEIGHT_UPDATE_HOOKS = tuple(f"WeightUpdater.{m}" for m in _WEIGHT_UPDATES)


def _s(name, module, qualname, kinds, params=(), attrs=(), used_by=(), cpu_only=False, may_be_none=False):
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    used_by = used_by if isinstance(used_by, tuple) else (used_by,)
    return Symbol(name, module, qualname, kinds, tuple(params), tuple(attrs), used_by, cpu_only, may_be_none)


SYMBOLS: Tuple[Symbol, ...] = (
    # --- SGLang's plugin framework ---
    _s("HookRegistry", _HOOKS, "HookRegistry", R, attrs=("register",), used_by="compat"),
    _s("HookRegistry.register", _HOOKS, "HookRegistry.register", R, ("target", "hook", "hook_type"),
       used_by="compat"),
    _s("HookType", _HOOKS, "HookType", R, attrs=("BEFORE", "AFTER", "AROUND", "REPLACE"), used_by="compat"),
    # --- the SPECOPD algorithm (algorithm/specopd.py) ---
    _s("SpeculativeAlgorithm", _SPEC_INFO, "SpeculativeAlgorithm", R, used_by=("algorithm.specopd", "goodput.plain"),
       attrs=("DFLASH", "DSPARK", "NONE", "is_speculative", "create_future_map", "build_disagg_draft_input",
              "resolve_max_speculative_num_draft_tokens", "get_num_tokens_per_req_for_target_verify")),
    _s("SpeculativeAlgorithm.register", _SPEC_INFO, "SpeculativeAlgorithm.register", R,
       ("name", "supports_overlap", "spec_class"), used_by=("algorithm.specopd", "algorithm.dspark")),
    _s("CustomSpecAlgo", _SPEC_REG, "CustomSpecAlgo", SUB, used_by="algorithm.specopd",
       attrs=("is_some", "is_none", "is_speculative", "handle_server_args", "create_worker")),
    _s("get_spec", _SPEC_REG, "get_spec", R, ("name",), used_by=("algorithm.specopd", "algorithm.dspark")),
    _s("DFlashWorkerV2", _DFLASH_W, "DFlashWorkerV2", SUB,
       used_by=("algorithm.specopd", "drafter.swap", "drafter.rollout", "goodput.step"),  # rollout: stages on draft_model's device
       attrs=("model_runner", "block_size", "_selector_sample", "_block_verification",  # read by SpecOPDWorker
              "draft_model", "_fused_kv_helper", "_init_fused_kv_helper",  # hot_swap rebuilds the helper
              # the speculative policy swaps the two runners for a step's views and reads what it supports
              "_target_worker", "draft_model_runner", "server_args", "device", "selector", "lilicorr",
              "_is_domino", "use_compact_draft_cache", "_need_mamba_verify_commit",
              # a k = 0 step as plain decode (goodput.plain): the target, the next draft input, drafter-pool slots
              "target_worker", "_make_next_draft_input_decode", "_draft_write_ids")),
    _s("DFlashWorkerV2.forward_batch_generation", _DFLASH_W, "DFlashWorkerV2.forward_batch_generation", OVR,
       ("self", "batch"), used_by="algorithm.specopd"),
    _s("DFlashWorkerV2._greedy_sample_from_vocab_parallel_head", _DFLASH_W,
       "DFlashWorkerV2._greedy_sample_from_vocab_parallel_head", OVR,
       ("self", "hidden_states", "lm_head", "chunk_size"), used_by="algorithm.specopd"),
    _s("DFlashWorkerV2._accept_block", _DFLASH_W, "DFlashWorkerV2._accept_block", OVR,
       ("self", "candidates", "next_token_logits", "sampling_info", "draft_input", "prefix_lens", "target_predict"),
       used_by="algorithm.specopd"),
    _s("DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc", _DFLASH_W,
       "DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc", OVR,
       ("self", "target_hidden", "cache_loc", "positions", "cache_loc_2d", "commit_lens", "extend_lens"),
       used_by="algorithm.specopd"),  # traffic_features: the rows it is given are the served tokens' context features
    _s("_commit_accept", _DFLASH_W, "_commit_accept", R, ("candidates", "accept_len", "bonus_tokens"),
       used_by=("algorithm.specopd", "goodput.verify")),
    # --- the speculative policy (goodput/step.py, goodput/verify.py): k of a block's drafts verified per step ---
    _s("ScheduleBatch", "sglang.srt.managers.schedule_batch", "ScheduleBatch", R,
       used_by=("goodput.step", "goodput.verify", "goodput.plain"),
       attrs=("forward_mode", "is_extend_in_batch", "reqs", "has_grammar", "return_logprob", "sampling_info",
              "input_ids", "spec_info", "out_cache_loc", "seq_lens_cpu", "seq_lens_sum", "seq_lens",
              "req_pool_indices", "spec_algorithm", "can_run_decode_cuda_graph")),
    _s("DFlashVerifyInput", "sglang.srt.speculative.dflash_info", "DFlashVerifyInput", R,
       ("draft_token", "positions", "draft_token_num", "custom_mask", "capture_hidden_mode", "kv_loc_plan",
        "kv_loc_cols"), attrs=("prepare_for_verify",), used_by="goodput.verify"),
    _s("CaptureHiddenMode", _FB, "CaptureHiddenMode", R, attrs=("FULL",), used_by=("goodput.verify", "goodput.plain")),
    _s("GenerationBatchResult", _SCHED, "GenerationBatchResult", R, used_by="goodput.plain",
       params=("logits_output", "next_token_ids", "accept_lens", "can_run_cuda_graph", "next_draft_input",
               "speculative_num_draft_tokens", "new_seq_lens"), attrs=("kv_loc_plan",)),
    _s("TpModelWorker.forward_batch_generation", "sglang.srt.managers.tp_worker",
       "TpModelWorker.forward_batch_generation", (OVR, R), ("self", "batch", "forward_batch", "is_verify",
                                                            "skip_attn_backend_init", "capture_hidden_mode",
                                                            "return_kv_loc_plan"),
       used_by=("goodput.verify", "goodput.plain")),
    _s("ModelRunner.forward", "sglang.srt.model_executor.model_runner", "ModelRunner.forward", OVR,
       ("self", "forward_batch"), used_by="goodput.verify"),
    _s("LogitsProcessorOutput", "sglang.srt.layers.logits_processor", "LogitsProcessorOutput", R,
       attrs=("next_token_logits", "hidden_states"), used_by="goodput.verify"),
    _s("compute_dflash_correct_drafts_and_bonus", _DFLASH_W, "compute_dflash_correct_drafts_and_bonus", R,
       ("candidates", "target_predict"), used_by="goodput.verify"),
    _s("compute_dflash_sampling_correct_drafts_and_bonus", _DFLASH_W,
       "compute_dflash_sampling_correct_drafts_and_bonus", R,
       ("candidates", "next_token_logits", "sampling_info", "max_top_k", "uniform_top_k_value"),
       used_by="goodput.verify"),
    _s("is_dflash_sampling_verify_available", _DFLASH_W, "is_dflash_sampling_verify_available", R,
       used_by="goodput.verify"),
    _s("is_dense_head_weight", _DFLASH_W, "is_dense_head_weight", R, ("weight",), used_by="algorithm.specopd"),
    _s("resolve_greedy_mask", "sglang.srt.speculative.dspark_components.dspark_draft", "resolve_greedy_mask", R,
       ("bs", "sampling_info", "device"), used_by="algorithm.specopd"),
    _s("DFlashDraftModel.load_weights", "sglang.srt.models.dflash", "DFlashDraftModel.load_weights", R,
       ("self", "weights"), used_by="drafter.swap"),
    _s("resolving_view", "sglang.srt.arg_groups.overrides", "resolving_view", R, ("server_args",),
       used_by=("algorithm.specopd", "algorithm.dspark", "cpu.patches", "cpu.dspark", "cpu.fork_start")),
    _s("handle_speculative_decoding", _SPEC_HOOK, "handle_speculative_decoding", AFTER, ("server_args",),
       used_by=("algorithm.specopd", "algorithm.dspark")),
    _s("_handle_dflash", _SPEC_HOOK, "_handle_dflash", (R, AROUND), ("server_args",),
       used_by=("algorithm.specopd", "cpu.patches")),
    # --- the SPECOPD_DSPARK algorithm (algorithm/dspark.py): DSPARK's worker + traces; hot swap of its drafter ---
    _s("DSparkWorkerV2", _DSPARK_W, "DSparkWorkerV2", SUB, used_by=("algorithm.dspark", "drafter.swap", "drafter.rollout"),
       attrs=("_observers", "draft_model")),  # the observer facade traces wrap; the model hot swap loads into
    _s("DsparkStepObservers.observe_verify_step", "sglang.srt.speculative.dspark_components.dspark_observability",
       "DsparkStepObservers.observe_verify_step", OVR, ("self", "reqs", "bs", "prefix_lens", "draft_tokens",
                                                       "correct_len"), used_by="algorithm.dspark"),
    _s("_handle_dspark", _SPEC_HOOK, "_handle_dspark", (R, AROUND), ("server_args",),
       used_by=("algorithm.dspark", "cpu.dspark")),
    # DSparkDraftMixin caches pre-stacked context-KV weights (torch.cat copies) on first use: cleared after a swap
    _s("DSparkDraftModel", "sglang.srt.models.dspark", "DSparkDraftModel", R, used_by="drafter.swap",
       attrs=("_fused_kv_write_cache", "_stacked_ctx_kv_cache", "_stacked_ctx_kv_params", "embed_tokens",
              "lm_head")),
    _s("DSparkDraftModel.load_weights", "sglang.srt.models.dspark", "DSparkDraftModel.load_weights", R,
       ("self", "weights"), used_by="drafter.swap"),
    # --- the control channel (control.py) ---
    _s("BaseReq", _IO, "BaseReq", SUB, used_by="control"),
    _s("hook_custom_types", _IO, "hook_custom_types", R, ("new_types",), used_by="control"),
    _s("TypeBasedDispatcher", "sglang.utils", "TypeBasedDispatcher", R, ("mapping",), attrs=("__iadd__",),
       used_by=("control", "scoring.queue")),
    _s("get_global_state", _HTTP, "get_global_state", R, used_by="control"),
    _s("TokenizerManager.auto_create_handle_loop", "sglang.srt.managers.tokenizer_manager",
       "TokenizerManager.auto_create_handle_loop", R, ("self",), used_by="control"),
    _s("_COMMUNICATOR_SPECS", "sglang.srt.managers.tokenizer_control_mixin", "_COMMUNICATOR_SPECS", MP,
       attrs=("append",), used_by="control"),
    _s("Scheduler", _SCHED, "Scheduler", R,
       used_by=("control", "scoring.forward", "drafter.swap", "scoring.queue", "target_identity"),
       attrs=("_request_dispatcher", "tp_worker", "draft_worker", "server_args", "flush_cache", "_engine_paused")),
    _s("Scheduler.init_request_dispatcher", _SCHED, "Scheduler.init_request_dispatcher", AFTER, ("self",),
       used_by=("control", "scoring.queue", "scoring.forward", "metrics.hooks")),
    # --- Prometheus metrics (metrics/hooks.py): recorded by attention-TP rank 0, as SGLang's scheduler metrics ---
    _s("get_parallel", "sglang.srt.runtime_context", "get_parallel", R, used_by="metrics.hooks"),
    # --- budgeted tree scoring (scoring/queue.py): pieces once per scheduler iteration, replies sent later ---
    _s("Scheduler.ingest_requests", _SCHED, "Scheduler.ingest_requests", AFTER, ("self",), used_by="scoring.queue"),
    _s("Scheduler.maybe_sleep_on_idle", _SCHED, "Scheduler.maybe_sleep_on_idle", AROUND, ("self",),
       used_by="scoring.queue"),
    _s("Scheduler.send_control_output", _SCHED, "Scheduler.send_control_output", R, ("self", "output", "recv_req"),
       used_by="scoring.queue"),
    # --- the output streamer (streamer.py, hooked by plugin.py) ---
    _s("Scheduler.get_output_streamer_class", _SCHED, "Scheduler.get_output_streamer_class", REPLACE, ("self",),
       used_by="plugin"),
    _s("SchedulerOutputStreamer", "sglang.srt.managers.scheduler_components.output_streamer",
       "SchedulerOutputStreamer", SUB, attrs=("has_additional_customized_info", "spec_algorithm"), used_by="streamer"),
    _s("SchedulerOutputStreamer.should_build_additional_customized_info",
       "sglang.srt.managers.scheduler_components.output_streamer",
       "SchedulerOutputStreamer.should_build_additional_customized_info", OVR, ("self",), used_by="streamer"),
    _s("SchedulerOutputStreamer.build_additional_customized_info",
       "sglang.srt.managers.scheduler_components.output_streamer",
       "SchedulerOutputStreamer.build_additional_customized_info", OVR, ("self", "reqs"), used_by="streamer"),
    # --- traces and the live-traffic spool (traces.py, traffic/spool.py; the verify hook is registered by plugin.py) ---
    _s("SamplingParams.verify", "sglang.srt.sampling.sampling_params", "SamplingParams.verify", AFTER,
       ("self", "vocab_size"), used_by="plugin"),
    _s("SamplingParams", "sglang.srt.sampling.sampling_params", "SamplingParams", R, attrs=("custom_params",),
       used_by="traces"),
    _s("Req", "sglang.srt.managers.schedule_batch", "Req", R, used_by=("traces", "traffic.spool"),
       attrs=("sampling_params", "finished", "finished_reason", "origin_input_ids", "output_ids_through_stop", "rid")),
    # /health and /health_generate run a one-token generation under this rid prefix (a router health-checks every
    # worker that way): never live traffic
    _s("HEALTH_CHECK_RID_PREFIX", "sglang.srt.constants", "HEALTH_CHECK_RID_PREFIX", R, used_by="traffic.spool"),
    # --- HTTP routes (routes.py) ---
    _s("http_server.app", _HTTP, "app", Kind.ROUTE, attrs=("add_api_route", "routes"),
       used_by=("routes", "goodput.control")),
    _s("launch_server", _HTTP, "launch_server", BEFORE, ("server_args",), used_by=("routes", "goodput.control")),
    _s("AuthLevel", "sglang.srt.utils.auth", "AuthLevel", R, attrs=("ADMIN_FORCE",),
       used_by=("routes", "goodput.control")),
    _s("auth_level", "sglang.srt.utils.auth", "auth_level", R, ("level",), used_by=("routes", "goodput.control")),
    # --- fixes (fixes.py) ---
    _s("ModelRunner._extend_forward_kwargs", "sglang.srt.model_executor.model_runner",
       "ModelRunner._extend_forward_kwargs", AFTER, ("self", "forward_batch", "pp_proxy_tensors"), used_by="fixes"),
    _s("ForwardBatch", _FB, "ForwardBatch", R, used_by=("fixes", "cpu.patches"),
       attrs=("input_embeds", "replace_embeds", "forward_mode", "spec_info", "out_cache_loc", "req_pool_indices",
              "seq_lens")),
    # --- tree scoring and its prefix cache (scoring/forward.py, prefix_cache.py) ---
    _s("ForwardMode", _FB, "ForwardMode", R, attrs=("EXTEND", "DECODE", "is_target_verify"),
       used_by=("scoring.tree_call", "cpu.patches", "goodput.plain")),
    _s("RadixAttention", _RADIX, "RadixAttention", R, used_by=("scoring.forward", "cpu.patches"),
       attrs=("tp_q_head_num", "tp_k_head_num", "tp_v_head_num", "qk_head_dim", "v_head_dim", "layer_id", "scaling",
              "attn_type")),
    _s("RadixAttention.forward", _RADIX, "RadixAttention.forward", AROUND, ("self", "q", "k", "v", "forward_batch"),
       used_by="scoring.forward"),
    _s("LlamaModel", "sglang.srt.models.llama", "LlamaModel", R, attrs=("layers_to_capture", "embed_tokens"),
       used_by="scoring.forward"),
    _s("LlamaModel.forward", "sglang.srt.models.llama", "LlamaModel.forward", R,
       ("self", "input_ids", "positions", "forward_batch"), used_by="scoring.forward"),
    # the vocab-parallel LM head's group: score_trees gathers its per-rank statistics over it (score_head.py)
    _s("get_tp_group", "sglang.srt.distributed.parallel_state", "get_tp_group", R, used_by="scoring.head"),
    _s("get_attn_tp_group", "sglang.srt.distributed.parallel_state", "get_attn_tp_group", R, used_by="scoring.head"),
    *(_s(name, _WU, name, BEFORE, ("self",), used_by="prefix_cache") for name in WEIGHT_UPDATE_HOOKS),
    # --- tree scoring on hybrid Gated DeltaNet targets (scoring/gdn.py) ---
    _s("RadixLinearAttention", "sglang.srt.layers.radix_linear_attention", "RadixLinearAttention", R,
       used_by="scoring.gdn", attrs=("layer_id", "num_q_heads", "num_k_heads", "num_v_heads", "head_q_dim", "head_k_dim",
                                   "head_v_dim", "q_dim", "k_dim", "v_dim", "conv_weights", "bias", "activation",
                                   "A_log", "dt_bias", "lower_bound")),
    _s("RadixLinearAttention.forward", "sglang.srt.layers.radix_linear_attention", "RadixLinearAttention.forward",
       AROUND, ("self", "forward_batch", "mixed_qkv", "a", "b"), used_by="scoring.gdn"),
    _s("mambaish_config", _HYBRID_ARCH, "mambaish_config", R, ("model_config",), used_by="scoring.gdn"),
    _s("hybrid_gdn_config", _HYBRID_ARCH, "hybrid_gdn_config", R, ("model_config",), used_by="scoring.gdn"),
    # sparse-attention (QSA, Qwen4-Exp) layers: refused until score_trees selects their keys per tree node
    _s("QSAIndexer", _QSA_IDX, "QSAIndexer", R, used_by=("scoring.qsa", "cpu.qwen4_exp"),
       attrs=("project_qk", "apply_rope", "token_topk", "compress_ratio", "k_layernorm", "rotary_emb")),
    _s("Qwen4ExpAttentionDecoderLayer._compute_qsa_topk_indices", "sglang.srt.models.qwen4_exp",
       "Qwen4ExpAttentionDecoderLayer._compute_qsa_topk_indices", AROUND,
       ("self", "hidden_states", "positions", "forward_batch"), used_by="scoring.qsa"),
    # DFlash features on Qwen4-Exp (qwen4_exp_features.py): the layers drop the capture, the VL model the aux list
    *(_s(f"{cls}.forward", _QWEN4, f"{cls}.forward", AROUND, ("self",), used_by="qwen4_exp_features")
      for cls in ("Qwen4ExpLinearDecoderLayer", "Qwen4ExpAttentionDecoderLayer", "Qwen4ExpVLModel")),
    _s("Qwen4ExpLayerExtensionMixin._attn_mix", _QWEN4, "Qwen4ExpLayerExtensionMixin._attn_mix", AROUND,
       ("self", "residual"), used_by="qwen4_exp_features"),
    # capture by a per-layer ``_is_layer_to_capture`` flag, as set_dflash_layers_to_capture sets it
    _s("Qwen3NextModel", "sglang.srt.models.qwen3_next", "Qwen3NextModel", R, used_by="scoring.gdn",
       attrs=("layers", "layers_to_capture", "set_dflash_layers_to_capture")),
    # --- sampled drafts (sampled_drafts.py) ---
    _s("accept_sampling", _DSPARK_ACCEPT, "accept_sampling", R,
       ("candidates", "target_logits", "draft_probs", "sampling_info", "draft_input", "gamma",
        "verify_num_draft_tokens", "cutoff_verify_lens", "block_verification"), used_by="sampled_drafts"),
    # --- CPU engine only (cpu/patches.py, cpu/sampling_verify.py, cpu/chain_sampling.py) ---
    _s("engine._set_envs_and_config", "sglang.srt.entrypoints.engine", "_set_envs_and_config", AFTER,
       ("server_args",), used_by="cpu.fork_start", cpu_only=True),
    _s("DRAFT_ATTENTION_BACKEND_CHOICES", "sglang.srt.arg_groups.choices", "DRAFT_ATTENTION_BACKEND_CHOICES", MP,
       attrs=("append",), used_by="cpu.patches", cpu_only=True),
    _s("speculative_hook.current_platform", _SPEC_HOOK, "current_platform", MP, used_by="cpu.patches", cpu_only=True,
       attrs=("is_out_of_tree", "supports_speculative_algorithm", "supports_speculative_draft_attention_backend",
              "get_default_speculative_draft_attention_backend")),
    _s("SRTPlatform.is_out_of_tree", _PLATFORM, "SRTPlatform.is_out_of_tree", OVR, ("self",),
       used_by="cpu.patches", cpu_only=True),
    _s("SRTPlatform.supports_speculative_algorithm", _PLATFORM, "SRTPlatform.supports_speculative_algorithm", OVR,
       ("self", "algorithm"), used_by="cpu.patches", cpu_only=True),
    _s("SRTPlatform.supports_speculative_draft_attention_backend", _PLATFORM,
       "SRTPlatform.supports_speculative_draft_attention_backend", OVR, ("self", "algorithm", "backend"),
       used_by="cpu.patches", cpu_only=True),
    _s("SRTPlatform.get_default_speculative_draft_attention_backend", _PLATFORM,
       "SRTPlatform.get_default_speculative_draft_attention_backend", OVR, ("self", "algorithm"),
       used_by="cpu.patches", cpu_only=True),
    _s("DFlashAttention", "sglang.srt.models.dflash", "DFlashAttention", R, attrs=("use_table_qk_norm_rope",),
       used_by="cpu.patches", cpu_only=True),
    _s("DFlashAttention.__init__", "sglang.srt.models.dflash", "DFlashAttention.__init__", AFTER, ("self",),
       used_by="cpu.patches", cpu_only=True),
    # DSpark drafters in bf16: the context K/V write goes through a fused Triton kernel unless the bundle is None
    _s("DSparkDraftMixin._build_fused_kv_write_bundle", "sglang.srt.models.dspark",
       "DSparkDraftMixin._build_fused_kv_write_bundle", AROUND, ("self", "pool"), used_by="cpu.dspark",
       cpu_only=True),
    _s("TorchNativeAttnBackend", _TN, "TorchNativeAttnBackend", R, used_by="cpu.patches", cpu_only=True,
       attrs=("token_to_kv_pool", "req_to_token_pool", "swa_out_cache_loc")),
    _s("TorchNativeAttnBackend.forward_extend", _TN, "TorchNativeAttnBackend.forward_extend", AROUND,
       ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"), used_by="cpu.patches", cpu_only=True),
    _s("TorchNativeAttnBackend._run_sdpa_forward_decode", _TN, "TorchNativeAttnBackend._run_sdpa_forward_decode",
       AROUND, ("self", "query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
                "encoder_lens", "scaling", "enable_gqa", "causal", "is_cross_attn", "sliding_window_size"),
       used_by="cpu.patches", cpu_only=True),
    _s("Qwen3GatedDeltaNet.__init__", "sglang.srt.models.qwen3_next", "Qwen3GatedDeltaNet.__init__", AROUND,
       ("self", "config", "layer_id"), used_by="cpu.hybrid_gdn", cpu_only=True),
    _s("FusedRMSNormGated.forward", "sglang.kernels.ops.attention.fla.fused_norm_gate", "FusedRMSNormGated.forward",
       AROUND, ("self", "x", "g", "residual", "prenorm", "residual_in_fp32"),
       used_by="cpu.hybrid_gdn", cpu_only=True),
    _s("qwen2_moe.fused_gate_sigmoid_mul_add", "sglang.srt.models.qwen2_moe", "fused_gate_sigmoid_mul_add", AROUND,
       ("hidden_states", "gate_weight", "shared_output", "final_hidden_states"), used_by="cpu.hybrid_gdn",
       cpu_only=True),
    _s("scatter_mamba_states_after_mtp_verify", "sglang.srt.layers.attention.hybrid_linear_attn_backend",
       "scatter_mamba_states_after_mtp_verify", AROUND,
       ("mamba_caches", "state_indices_tensor", "last_correct_step_indices", "mamba_track_indices",
        "mamba_steps_to_track", "src_indices_raw"), used_by="cpu.hybrid_gdn", cpu_only=True),
    _s("dflash._radix_topk", _DFLASH_M, "_radix_topk", AROUND, ("scores", "k"), used_by="cpu.dflash2",
       cpu_only=True),
    _s("dflash._score_edges", _DFLASH_M, "_score_edges", AROUND,
       ("predecessor_table", "successor_table", "candidate_ids", "unary_logits", "hidden", "anchor_token_ids",
        "top_k"), used_by="cpu.dflash2", cpu_only=True),
    _s("dflash._follow_maps", _DFLASH_M, "_follow_maps", AROUND, ("maps", "initial_indices", "edges"),
       used_by="cpu.dflash2", cpu_only=True),
    # DSpark drafters under SGLang's DSPARK worker on the CPU engine (cpu/dspark.py, adaptation 16)
    _s("speculative_hook.resolving_view", _SPEC_HOOK, "resolving_view", MP, ("server_args",),
       used_by="cpu.dspark", cpu_only=True),
    _s("_disable_overlap_schedule_for_cpu", _SPEC_HOOK, "_disable_overlap_schedule_for_cpu", R, ("server_args",),
       used_by="cpu.dspark", cpu_only=True),
    # Qwen4-Exp (GDN + QSA) targets on the CPU engine (cpu/qwen4_exp.py, adaptation 13)
    _s("layernorm_gated.RMSNorm.forward", "sglang.kernels.ops.attention.fla.layernorm_gated", "RMSNorm.forward",
       AROUND, ("self", "x", "z"), used_by="cpu.qwen4_exp", cpu_only=True),
    _s("GatedResidual.__init__", "sglang.srt.layers.hyperconnection", "GatedResidual.__init__", AROUND,
       ("self", "config", "use_mix", "use_combine", "role"), used_by="cpu.qwen4_exp", cpu_only=True),
    _s("QSAIndexer.forward_native", _QSA_IDX, "QSAIndexer.forward_native", AROUND,
       used_by="cpu.qwen4_exp", cpu_only=True),
    _s("QSAIndexer._forward_impl", _QSA_IDX, "QSAIndexer._forward_impl", R,
       ("self", "hidden_states", "positions", "forward_batch", "indexer_metadata", "cp_global_rope_positions"),
       used_by="cpu.qwen4_exp", cpu_only=True),
    _s("QSAIndexer._validate_config", _QSA_IDX, "QSAIndexer._validate_config", MP, ("config",),
       used_by="cpu.qwen4_exp", cpu_only=True),
    _s("qsa.metadata.gather_qsa_compressed_keys", _QSA_META, "gather_qsa_compressed_keys", AROUND,
       ("compressed", "token_slot_table", "cu_blocks", "total_blocks", "max_blocks", "compress_ratio"),
       used_by="cpu.qwen4_exp", cpu_only=True),
    _s("qsa.config._COMPRESSED_BLOCK_TOPK", _QSA_CFG, "_COMPRESSED_BLOCK_TOPK", MP, used_by="cpu.qwen4_exp",
       cpu_only=True),
    # the two-group pending ring of QSA index keys (cpu/qsa_ring.py, adaptation 14)
    _s("QSATokenToKVPool.__init__", "sglang.srt.mem_cache.qsa_kv_pool", "QSATokenToKVPool.__init__", AROUND,
       ("self",), used_by="cpu.qsa_ring", cpu_only=True),
    *(_s(f"{short}.{fn}", module, fn, MP, ring_params, used_by="cpu.qsa_ring", cpu_only=True)
      for short, module in (("qsa_indexer", _QSA_IDX),
                            ("qwen_sparse_attn_backend", "sglang.srt.layers.attention.qwen_sparse_attn_backend"))
      for fn, ring_params in (("build_pending_ring_slots", ("token_to_batch_idx", "req_pool_indices",
                                                            "sequence_lengths", "logical_positions",
                                                            "compress_ratio", "is_extend")),
                              ("build_group_ring_slots", ("req_pool_indices", "group_end_positions", "sequence_ids",
                                                          "compress_ratio")))),
    _s("parse_qsa_profile", _QSA_CFG, "parse_qsa_profile", R, ("config",), used_by="cpu.qwen4_exp",
       cpu_only=True),
    _s("KVWriteLoc", _TN, "KVWriteLoc", R, ("loc", "swa_loc"), used_by="cpu.patches", cpu_only=True),
    _s("AttentionType", _RADIX, "AttentionType", R, attrs=("ENCODER_ONLY",), used_by="cpu.patches", cpu_only=True),
    _s("KVCache", "sglang.srt.mem_cache.memory_pool", "KVCache", R, used_by="cpu.patches", cpu_only=True,
       attrs=("set_kv_buffer", "get_key_buffer", "get_value_buffer")),
    _s("verify_sampling.tree_speculative_sampling_target_only", "sglang.kernels.ops.speculative.verify_sampling",
       "tree_speculative_sampling_target_only", MP, used_by="cpu.sampling_verify", cpu_only=True, may_be_none=True,
       params=("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
               "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
               "draft_probs", "threshold_single", "threshold_acc", "deterministic")),
    _s("dflash_utils.tree_speculative_sampling_target_only", "sglang.srt.speculative.dflash_utils",
       "tree_speculative_sampling_target_only", MP, used_by="cpu.sampling_verify", cpu_only=True, may_be_none=True),
    _s("dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE", "sglang.srt.speculative.dflash_utils",
       "_DFLASH_SAMPLING_VERIFY_AVAILABLE", MP, used_by="cpu.sampling_verify", cpu_only=True),
    _s("chain_speculative_sampling_triton", _DSPARK_ACCEPT, "chain_speculative_sampling_triton", MP,
       used_by="cpu.chain_sampling", cpu_only=True,
       params=("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "retrive_next_token",
               "retrive_next_sibling", "uniform_samples", "uniform_samples_for_final_sampling", "target_probs",
               "draft_probs", "threshold_single", "threshold_acc", "deterministic", "block_verification")),
)

BY_NAME: Dict[str, Symbol] = {s.name: s for s in SYMBOLS}
if len(BY_NAME) != len(SYMBOLS):  # pragma: no cover - a table edit error, caught at import by every test
    raise RuntimeError("compat.SYMBOLS has duplicate names")
