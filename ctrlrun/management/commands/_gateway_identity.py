"""Who acts at the gateway, from its command line: ``--principal``, ``--principal-header`` (with
``--user-header``) or ``--identity-jwt`` and its ``--identity-jwt-*`` flags (§E1, §D2).

``add_identity_arguments(parser)`` declares the flags; ``identity_from(options)`` gives the
gateway's principal callable (``--principal``) or an identity provider the Control asks with each
request's headers, the headers it reads (never passed on to the tool) and the banner's lines.
"""
from __future__ import annotations

from argparse import SUPPRESS, ArgumentParser
from pathlib import Path
from typing import Any

from ...errors import CTRLRunError
from ..base import Error

__all__ = ["add_identity_arguments", "identity_from"]

_JWT_FLAGS = ("jwt_jwks_url", "jwt_public_key_file", "jwt_secret_file", "jwt_algorithm", "jwt_issuer", "jwt_audience",
              "jwt_token_type", "jwt_header", "jwt_agent_claim", "jwt_user_claim", "jwt_claim", "jwt_leeway")


def add_identity_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--principal", help="the agent every call through this gateway acts for")
    parser.add_argument("--principal-from-client-info", action="store_true", help=SUPPRESS,
                        default=False, dest="from_client_info")
    parser.add_argument("--principal-header", help="the request header naming the agent (set by a proxy you trust)")
    parser.add_argument("--user-header", help="the request header naming the user the agent acts for "
                                              "(with --principal-header, or the JWT's --identity-jwt-user-claim)")
    parser.add_argument("--identity-jwt", action="store_true", help="verify a bearer JWT on every request")
    jwt = parser.add_argument_group("JWT identity (--identity-jwt)")
    jwt.add_argument("--identity-jwt-jwks-url", dest="jwt_jwks_url", help="the issuer's JWKS URL")
    jwt.add_argument("--identity-jwt-public-key-file", dest="jwt_public_key_file", help="a PEM public key file")
    jwt.add_argument("--identity-jwt-secret-file", dest="jwt_secret_file",
                     help="a file holding the HS256/384/512 secret (never given as a flag value)")
    jwt.add_argument("--identity-jwt-secret", dest="jwt_secret_value", help=SUPPRESS)  # refused by name
    jwt.add_argument("--identity-jwt-algorithm", "--identity-jwt-algorithms", dest="jwt_algorithm", action="append",
                     default=[], help="an accepted algorithm, e.g. RS256 (repeatable or comma-separated; required)")
    jwt.add_argument("--identity-jwt-issuer", dest="jwt_issuer", help="the exact iss (required)")
    jwt.add_argument("--identity-jwt-audience", dest="jwt_audience", action="append", default=[],
                     help="an accepted aud (repeatable; required)")
    jwt.add_argument("--identity-jwt-token-type", dest="jwt_token_type",
                     help="the required typ, e.g. at+jwt (required; 'any' accepts any typ, with a warning)")
    jwt.add_argument("--identity-jwt-header", dest="jwt_header", help="the header carrying the token "
                                                                      "(default authorization)")
    jwt.add_argument("--identity-jwt-agent-claim", dest="jwt_agent_claim", help="the claim naming the agent "
                                                                                "(default sub)")
    jwt.add_argument("--identity-jwt-user-claim", dest="jwt_user_claim", help="the claim naming the user")
    jwt.add_argument("--identity-jwt-claim", dest="jwt_claim", action="append", default=[],
                     help="a claim copied to the principal's claims (repeatable)")
    jwt.add_argument("--identity-jwt-leeway", dest="jwt_leeway", type=float, help="clock leeway in seconds (default 60)")


