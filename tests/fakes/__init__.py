"""Stand-ins shared by several test modules: fake fleet workers, a fake traffic spool, an in-process HTTP stub server,
fake training servers, the sgl_kernel stand-in loader, CLI runners. Test modules import these from here and never
from another test module, so what one test module defines or leaves behind cannot change what another one sees
(docs/testing.md). Each module here imports only the code under test, the standard library and pytest.
"""
