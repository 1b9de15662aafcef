"""Real SGLang servers shared by several test modules: started once per session, stopped after their last user.

Starting a server costs ~40-100 s on a 2-core CPU machine (SGLang's imports in three processes), far more than
most tests that use one, so modules that need the same configuration share one server:

* :func:`acquire` starts the server the first time a module asks for it (``name``: the module-scoped fixture that
  hands it out) and returns the running one afterwards; :func:`release`, at the end of each such module, stops it
  when no later test of the session uses that fixture (so it does not stay up, idle, while other modules start
  theirs); :func:`shared_servers_guard` (session-scoped) stops whatever is still running at the end of the
  session, whatever happened (``-x``, Ctrl-C);
* :func:`group_modules` (conftest's ``pytest_collection_modifyitems``) runs the modules that share a server one
  after another, at the place of the first of them, so a shared server is up for one stretch of the session;
* :func:`checkout` puts a shared SPECOPD server back the way it started before each module uses it: a staged
  rollout transaction aborted, the start-up drafter serving again under its start-up version name (``"initial"``)
  if a module swapped drafters, the start-up speculative policy (``fixed`` / ``goodput``) if a module changed it,
  SGLang's radix cache flushed, the score_trees prefix cache (if any) emptied. So a
  module sees what a fresh server would show, except the swap counter, which keeps counting (tests compare it
  with the value they read first).
"""

from __future__ import annotations

import contextlib
import json
from typing import Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import pytest

T = TypeVar("T")

# The module-scoped fixtures that hand out a shared server (what :func:`group_modules` groups by), in no order.
# (conftest's ``tiny_specopd_server`` is another name for ``tiny_admin_server``: it depends on it, so its modules
# are grouped with that server's.)
SHARED_SERVER_FIXTURES = ("tiny_admin_server", "parity_server", "hybrid_specopd_server", "qsa_specopd_server")
# Every fixture that starts a real SGLang server (or whose value comes from one): a test that uses one of them, even
# through another fixture, gets the ``server`` marker (conftest's ``pytest_collection_modifyitems``), so
# ``-m "not server"`` (``scripts/test.sh --quick``) leaves it out. A test that launches a server itself (a CLI, a
# benchmark script) carries ``@pytest.mark.server`` explicitly.
SERVER_FIXTURES = SHARED_SERVER_FIXTURES + (
    "tiny_specopd_server", "tiny_plain_outputs", "smollm2_plain_outputs", "smollm2_specopd_server", "adapt_server",
    "budget_server", "unbudgeted_replies", "v2_server", "dspark_server", "qsa_server")

_LIVE: Dict[str, Tuple[contextlib.ExitStack, object]] = {}
STARTS: List[str] = []  # every shared server started in this session, by fixture name (for the suite's summary)


def acquire(name: str, start: Callable[[contextlib.ExitStack], T]) -> T:
    """The shared server ``name``; ``start(stack)`` starts it (entering its context managers on ``stack``, which
    :func:`stop` closes) the first time, and its return value is handed out from then on."""
    if name not in _LIVE:
        stack = contextlib.ExitStack()
        try:
            value = start(stack)
        except BaseException:
            stack.close()
            raise
        _LIVE[name] = (stack, value)
        STARTS.append(name)
    return _LIVE[name][1]  # type: ignore[return-value]


def stop(name: str) -> None:
    """Stop the shared server ``name`` if it runs (its teardown checks run here: orphans, leftover files)."""
    entry = _LIVE.pop(name, None)
    if entry is not None:
        entry[0].close()


def used_later(request: pytest.FixtureRequest, name: str) -> bool:
    """Whether a test after the current module (``request`` of a module-scoped fixture) uses fixture ``name``."""
    items = request.session.items
    prefix = request.node.nodeid + "::"
    mine = [i for i, it in enumerate(items) if it.nodeid.startswith(prefix)]
    if not mine:
        return False
    return any(name in getattr(it, "fixturenames", ()) for it in items[mine[-1] + 1:])


def release(request: pytest.FixtureRequest, name: str) -> None:
    """End of a module that used the shared server ``name``: stop it unless a later test needs it."""
    if not used_later(request, name):
        stop(name)


