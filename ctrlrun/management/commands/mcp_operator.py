"""``manage.py mcp_operator`` / ``ctrlrun mcp-operator``: serve the operator's MCP server (§E4) with uvicorn."""
from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from ...errors import CTRLRunError
from ..base import CtrlrunCommand, Error, positive_int
from .mcp_gateway import _listen, _loopback


class Command(CtrlrunCommand):
    help = ("Serve ctrlrun's operator console over MCP (Streamable HTTP): list and answer pending approvals and "
            "resolve AMBIGUOUS effects from an MCP client, as the verified person of each request's credential.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--listen", default="127.0.0.1:8901", help="HOST:PORT on loopback (default 127.0.0.1:8901)")
        parser.add_argument("--path", default="/mcp", help="the MCP endpoint's path (default /mcp)")
        parser.add_argument("--principal-header", help="the trusted header naming the agent (with --user-header)")
        parser.add_argument("--user-header", help="the trusted header naming the person (with --principal-header)")
        parser.add_argument("--identity-jwt", action="store_true",
                            help="verify a bearer JWT (the --identity-jwt-* flags)")
        parser.add_argument("--identity-jwt-secret-file", type=Path, help="a file holding the HMAC secret")
        parser.add_argument("--identity-jwt-public-key-file", type=Path, help="a PEM public key file")
        parser.add_argument("--identity-jwt-jwks-url", help="the issuer's JWKS URL")
        parser.add_argument("--identity-jwt-issuer", help="the required iss")
        parser.add_argument("--identity-jwt-audience", action="append", default=[], help="an accepted aud (repeatable)")
        parser.add_argument("--identity-jwt-algorithm", action="append", default=[],
                            help="an accepted alg (repeatable)")
        parser.add_argument("--identity-jwt-user-claim", help="the claim naming the person (required with a JWT)")
        parser.add_argument("--identity-jwt-agent-claim", default="sub",
                            help="the claim naming the agent (default sub)")
        parser.add_argument("--identity-jwt-token-type", default=None, help="the required typ header, if any")
        parser.add_argument("--approver-roles-claim", default=None,
                            help="the claim listing the person's roles, matched byte for byte against approver_role")
        parser.add_argument("--environment", help="the environment (default: the policy's)")
        parser.add_argument("--max-body-bytes", type=positive_int, default=1024 * 1024,
                            help="the largest request body accepted (default 1 MiB)")
        parser.add_argument("--allow-origin", action="append", default=[],
                            help="a browser Origin allowed besides loopback (repeatable)")

    def identity(self, options: dict[str, Any]) -> tuple[Any, str]:
        from ...identity import HeaderIdentityProvider

        headers = options["principal_header"], options["user_header"]
        jwt_given = options["identity_jwt"] or any(options[k] for k in (
            "identity_jwt_secret_file", "identity_jwt_public_key_file", "identity_jwt_jwks_url", "identity_jwt_issuer"))
        if any(headers) and jwt_given:
            raise Error("choose one identity: --principal-header/--user-header or --identity-jwt-*")
        if any(headers):
            if not all(headers):
                raise Error("--principal-header and --user-header are required together (writes are answered by a "
                            "person)")
            return HeaderIdentityProvider(*headers), f"headers {headers[0]} / {headers[1]} (trusted as given)"
        if not jwt_given:
            raise Error("name the operator's identity: --principal-header H --user-header U, or --identity-jwt with "
                        "its --identity-jwt-* flags")
        from ...jwt_identity import JWTIdentityProvider

        if not options["identity_jwt_user_claim"]:
            raise Error("--identity-jwt-user-claim is required: writes are answered by the person it names")
        if not options["identity_jwt_issuer"] or not options["identity_jwt_audience"] or not options[
                "identity_jwt_algorithm"]:
            raise Error("--identity-jwt needs --identity-jwt-issuer, --identity-jwt-audience and "
                        "--identity-jwt-algorithm")
        source: dict[str, Any] = {}
        try:
            if options["identity_jwt_secret_file"]:
                source["secret"] = options["identity_jwt_secret_file"].read_bytes().strip()
            if options["identity_jwt_public_key_file"]:
                source["public_key"] = options["identity_jwt_public_key_file"].read_bytes()
        except OSError as exc:
            raise Error(f"the JWT key file could not be read: {exc}") from None
        if options["identity_jwt_jwks_url"]:
            source["jwks_url"] = options["identity_jwt_jwks_url"]
        claims = [options["approver_roles_claim"]] if options["approver_roles_claim"] else []
        provider = JWTIdentityProvider(**source, algorithms=options["identity_jwt_algorithm"],
                                       issuer=options["identity_jwt_issuer"], audience=options["identity_jwt_audience"],
                                       token_type=options["identity_jwt_token_type"],
                                       agent_claim=options["identity_jwt_agent_claim"],
                                       user_claim=options["identity_jwt_user_claim"], claim_names=claims)
        return provider, (f"JWT (issuer {options['identity_jwt_issuer']}, "
                          f"user claim {options['identity_jwt_user_claim']})")

    def run(self, **options: Any) -> None:
        host, port = _listen(options["listen"])
        if not _loopback(host):
            raise Error(f"--listen {options['listen']} is not a loopback address: the operator serves loopback only "
                        f"(put a proxy you control in front of it)")
        from ...control import Control, default_control
        from ... import mcp_operator
        from ...standalone import describe_store

        try:
            identity, described = self.identity(options)
            control = Control(environment=options["environment"]) if options["environment"] else default_control()
            policy = control.read_policy()
            operator = mcp_operator.Operator(identity, roles_claim=options["approver_roles_claim"],
                                             environment=policy.environment)
            from ...mcp_operator_server import build

            server = build(operator)
            from mcp.server.transport_security import TransportSecuritySettings

            allowed = [f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1:*", "localhost:*"]
            security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=allowed,
                                                 allowed_origins=["http://127.0.0.1:*", "http://localhost:*",
                                                                  *options["allow_origin"]])
            app = server.streamable_http_app(streamable_http_path=options["path"], json_response=True,
                                             max_request_body_size=options["max_body_bytes"],
                                             transport_security=security, host=host)
        except CTRLRunError as exc:
            raise Error(str(exc)) from None
        self.stdout.write("\n".join([
            f"ctrlrun mcp-operator on http://{host}:{port}{options['path']}",
            f"environment {policy.environment}",
            f"store {describe_store()}",
            f"identity {described}",
            "reads (list_pending_approvals, inspect_action, receipts, effects, stats) answer without a credential",
            "writes (approve, deny, resolve) need a verified human: a principal with a user"]))
        self.stdout.flush()
        import uvicorn

        uvicorn.run(app, host=host, port=port, log_level="warning")
