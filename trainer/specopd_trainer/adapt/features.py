"""Context features of served traffic for ``specopd adapt``: captured while serving where the server does, else one
features-only ``score_trees`` call (the second pass).

A server started with ``traffic_features_mb > 0`` keeps, beside each spooled item, the target's hidden rows at the
drafter's ``target_layer_ids`` for positions ``start .. len - 2`` (``sglang_specopd.server.traffic.features``):
``start`` > 0 when SGLang's radix cache served a prefix (a shared system prompt, a repeated question) whose rows an
earlier request computed. Those rows are the same for every request with that prefix (causal attention): they are
copied from a recent item that shares the prefix (the request that put it in the radix cache, usually; the last
:data:`DONORS` items are kept for that), else fetched once per distinct prefix with ``score_trees`` and cached
(:class:`PrefixRows`, LRU under a byte cap). The row of
the last served token, which the server never computes, is not needed: a drafter block at anchor ``a`` sees context
positions ``< a`` and the last anchor is ``len - 2``; the features are padded with a copy of the last row so that
they have one row per token like the score_trees ones.

Counted in :attr:`FeatureSource.counts`: ``served`` items (no prefill), ``scored`` (second pass), ``prefix_copies``
(prefix rows taken from a recent item), ``prefix_calls`` (prefix fills by score_trees) and the target tokens each
path cost (``served_tokens``, ``scored_tokens``, ``prefix_tokens``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from specopd_trainer.adapt.reader import ServedItem

MAX_SEQS_PER_CALL = 64
SCORE_BATCH = 8
DONORS = 128  # recent items whose rows can fill a later item's radix-cached prefix


class FeatureCaptureUnavailable(RuntimeError):
    """``features="served"`` was asked for but the server does not capture features (its reason)."""


class PrefixRows:
    """LRU of prefix feature rows keyed by the sha256 of the prefix ids, at most ``max_bytes``."""

    def __init__(self, max_bytes: int = 64 * 2**20):
        self.max_bytes, self.bytes = int(max_bytes), 0
        self._rows: "OrderedDict[str, torch.Tensor]" = OrderedDict()

    @staticmethod
    def key(ids: Sequence[int]) -> str:
        return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()

    def get(self, ids: Sequence[int]) -> Optional[torch.Tensor]:
        k = self.key(ids)
        rows = self._rows.get(k)
        if rows is not None:
            self._rows.move_to_end(k)
        return rows

    def put(self, ids: Sequence[int], rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        if size > self.max_bytes:
            return
        self._rows[self.key(ids)] = rows
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._rows.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


class FeatureSource:
    """Features for :class:`~specopd_trainer.adapt.reader.ServedItem` lists (``mode``: auto | served | score).

    Args:
        client: the server's client (admin key for the features route). layer_ids: the drafter's
            ``target_layer_ids``. mode: see :class:`specopd_trainer.adapt.config.AdaptConfig.features`.
    """

    def __init__(self, client, layer_ids: Sequence[int], mode: str = "auto", dtype: torch.dtype = torch.bfloat16):
        if mode not in ("auto", "served", "score"):
            raise ValueError(f"features mode must be auto, served or score, got {mode!r}")
        self.client, self.layer_ids, self.mode, self.dtype = client, list(layer_ids), mode, dtype
        self.prefix = PrefixRows()
        self._donors: "deque[Tuple[List[int], torch.Tensor]]" = deque(maxlen=DONORS)
        self._server_captures: Optional[bool] = None if mode != "score" else False
        self.counts: Dict[str, int] = {"served": 0, "scored": 0, "prefix_copies": 0, "prefix_calls": 0,
                                       "served_tokens": 0, "scored_tokens": 0, "prefix_tokens": 0}

    def _score(self, ids_list: List[List[int]]) -> List[torch.Tensor]:
        from sglang_specopd.wire.protocol import ScoreTreesRequest

        out: List[torch.Tensor] = []
        for i in range(0, len(ids_list), SCORE_BATCH):
            chunk = ids_list[i:i + SCORE_BATCH]
            req = ScoreTreesRequest(references=[{"input_ids": ids} for ids in chunk], block_size=2, returns=[],
                                    feature_layer_ids=self.layer_ids, output_dtype="bfloat16")
            out += [sc.features.to(self.dtype) for sc in self.client.score_trees(req)]
        return out

    def _served(self, items: List[ServedItem], spool_id: str) -> Dict[str, Tuple[int, torch.Tensor]]:
        from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError

        if self._server_captures is False:
            return {}
        wanted = [it for it in items if it.features is not None]
        got: Dict[str, Tuple[int, torch.Tensor]] = {}
        for i in range(0, len(wanted), MAX_SEQS_PER_CALL):
            part = wanted[i:i + MAX_SEQS_PER_CALL]
            try:
                rows, _missing = self.client.traffic_features([it.seq for it in part], spool_id)
            except ServerUnavailableError:  # a fleet worker dropped out since it was read: the second pass
                return got  # (score_trees on the workers still up) gives these items their features
            except ServerRequestError as exc:
                if exc.status in (404, 409):  # capture off / the spool restarted: nothing served to take
                    if exc.status == 404:
                        self._server_captures = False
                        if self.mode == "served":
                            raise FeatureCaptureUnavailable(str(exc)) from None
                    return got
                raise
            self._server_captures = True
            by_seq = {it.seq: it for it in part}
            for seq, (start, t) in rows.items():
                if seq in by_seq:
                    got[by_seq[seq].key] = (start, t)
        return got

    def features(self, items: List[ServedItem]) -> Dict[str, torch.Tensor]:
        """``{item key: features [len(input_ids), K*H]}`` for every item (captured rows where the server holds
        them, the second pass for the rest). Raises :class:`FeatureCaptureUnavailable` in mode ``served`` on a
        server that does not capture, and the client's errors."""
        if not items:
            return {}
        served: Dict[str, Tuple[int, torch.Tensor]] = {}
        if self.mode != "score":
            by_spool: Dict[str, List[ServedItem]] = {}  # a fleet's items come from several workers' spools
            for it in items:
                by_spool.setdefault(it.key.rsplit(":", 1)[0], []).append(it)
            for spool_id, part in by_spool.items():
                served.update(self._served(part, spool_id))
        out: Dict[str, torch.Tensor] = {}
        rest: List[ServedItem] = []
        for it in items:
            got = served.get(it.key)
            rows = None if got is None else self._assemble(it, *got)
            if rows is None:
                rest.append(it)
                continue
            out[it.key] = rows
            self._donors.append((it.input_ids, rows))
            self.counts["served"] += 1
            self.counts["served_tokens"] += len(it.input_ids)
        if rest:
            for it, rows in zip(rest, self._score([it.input_ids for it in rest])):
                out[it.key] = rows
                self._donors.append((it.input_ids, rows))
                self.counts["scored"] += 1
                self.counts["scored_tokens"] += len(it.input_ids)
        return out

    def _donated(self, prefix_ids: List[int]) -> Optional[torch.Tensor]:
        """Rows ``[0, len(prefix_ids))`` of a recent item starting with ``prefix_ids`` (newest first), or None."""
        n = len(prefix_ids)
        for ids, rows in reversed(self._donors):
            if len(ids) > n and rows.shape[0] >= n and ids[:n] == prefix_ids:
                return rows[:n]
        return None

    def _assemble(self, it: ServedItem, start: int, rows: torch.Tensor) -> Optional[torch.Tensor]:
        n = len(it.input_ids)
        if start + rows.shape[0] != n - 1 or rows.ndim != 2:
            return None
        parts = []
        if start > 0:
            prefix_ids = it.input_ids[:start]
            pre = self._donated(prefix_ids)
            if pre is not None:
                self.counts["prefix_copies"] += 1
            else:
                pre = self.prefix.get(prefix_ids)
            if pre is None:
                pre = self._score([prefix_ids])[0]
                self.prefix.put(prefix_ids, pre)
                self.counts["prefix_calls"] += 1
                self.counts["prefix_tokens"] += start
            if pre.shape[0] != start or pre.shape[1] != rows.shape[1]:
                return None
            parts.append(pre)
        parts += [rows.to(self.dtype), rows[-1:].to(self.dtype)]  # the last token's row: never used, padded
        return torch.cat(parts)
