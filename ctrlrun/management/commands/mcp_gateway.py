"""``manage.py mcp_gateway`` / ``ctrlrun gateway``: serve the MCP gateway (§E1) with uvicorn."""
from __future__ import annotations

import ipaddress
from argparse import ArgumentParser
from typing import Any

from ...errors import CTRLRunError
from ..base import CtrlrunCommand, Error, positive_int
from ._gateway_approvals import add_approval_arguments, approvals_line, authority_from, authority_line, webhook_from
from ._gateway_identity import add_identity_arguments, identity_from
from ._gateway_otel import add_otel_arguments, otel_from, otel_stop


#: ``ctrlrun.gateway.elicitation``'s defaults (not imported here: that package needs the mcp extra,
#: and ``--help`` must not).
ELICITATION_TIMEOUT_SECONDS, MAX_ELICITATION_ROUNDS = 300, 8


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise Error(f"--listen {value!r} must be HOST:PORT (e.g. 127.0.0.1:8900)")
    return host.strip("[]"), int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Command(CtrlrunCommand):
    help = ("Serve an MCP gateway: a Streamable-HTTP proxy in front of --upstream in which every tools/call is "
            "a protected call named mcp.<alias>.<tool> (decided by the policy, keyed, approved, recorded).")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--upstream", required=True, help="the upstream MCP server's URL (Streamable HTTP)")
        parser.add_argument("--alias", required=True, help="names the actions mcp.<alias>.<tool>; ^[a-z0-9][a-z0-9_-]*$")
        parser.add_argument("--listen", default="127.0.0.1:8900", help="HOST:PORT to serve (default 127.0.0.1:8900)")
        parser.add_argument("--allow-remote", action="store_true", help="allow a --listen address that is not loopback")
        parser.add_argument("--path", default="/mcp", help="the MCP endpoint's path (default /mcp; not under /ctrlrun/)")
        add_identity_arguments(parser)
        parser.add_argument("--environment", help="the environment stamped on the actions")
        parser.add_argument("--upstream-timeout", type=float, default=30.0,
                            help="seconds to wait for the upstream's answer (default 30)")
        parser.add_argument("--max-body-bytes", type=positive_int, default=1024 * 1024,
                            help="the largest request body accepted (default 1 MiB)")
        parser.add_argument("--max-response-bytes", type=positive_int, default=16 * 1024 * 1024,
                            help="the largest upstream answer read (default 16 MiB)")
        parser.add_argument("--allow-origin", action="append", default=[],
                            help="a browser Origin allowed besides loopback (repeatable)")
        parser.add_argument("--elicitation-timeout", type=positive_int, default=ELICITATION_TIMEOUT_SECONDS,
                            help="seconds a call that asked its client for input keeps its key for the answer "
                                 "(default 300; the Control's suspend_timeout; never shorter than the call's lease)")
        parser.add_argument("--max-elicitation-rounds", type=positive_int, default=MAX_ELICITATION_ROUNDS,
                            help="how many times one call may ask for input; one more is recorded ambiguous "
                                 "(default 8)")
        add_otel_arguments(parser)
        add_approval_arguments(parser)
        parser.add_argument("--hide-denied-tools", action="store_true",
                            help="leave out of tools/list the tools the policy denies outright (unlisted, a bare "
                                 "decision: deny, or rules that all deny); calling one is still refused")

    def run(self, **options: Any) -> None:
        principal, provider, private, identity_lines = identity_from(options)
        tracer_provider, otel_lines = otel_from(options)
        host, port = _listen(options["listen"])
        if not _loopback(host) and not options["allow_remote"]:
            raise Error(f"--listen {options['listen']} is not a loopback address: anyone who reaches it can call "
                        f"the upstream's tools. Add --allow-remote if that is meant")
        authority = authority_from(options)
        webhook, secret, window = webhook_from(options)
        from ...control import Control, default_control

        try:
            timeout = options["elicitation_timeout"]
            if provider is not None or options["environment"] or authority is not None or webhook is not None \
                    or timeout != ELICITATION_TIMEOUT_SECONDS:
                control = Control(environment=options["environment"], identity=provider, authority=authority,
                                  approvals=webhook, suspend_timeout=timeout)
            else:
                control = default_control()
            policy = control.read_policy()
            from ctrlrun.gateway import GatewayApp

            app = GatewayApp(upstream=options["upstream"], alias=options["alias"], principal=principal,
                             control=control, private_headers=private, path=options["path"], upstream_timeout=options["upstream_timeout"],
                             max_body_bytes=options["max_body_bytes"], max_response_bytes=options["max_response_bytes"],
                             allow_origins=tuple(options["allow_origin"]), otel=options["otel"],
                             otel_arguments=options["otel_arguments"], tracer_provider=tracer_provider,
                             webhook_secret=secret, webhook_replay_window=window,
                             max_elicitation_rounds=options["max_elicitation_rounds"],
                             hide_denied_tools=options["hide_denied_tools"])
        except CTRLRunError as exc:
            raise Error(str(exc)) from None
        identity_lines = [*identity_lines, approvals_line(webhook)]
        self.stdout.write(self.banner(control, policy, options, host, port, identity_lines + otel_lines))
        self.stdout.flush()
        import uvicorn

        try:
            uvicorn.run(app, host=host, port=port, log_level="warning", lifespan="off")
        finally:
            otel_stop(tracer_provider)  # the spans still batched are exported

    def banner(self, control: Any, policy: Any, options: dict[str, Any], host: str, port: int,
               identity_lines: list[str]) -> str:
        prefix = f"mcp.{options['alias']}."
        actions = sorted(name for name in policy.actions if name.startswith(prefix))
        unkeyed = [name for name in actions if policy.entry(name).effect is None]
        lines = [f"ctrlrun gateway on http://{host}:{port}{options['path']} -> {options['upstream']}",
                 f"environment {policy.environment}", *identity_lines]
        lines.append(authority_line(policy))
        lines.append(f"elicitation: a call that asks its client for input keeps its key "
                     f"{int(control.suspend_timeout.total_seconds())} s for the answer, at most "
                     f"{options['max_elicitation_rounds']} rounds")
        lines.append(f"actions: {', '.join(actions) if actions else f'none named {prefix}* (every tool is denied)'}")
        if unkeyed:
            lines.append(f"no effect: template (not deduplicated): {', '.join(unkeyed)}")
        if options.get("hide_denied_tools"):
            lines.append("hide-denied-tools: on (tools/list leaves out the tools the policy in force denies outright; "
                         "calling one is still refused)" + (" - the policy is in observe mode, so none is"
                                                            if policy.observing else ""))
        return "\n".join(lines)