def lend(request: pytest.FixtureRequest, name: str, start: Callable[[contextlib.ExitStack], T]) -> Iterator[T]:
    """The body of the module-scoped fixture ``name`` (``yield from lend(...)``): the shared server, started by
    ``start`` if needed, put back the way it started (:func:`checkout`); released at the end of the module."""
    srv = acquire(name, start)
    checkout(srv)
    yield srv
    release(request, name)


def start_specopd(stack: contextlib.ExitStack, spec, log_dir, name: str):
    """Start SPECOPD server ``spec`` on ``stack`` (conftest's ``running_server``: tagged, orphan checks at stop) and
    record its start-up drafter (:func:`remember_start`); the :class:`conftest.RunningServer`."""
    from conftest import running_server

    srv = stack.enter_context(running_server(spec, log_dir, name))
    remember_start(srv)
    return srv


@pytest.fixture(scope="session")
def shared_servers_guard():
    """Safety net: every shared server is stopped at the end of the session."""
    yield
    for name in list(_LIVE):
        stop(name)


def mark_server_tests(items: list) -> None:
    """Give the ``server`` marker to every item that uses a fixture of :data:`SERVER_FIXTURES`."""
    for it in items:
        if it.get_closest_marker("server") is None and set(SERVER_FIXTURES) & set(getattr(it, "fixturenames", ())):
            it.add_marker(pytest.mark.server)


def group_modules(items: list) -> None:
    """Reorder ``items`` in place: the modules whose tests use the same shared server run one after another, at
    the place of the first of them, and in each module the tests marked ``ends_module`` (they end the module's
    shared state: stop its fleet, reload its target) run after the others, whatever order pytest-randomly drew.
    Then the groups that start servers (a test marked ``server``) come before the others, each part in the order
    drawn: xdist's loadgroup scheduler hands out groups in collection order (``scripts/test.sh`` passes
    ``--no-loadscope-reorder``; by default it orders them by their number of tests), so the long server groups are
    shared out first and the short ones fill in at the end, instead of one worker starting the last server while
    the other has nothing left (longest first, as in LPT scheduling)."""
    modules: Dict[str, list] = {}
    key: Dict[str, Optional[str]] = {}
    for it in items:
        mod = it.nodeid.split("::", 1)[0]
        modules.setdefault(mod, []).append(it)
        if key.get(mod) is None:
            key[mod] = next((n for n in SHARED_SERVER_FIXTURES if n in getattr(it, "fixturenames", ())), None)
    groups: List[List[str]] = []
    placed: set = set()
    for mod in modules:
        if mod in placed:
            continue
        group = [mod] if key[mod] is None else [m for m in modules if key[m] == key[mod] and m not in placed]
        placed.update(group)
        groups.append(group)

    def starts_servers(group: List[str]) -> bool:
        return any(it.get_closest_marker("server") is not None for m in group for it in modules[m])

    order = [m for g in sorted(groups, key=lambda g: not starts_servers(g)) for m in g]  # sorted() is stable
    items[:] = [it for mod in order for it in sorted(modules[mod], key=lambda i: i.get_closest_marker("ends_module")
                                                     is not None)]


def xdist_groups(items: list) -> None:
    """Under pytest-xdist (``--dist loadgroup``, what ``scripts/test.sh`` runs with ``-n 2``): every test gets an
    ``xdist_group`` so that each shared server is started by one worker only and each module-scoped fixture once.
    The group of a module is the shared server it uses (so all of that server's modules run on one worker, one
    after another, in :func:`group_modules` order), else the module itself."""
    key: Dict[str, str] = {}
    for it in items:
        mod = it.nodeid.split("::", 1)[0]
        shared = next((n for n in SHARED_SERVER_FIXTURES if n in getattr(it, "fixturenames", ())), None)
        if shared is not None or mod not in key:
            key[mod] = shared or key.get(mod) or mod
    for it in items:
        group = key[it.nodeid.split("::", 1)[0]]
        it.add_marker(pytest.mark.xdist_group(name=group))
        _suffix_group(it, group)


