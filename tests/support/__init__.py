"""Plain helpers shared by the tests (never imported from a test module by another: from here), by
concern. ``from tests.support import X`` finds X in whichever module holds it.

- ``base``: a stand-in remote and the refund protected in front of it, readers of the evidence,
  console users, OS processes started on the test store;
- ``machine``: the system packages a test needs (one line when missing, a failure under CI);
- ``roles``: the application's database role and the role matrix's agent;
- ``policies``: the policies several test modules share (``tests/policies/*.yaml``);
- ``sites``: fresh Django projects and script folders built as the README says;
- ``calls``: calls held open in another OS process; the give-back attack stores;
- ``console``: the console through Django's test client and in Chromium at 1280 px;
- ``resumption``: paused framework runs;
- ``tokens``: signed JWTs, and the loopback JWKS and revocation-feed servers.
- ``smtp``: a real SMTP server on loopback (aiosmtpd), a refusing one, a closed port.
- ``mcp_servers``: MCP upstreams (SDK-built and misbehaving) and the gateway as a process.
- ``operator``: ``ctrlrun mcp-operator`` as a process and the SDK's client calling its tools.
- ``hooks``: a webhook receiver on loopback.
- ``tls``: self-signed certificates and a TLS-terminating proxy on loopback (certificate pins).
- ``scratch``: scratch stores for ``verify`` and clock skew, and an agent under a clock that moves.

The fixtures built on these live in ``tests/conftest.py`` and ``tests/*/conftest.py``.
"""
from .base import *  # noqa: F401,F403
from .machine import *  # noqa: F401,F403
from .roles import *  # noqa: F401,F403
from .policies import *  # noqa: F401,F403
from .sites import *  # noqa: F401,F403
from .calls import *  # noqa: F401,F403
from .console import *  # noqa: F401,F403
from .resumption import *  # noqa: F401,F403
from .tokens import *  # noqa: F401,F403
from .smtp import *  # noqa: F401,F403
from .mcp_servers import *  # noqa: F401,F403
from .scratch import *  # noqa: F401,F403
from .hanging import *  # noqa: F401,F403
from .tls import *  # noqa: F401,F403
from .hooks import *  # noqa: F401,F403
