"""Proposal-tree scoring on the served target (``/specopd/score_trees``), inside SGLang's scheduler.

:mod:`.forward` runs one packed tree forward; :mod:`.tree_call` is its state shared by the layer hooks;
:mod:`.admission` / :mod:`.queue` / :mod:`.cost` / :mod:`.chunks` admit, queue, cost and chunk requests;
:mod:`.head`, :mod:`.line`, :mod:`.gdn` and :mod:`.qsa` handle the LM head, line trees, hybrid GDN and QSA targets.
May import :mod:`sglang_specopd.server.compat`, :mod:`sglang_specopd.server.control`, :mod:`sglang_specopd.server.http`,
the plugin's leaf modules (prefix cache, Qwen4-exp features), the wire protocol and the kernels; never ``sglang``.
"""
