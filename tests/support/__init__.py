"""Fixtures and helpers shared by several test modules: the shared SPECOPD servers of the hybrid-GDN, QSA and
parity targets (started through ``tests/_servers.py``), the score_trees request helpers and the shared admin
server's view (:mod:`support.score_trees`), serving checks (:mod:`support.serving`) and the Triton interpreter
fixture (:mod:`support.triton`). Test modules import these from here, never from another test module
(docs/testing.md); a module here imports only the code under test, ``conftest``/``_servers`` and pytest.
"""