def identity_from(options: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...], list[str]]:
    """``(principal callable or None, identity provider or None, private headers, banner lines)``."""
    if options.get("from_client_info"):
        raise Error("--principal-from-client-info was removed: a client's self-declared name is not an "
                    "identity. Use --principal NAME, --principal-header H or --identity-jwt")
    if options.get("jwt_secret_value"):
        raise Error("--identity-jwt-secret is refused: a secret on the command line is readable by every user of "
                    "this machine (ps, shell history). Put it in a file readable only by you and pass "
                    "--identity-jwt-secret-file FILE")
    jwt_used = [flag for flag in _JWT_FLAGS if options.get(flag)]
    jwt_mode = bool(options.get("identity_jwt") or jwt_used)
    chosen = [flag for flag, given in (("--principal", options.get("principal")),
                                       ("--principal-header", options.get("principal_header")),
                                       ("--identity-jwt", jwt_mode)) if given]
    if len(chosen) != 1:
        raise Error(f"name who the gateway's calls act for with exactly one of --principal NAME, --principal-header "
                    f"H or --identity-jwt (got {', '.join(chosen) or 'none'})")
    if options.get("user_header") and not options.get("principal_header"):
        raise Error("--user-header goes with --principal-header (a JWT names its user with "
                    "--identity-jwt-user-claim)")
    try:
        if options.get("principal"):
            from ctrlrun.gateway import fixed_principal

            return (fixed_principal(options["principal"]), None, (),
                    [f"identity FixedPrincipal ({options['principal']})"])
        if options.get("principal_header"):
            from ctrlrun.identity import HeaderIdentityProvider

            provider = HeaderIdentityProvider(options["principal_header"], options.get("user_header"))
            names = [provider.agent_header] + ([provider.user_header] if provider.user_header else [])
            return None, provider, tuple(names), [
                f"identity HeaderIdentityProvider (agent from header {provider.agent_header!r}"
                + (f", user from header {provider.user_header!r}" if provider.user_header else "") + ")",
                f"warning: the header {provider.agent_header!r} is trusted as given: it is worth exactly what the "
                f"proxy that sets it is worth. Make sure that proxy strips it from what clients send, and that "
                f"nothing reaches this gateway but through it"]
        return _jwt(options)
    except CTRLRunError as exc:
        raise Error(str(exc)) from None


def _read(flag: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise Error(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def _jwt(options: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...], list[str]]:
    from ctrlrun.jwt_identity import JWTIdentityProvider

    algorithms = [name.strip() for value in options["jwt_algorithm"] for name in value.split(",") if name.strip()]
    missing = [flag for flag, value in (("--identity-jwt-algorithm", algorithms),
                                        ("--identity-jwt-issuer", options.get("jwt_issuer")),
                                        ("--identity-jwt-audience", options["jwt_audience"]),
                                        ("--identity-jwt-token-type", options.get("jwt_token_type"))) if not value]
    if missing:
        raise Error(f"--identity-jwt needs {', '.join(missing)} (there are no defaults: name what you accept)")
    source: dict[str, Any] = {}
    if options.get("jwt_jwks_url"):
        source["jwks_url"] = options["jwt_jwks_url"]
    if options.get("jwt_public_key_file"):
        source["public_key"] = _read("--identity-jwt-public-key-file", options["jwt_public_key_file"])
    if options.get("jwt_secret_file"):
        source["secret"] = _read("--identity-jwt-secret-file", options["jwt_secret_file"]).rstrip("\r\n").encode()
    if len(source) != 1:
        raise Error("--identity-jwt needs exactly one of --identity-jwt-jwks-url, --identity-jwt-public-key-file or "
                    "--identity-jwt-secret-file")
    token_type = None if options["jwt_token_type"].lower() == "any" else options["jwt_token_type"]
    extra: dict[str, Any] = {}
    for flag, key in (("jwt_header", "header"), ("jwt_agent_claim", "agent_claim"), ("jwt_user_claim", "user_claim"),
                      ("jwt_leeway", "leeway")):
        if options.get(flag) is not None:
            extra[key] = options[flag]
    provider = JWTIdentityProvider(**source, algorithms=algorithms, issuer=options["jwt_issuer"],
                                   audience=options["jwt_audience"], token_type=token_type,
                                   claim_names=tuple(options["jwt_claim"]), **extra)
    header = (options.get("jwt_header") or "authorization").lower()
    return None, provider, (header,), [
        f"identity JWTIdentityProvider (a bearer token in {header!r}; issuer {options['jwt_issuer']}, audience "
        f"{', '.join(options['jwt_audience'])}, algorithms {', '.join(algorithms)})"]
