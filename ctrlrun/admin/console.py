"""What the console's pages are made of: one time format, coloured states, links between the
records of one story, a policy rule as written, and event data as readable rows.

Every string that came from an agent, a policy or a remote is shown through ``ctrlrun.display``
(hidden characters as highlighted escapes). URLs are built for the admin site that serves the
page (``site`` is ``ModelAdmin.admin_site.name``), never a hard-coded ``admin:``.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping
from typing import Any

from django.contrib.admin.utils import quote
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _g

from ..canonical import evidence_time
from ..display import dumps_html, reveal, reveal_html
from ..errors import CTRLRunError
from ..times import when_text

# --------------------------------------------------------------------------- text and time


def shown(text: str | None, *, multiline: bool = False, empty: str = "-") -> SafeString:
    """``text`` as HTML, each hidden character a highlighted escape; ``empty`` when there is none."""
    if text is None or text == "":
        return format_html("{}", empty)
    html = reveal_html(str(text), multiline=multiline)
    return mark_safe(html.replace("\n", "<br>") if multiline else html)


def when(moment: dt.datetime | None) -> SafeString:
    """A time as the console shows it, the exact evidence time (milliseconds) on hover."""
    if moment is None:
        return format_html("{}", "-")
    exact = evidence_time(moment)
    return format_html('<time class="ctrlrun-time" datetime="{}" title="{}">{}</time>', exact, exact,
                       when_text(moment))


# --------------------------------------------------------------------------- coloured states

#: The tone of each state, status, result and decision: alert (a person must look), warn
#: (waiting, or needs care), ok (done as asked), muted (over, nothing to do), info (in progress).
TONES: dict[str, str] = {
    # effect records
    "ambiguous": "alert", "executing": "info", "reserved": "info", "committed": "ok", "failed": "muted",
    "lapsed": "warn",
    # receipts
    "denied": "alert", "blocked": "warn", "observed": "info",
    # approvals
    "pending": "warn", "granted": "ok", "consumed": "muted", "expired": "muted",
    # decisions
    "allow": "ok", "approve": "warn", "deny": "alert",
    # chain checks
    "intact": "ok", "broken": "alert",
}


def badge(value: str | None, label: str | None = None, *, title: str | None = None) -> SafeString:
    """A coloured badge for a state, status, result or decision."""
    if not value:
        return format_html("{}", "-")
    tone = TONES.get(str(value), "muted")
    if title:
        return format_html('<span class="ctrlrun-badge {}" title="{}">{}</span>', tone, title, label or value)
    return format_html('<span class="ctrlrun-badge {}">{}</span>', tone, label or value)


def tampered_badge(why: str) -> SafeString:
    """The red badge of a row ctrlrun did not write as it is, ``why`` on hover."""
    return format_html('<span class="ctrlrun-badge alert" title="{}">{}</span>', why, _g("changed outside ctrlrun"))


# --------------------------------------------------------------------------- links


def url(site: str, name: str, *args: Any) -> str | None:
    """An admin URL of this site, or None when this site does not serve it."""
    try:
        return reverse(f"{site}:{name}", args=[quote(a) for a in args], current_app=site)
    except NoReverseMatch:
        return None


def change_url(site: str, model: str, pk: Any) -> str | None:
    return url(site, f"ctrlrun_{model}_change", pk)


def changelist_url(site: str, model: str, **query: Any) -> str | None:
    from urllib.parse import urlencode

    base = url(site, f"ctrlrun_{model}_changelist")
    if base is None:
        return None
    return f"{base}?{urlencode(query)}" if query else base


def link(href: str | None, text: Any, *, short: int | None = None) -> SafeString:
    """``text`` (shown with hidden characters escaped) as a link to ``href``; plain when there is none.

    ``short`` cuts a long id to that many characters, the whole id on hover."""
    if text is None or text == "":
        return format_html("{}", "-")
    text = str(text)
    label = shown(text[:short] + "…") if short and len(text) > short + 1 else shown(text)
    title = reveal(text)  # an attribute shows hidden characters raw: escaped there too
    if href is None:
        return format_html('<span title="{}">{}</span>', title, label)
    return format_html('<a href="{}" title="{}">{}</a>', href, title, label)


def call_link(site: str, action_id: str | None, *, short: int | None = 16) -> SafeString:
    """An action id (one call) as a link to the call's page: its action, decision, effect and events."""
    return link(url(site, "ctrlrun_call", action_id) if action_id else None, action_id, short=short)