def _suffix_group(item, group: str) -> None:
    """Append ``@group`` to the item's node id, which is what xdist's loadgroup scheduler groups by. (xdist 3.8's own
    worker hook does this by setting ``item._nodeid``, which pytest 9.2 no longer reads: its node ids are structured,
    ``item._id``; and that hook has already run when the marks are given here.)"""
    if "@" in item.nodeid.rsplit("]", 1)[-1]:
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _admin_headers(srv) -> Dict[str, str]:
    key = srv.spec.admin_api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def drafter_info(url: str, admin_key: Optional[str] = None) -> dict:
    """``GET /specopd/drafter``, or with ``admin_key`` ``GET /specopd/drafter/admin`` (which adds ``path``)."""
    import httpx

    from sglang_specopd.wire.protocol import DRAFTER_ADMIN_INFO_PATH, DRAFTER_INFO_PATH

    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    r = httpx.get(url + (DRAFTER_ADMIN_INFO_PATH if admin_key else DRAFTER_INFO_PATH), headers=headers, timeout=60)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def remember_start(srv) -> None:
    """Record the drafter info of a just-started SPECOPD server (``srv.extra["initial_info"]``; with its checkpoint
    path when the server has an admin key) for :func:`checkout`."""
    srv.extra["initial_info"] = drafter_info(srv.url, srv.spec.admin_api_key)
    srv.extra["swaps_seen"] = 0
    srv.extra["initial_policy"] = _policy_name(srv.url)


def _policy_name(url: str) -> Optional[str]:
    """The serving speculative policy (``GET /specopd/policy``), None where the server has no policy route."""
    import httpx

    from sglang_specopd.wire.policy import POLICY_PATH

    r = httpx.get(url + POLICY_PATH, timeout=60)
    return r.json().get("policy") if r.status_code == 200 else None


def checkout(srv) -> None:
    """Put the shared SPECOPD server ``srv`` back the way it started (see the module docstring).

    A drafter swapped in since the last checkout is replaced by the start-up one (``{"path", "version"}`` swap,
    admin key required: a server without one cannot have swapped). Raises AssertionError if the server refuses.
    """
    import httpx

    from sglang_specopd.wire.protocol import PREFIX_CACHE_PATH, SWAP_DRAFTER_PATH

    initial, headers = srv.extra["initial_info"], _admin_headers(srv)
    now = drafter_info(srv.url, srv.spec.admin_api_key)
    if now.get("staged"):  # a rollout transaction left staged (a failed test): drop it, or the swap below gets 409
        from sglang_specopd.wire.rollout import ABORT_DRAFTER_PATH

        r = httpx.post(srv.url + ABORT_DRAFTER_PATH, json={"txn": now["staged"]["txn"]}, headers=headers, timeout=60)
        assert r.status_code == 200 and r.json()["aborted"], f"aborting a staged transaction -> {r.text[:300]}"
    if now["swaps"] != srv.extra["swaps_seen"]:
        body = json.dumps({"path": initial["path"], "version": initial["version"]}).encode()
        r = httpx.post(srv.url + SWAP_DRAFTER_PATH, content=body, headers=headers, timeout=120)
        assert r.status_code == 200, f"restoring the start-up drafter -> {r.status_code}: {r.text[:300]}"
        now = drafter_info(srv.url, srv.spec.admin_api_key)
        assert now["version"] == initial["version"] and now["path"] == initial["path"], now
    srv.extra["swaps_seen"] = now["swaps"]
    policy = srv.extra.get("initial_policy")
    if policy is not None and _policy_name(srv.url) != policy:  # a module left another policy serving
        from sglang_specopd.wire.policy import POLICY_PATH

        r = httpx.post(srv.url + POLICY_PATH, json={"policy": policy}, headers=headers, timeout=60)
        assert r.status_code == 200, f"restoring the start-up policy -> {r.status_code}: {r.text[:300]}"
    r = httpx.post(srv.url + "/flush_cache", params={"timeout": 30}, headers=headers, timeout=90)
    assert r.status_code == 200, f"/flush_cache -> {r.status_code}: {r.text[:300]}"
    if srv.spec.prefix_cache_mb:
        r = httpx.post(srv.url + PREFIX_CACHE_PATH + "/clear", headers=headers, timeout=60)
        assert r.status_code == 200, f"prefix cache clear -> {r.status_code}: {r.text[:300]}"
