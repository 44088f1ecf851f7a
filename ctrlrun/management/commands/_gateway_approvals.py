"""The gateway's authority and webhook flags (§E1, §C2, §D6): ``--authority FILE``, and
``--webhook-url`` with ``--webhook-secret-file``, ``--public-url`` and ``--allow-insecure-webhook``.

``add_approval_arguments(parser)`` declares them; ``authority_from(options)`` checks the authority
file against the process's own (``CTRLRUN_AUTHORITY``); ``webhook_from(options)`` builds the
``ctrlrun.webhook.WebhookApprovalProvider`` the gateway's Control asks for approvals, and the secret
the gateway checks signed answers with at ``POST /ctrlrun/approvals/<id>``. ``authority_line`` and
``approvals_line`` are the banner's.
"""
from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from ...errors import CTRLRunError
from ..base import Error

__all__ = ["add_approval_arguments", "authority_from", "webhook_from", "authority_line", "approvals_line"]

_WITH_WEBHOOK = (("public_url", "--public-url"), ("webhook_secret_file", "--webhook-secret-file"),
                 ("allow_insecure_webhook", "--allow-insecure-webhook"))


def add_approval_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--authority", metavar="FILE",
                        help="a standalone authority file (exactly schema and authority:) enforced with the policy")
    hooks = parser.add_argument_group("webhook approvals")
    hooks.add_argument("--webhook-url", help="deliver each approval request, signed, to this https URL")
    hooks.add_argument("--webhook-secret-file", help="the shared secret (32 bytes or more) signing deliveries and "
                                                     "answers (default CTRLRUN_WEBHOOK_SECRET_FILE, else "
                                                     "$CTRLRUN_WEBHOOK_SECRET)")
    hooks.add_argument("--public-url", help="this gateway's public base URL: each request carries respond_to "
                                            "<URL>/ctrlrun/approvals/<id>, where the gateway takes the answer")
    hooks.add_argument("--allow-insecure-webhook", action="store_true",
                       help="allow an http:// --webhook-url to a loopback address (tests)")


def authority_from(options: dict[str, Any]) -> Path | None:
    """The ``--authority`` file, refused when the process already enforces a different one."""
    given = options.get("authority")
    if not given:
        return None
    from ... import conf

    path = Path(given)
    configured = conf.authority_path()
    if configured is not None and configured.resolve() != path.resolve():
        raise Error(f"--authority {given} and CTRLRUN_AUTHORITY ({configured}) name different files: the grants "
                    f"of one would be left unenforced. Give the grants in one file")
    return path


def webhook_from(options: dict[str, Any]) -> tuple[Any, bytes | None, float]:
    """``(WebhookApprovalProvider or None, the answers' secret or None, replay window)``."""
    from ... import conf

    if not options.get("webhook_url"):
        stray = [flag for key, flag in _WITH_WEBHOOK if options.get(key)]
        if stray:
            raise Error(f"{', '.join(stray)} {'goes' if len(stray) == 1 else 'go'} with --webhook-url (the webhook "
                        f"approvals: where requests are delivered); without it approvals are answered on the "
                        f"console or with `ctrlrun approve`")
        return None, None, conf.webhook_replay_window()
    from ...webhook import WebhookApprovalProvider, webhook_secret

    window = conf.webhook_replay_window()
    try:
        secret = webhook_secret(options.get("webhook_secret_file") or conf.webhook_secret_file())
        provider = WebhookApprovalProvider(url=options["webhook_url"], secret=secret,
                                           public_url=options.get("public_url") or None,
                                           allow_insecure=bool(options.get("allow_insecure_webhook")),
                                           replay_window=window)
    except CTRLRunError as exc:
        message = str(exc).replace("allow_insecure=True", "--allow-insecure-webhook").replace(
            "allow_insecure", "--allow-insecure-webhook")
        raise Error(message) from None
    return provider, secret, window


def authority_line(policy: Any) -> str:
    authority = policy.authority
    if authority is None:
        return ("authority: none (the policy has no authority: section and there is no --authority file, so every "
                "principal is unrestricted)")
    document = policy.authority_document
    where = f"the authority file {document.source}" if document is not None else "the policy's authority: section"
    grants = sorted(authority.grants)
    return (f"authority: {len(grants)} grant{'' if len(grants) == 1 else 's'} from {where} "
            f"({', '.join(grants) or 'none: nothing is permitted'}); a call no grant permits is refused -41012")


def approvals_line(provider: Any) -> str:
    if provider is None:
        return "approvals: answered on the console or with `ctrlrun approve` (no --webhook-url)"
    answers = (f"respond_to {provider.public_url.rstrip('/')}/ctrlrun/approvals/<id>" if provider.public_url
               else "no respond_to (no --public-url)")
    return (f"approvals: each request delivered, signed, to {provider.url}; {answers}; signed answers taken at "
            f"POST /ctrlrun/approvals/<id>")