def effect_link(site: str, effect_key: str | None) -> SafeString:
    return link(change_url(site, "effectrecord", effect_key) if effect_key else None, effect_key)


def approval_link(site: str, approval_id: str | None, *, short: int | None = 16) -> SafeString:
    return link(change_url(site, "approval", approval_id) if approval_id else None, approval_id, short=short)


def receipt_link(site: str, receipt_id: str | None, *, short: int | None = 16) -> SafeString:
    return link(change_url(site, "receipt", receipt_id) if receipt_id else None, receipt_id, short=short)


def policy_link(site: str, policy_hash: str | None) -> SafeString:
    return link(change_url(site, "policydocument", policy_hash) if policy_hash else None, policy_hash, short=19)


# --------------------------------------------------------------------------- the rule that decided


@functools.lru_cache(maxsize=32)
def _parsed(policy_hash: str, text: str, source: str, environment: str) -> Any:
    from ..policy import parse_policy

    return parse_policy(text, source, environment=environment)


def rule_text(document: Any, action: str, reason: str | None) -> str | None:
    """What the stored policy ``document`` (a PolicyDocument row) says for ``action`` under
    ``reason`` (``rule[1]``, ``decision``, ...), as the policy author wrote it; None if unknown."""
    if reason == "unknown_action":
        return _g("the policy does not list this action, so it is denied")
    if reason == "no_matching_rule":
        return _g("no rule of this action matched, so it is denied")
    if document is None or not reason:
        return None
    try:
        policy = _parsed(document.hash, document.text, document.source, document.environment)
    except (CTRLRunError, ValueError, TypeError):
        return None  # an unreadable stored document: the policy page shows it as it is
    entry = policy.actions.get(action)
    if entry is None:
        return None
    if reason == "decision":
        return f"decision: {entry.decision}"
    if reason.startswith("rule[") and reason.endswith("]") and reason[5:-1].isdigit():
        index = int(reason[5:-1])
        if index < len(entry.rules):
            rule = entry.rules[index]
            if not rule.when:
                return f"always → {rule.decision}"
            conditions = ", ".join(f"{c.key}: {json.dumps(c.operand, ensure_ascii=False)}" for c in rule.when)
            return f"when {conditions} → {rule.decision}"
    return None


def stored_policy(document: Any) -> Any:
    """The stored policy ``document`` (a ``PolicyDocumentView``) parsed again (cached by hash), or None
    when there is none or it no longer parses."""
    if document is None:
        return None
    try:
        return _parsed(document.hash, document.text, document.source, document.environment)
    except (CTRLRunError, ValueError, TypeError):
        return None


def cited_by(document: Any, action: str, arguments: Any) -> tuple[str, ...] | None:
    """The control ids the stored policy ``document`` cites for ``action`` with ``arguments`` (what
    the call's receipt will carry), or None when the document cannot be read."""
    policy = stored_policy(document)
    if policy is None or not isinstance(arguments, Mapping):
        return None
    try:
        return tuple(policy.evaluate(action, arguments).controls)
    except (CTRLRunError, ValueError, TypeError):
        return None


def controls_html(ids: Any, document: Any) -> SafeString:
    """Cited control ids as a list: each id, its title and source from the registry of the stored
    policy ``document``; an id that registry does not hold says so. Everything escaped."""
    if not isinstance(ids, (list, tuple)) or not ids:
        return format_html('<span class="ctrlrun-controls-none">{}</span>', _g("none cited"))
    policy = stored_policy(document)
    registry = policy.controls if policy is not None else {}
    items = []
    for cid in ids:
        cid = str(cid)
        entry = registry.get(cid)
        if entry is None:
            why = (_g("not in the policy’s registry") if policy is not None
                   else _g("not in the policy’s registry (the policy document is not stored here, or unreadable)"))
            items.append(format_html(
                '<li data-control="{}"><code>{}</code> <span class="ctrlrun-missing">{}</span></li>',
                reveal(cid), shown(cid), why))
            continue
        source = format_html(' <span class="ctrlrun-control-source">({})</span>', shown(entry.source)) \
            if entry.source else ""
        items.append(format_html(
            '<li data-control="{}"><code>{}</code> <span class="ctrlrun-control-title">{}</span>{}</li>',
            reveal(cid), shown(cid), shown(entry.title), source))
    return format_html('<ul class="ctrlrun-controls">{}</ul>', mark_safe("".join(items)))


def reason_html(document: Any, action: str, reason: str | None) -> SafeString:
    """``rule[1]`` with the rule's text beside it."""
    text = rule_text(document, action, reason)
    if text is None:
        return shown(reason)
    return format_html('<code>{}</code> <span class="ctrlrun-rule">{}</span>', reason, shown(text))


# --------------------------------------------------------------------------- event data


def _value_html(value: Any) -> SafeString:
    if isinstance(value, str):
        return shown(value, empty='""')
    return mark_safe(dumps_html(value, sort_keys=True))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def origin_html(origin: Any) -> SafeString | None:
    """Where a call came from (ACTION_PROPOSED's ``origin``, ``ctrlrun.gateway.origin``) as rows: the
    MCP client as it names itself (else its User-Agent), the MCP session, the upstream. Every value
    is the client's own text, shown escaped. None when the call did not come through the gateway."""
    if not isinstance(origin, Mapping) or origin.get("surface") != "mcp-gateway":
        return None
    client = origin.get("client") if isinstance(origin.get("client"), Mapping) else {}
    name, version, agent = _text(client.get("name")), _text(client.get("version")), _text(origin.get("user_agent"))
    if name is not None:
        who = format_html('{} {} <span class="ctrlrun-note">({})</span>', shown(name), shown(version, empty=""),
                          _g("MCP clientInfo, as the client names itself"))
    elif agent is not None:
        who = format_html('{} <span class="ctrlrun-note">({})</span>', shown(agent),
                          _g("User-Agent: the gateway did not see the session's clientInfo"))
    else:
        who = format_html("{}", _g("not named (no clientInfo, no User-Agent)"))
    upstream = origin.get("upstream") if isinstance(origin.get("upstream"), Mapping) else {}
    rows = ((_g("client"), who),
            (_g("MCP session"), shown(_text(origin.get("session_id")), empty=_g("none (a request without a session)"))),
            (_g("upstream"), format_html("{} — {}", shown(_text(upstream.get("alias"))),
                                         shown(_text(upstream.get("url"))))))
    return format_html('<dl class="ctrlrun-kv" id="ctrlrun-origin">{}</dl>',
                       format_html_join("", "<div><dt>{}</dt><dd>{}</dd></div>", rows))


def data_rows(data: Mapping[str, Any] | Any) -> SafeString:
    """Event data as key/value rows; a nested value (the proposed action) as compact JSON."""
    if not isinstance(data, Mapping):
        return _value_html(data)
    items = sorted(data.items())
    if not items:
        return format_html("{}", "-")
    rows = format_html_join("", "<div><dt>{}</dt><dd>{}</dd></div>", ((shown(k), _value_html(v)) for k, v in items))
    return format_html('<dl class="ctrlrun-kv">{}</dl>', rows)

