"""The console's half of the approved-policy flow (§D7): what a pending ``ctrlrun.policy.change``
request shows beside its Approve button (the candidate's diff against the policy in force, and the
replay of recent receipts under it), and the page where a signed-in person proposes a policy
(``request.user`` is the proposer) or runs the proposal once another person approved it.

The candidate's text is read from the store (``store.policy_document``: stored by hash when it was
proposed, signed), never from the request: a row written around ctrlrun shows as not ctrlrun's and
nothing is diffed or replayed from it. Hosted by ``PolicyDocumentAdmin``
(``policydocument/propose/``); the approval page gets ``proposal_context``.
"""
from __future__ import annotations

import difflib
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from .. import proposals, store
from ..canonical import Principal
from ..display import reveal
from ..errors import ActionDenied, ApprovalRequired, CTRLRunError
from ..identity import same_person
from ..policy.change import POLICY_CHANGE_ACTION
from .base import DECIDE, refusal_text
from .console import change_url, url

#: The agent a proposal made in the console is recorded under (the signed-in person is its user).
CONSOLE_AGENT = "ctrlrun-console"
#: The URL name of the propose page (hosted by ``PolicyDocumentAdmin``).
PROPOSE_URL = "ctrlrun_policydocument_propose"
#: How many recent receipts the approval page replays under the candidate.
REPLAYED = 100
#: The longest candidate text the propose form takes (a policy's own limit applies after).
MAX_TEXT = 1_000_000


class ProposeForm(forms.Form):
    text = forms.CharField(label=_("Candidate policy (YAML)"), max_length=MAX_TEXT, strip=False,
                           widget=forms.Textarea(attrs={"rows": 24, "cols": 100, "spellcheck": "false"}),
                           help_text=_("The whole policy file as it would be installed. It is not installed: it is "
                                       "proposed for a person's approval under the policy in force."))


def current_policy() -> Any:
    from .evidence import current_policy as read  # (evidence hosts the propose page: imported when used)

    return read()


def may_propose(request: HttpRequest) -> bool:
    """Proposing a policy needs a staff user who may answer approvals (another person approves it)."""
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(DECIDE))


def diff_html(old: str, new: str, old_name: str, new_name: str) -> SafeString:
    """A unified diff, every line escaped (hidden characters shown), added and removed lines marked."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm=""))
    if not lines:
        return format_html('<p id="ctrlrun-policy-diff"><em>{}</em></p>', _g("The candidate's text is the same as the policy in force."))
    kinds = {"+": "add", "-": "del", "@": "hunk"}
    rows = format_html_join("", '<span class="ctrlrun-diff-{}">{}</span>', (
        ("head" if line.startswith(("+++", "---")) else kinds.get(line[:1], "same"), reveal(line)) for line in lines))
    return format_html('<pre class="ctrlrun-diff" id="ctrlrun-policy-diff">{}</pre>', rows)


def proposal_context(site: Any, request: HttpRequest, approval: Any) -> dict[str, Any]:
    """What the approval page shows of a ``ctrlrun.policy.change`` request ({} for any other action)."""
    if approval is None or approval.action != POLICY_CHANGE_ACTION:
        return {}
    arguments = approval.arguments if isinstance(approval.arguments, dict) else {}
    target, source_hash = arguments.get("to"), arguments.get("from")
    shown: dict[str, Any] = {"to": target, "from": source_hash, "notes": [], "diff": None, "replay": None,
                             "replayed": REPLAYED}
    document = store.policy_document(target) if isinstance(target, str) else None
    current = current_policy()
    if document is None:
        shown["notes"].append(_g("The candidate's text is not stored here (or its row is not ctrlrun's): there is "
                                 "nothing to compare. Do not approve a change you cannot read."))
        return {"policy_change": shown}
    if current is None:
        shown["notes"].append(_g("This server cannot read the policy in force, so the candidate is not compared."))
        return {"policy_change": shown}
    if current.hash != source_hash:
        shown["notes"].append(_g("The policy in force (%(now)s) is not the one the proposal was made under "
                                 "(%(then)s): the diff is against the policy in force now.") % {
            "now": current.hash, "then": reveal(str(source_hash))})
    shown["diff"] = diff_html(current.text, document.text, f"in force: {current.source}",
                              f"candidate: {document.source}")
    from ..control import default_control

    try:
        report = proposals.replay(default_control(), document.text, last=REPLAYED, source=document.source)
        candidate = default_control().read_candidate(document.text, source=document.source)
    except CTRLRunError as exc:
        shown["notes"].append(_g("The candidate does not load here: %(error)s") % {"error": reveal(str(exc))})
        return {"policy_change": shown}
    if candidate.hash != target:
        shown["notes"].append(_g("Read by this server the candidate hashes to %(hash)s, not to the hash proposed: "
                                 "the approved hash would not be the one installed here.") % {"hash": candidate.hash})
    shown["replay"] = report
    granted = approval.status == "granted" and approval.signature_ok
    shown["can_commit"] = granted and same_person(approval.user, request.user.get_username())
    shown["commit_url"] = url(site, PROPOSE_URL)
    return {"policy_change": shown}


def propose_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """GET: the form. POST ``text``: propose it (the signed-in person proposes). POST ``approval``: run
    the proposal that request approved (its candidate read back from the store)."""
    if not may_propose(request):
        raise PermissionDenied(_g("proposing a policy needs a staff user with the ctrlrun.decide_approval "
                                  "permission"))
    form = ProposeForm(request.POST if request.method == "POST" and "text" in request.POST else None)
    if request.method == "POST":
        principal = Principal(agent=CONSOLE_AGENT, user=request.user.get_username())
        approval_id = request.POST.get("approval")
        try:
            if approval_id:
                return _commit(model_admin, request, approval_id, principal)
            if form.is_valid():
                text = form.cleaned_data["text"].replace("\r\n", "\n")
                source = f"console proposal by {request.user.get_username()}"
                return _outcome(model_admin, request, lambda: proposals.propose(
                    _control(), text, source=source, principal=principal))
        except CTRLRunError as exc:  # a candidate that does not load, observe mode, ...
            model_admin.message_user(request, reveal(refusal_text(exc), multiline=True), messages.ERROR)
    current = current_policy()
    commit = None
    asked = request.GET.get("approval")
    if request.method == "GET" and asked:
        approval = store.get_approval(asked)
        if approval is None or approval.action != POLICY_CHANGE_ACTION:
            model_admin.message_user(request, _g("No policy change request %(id)s.") % {"id": reveal(asked)},
                                     messages.ERROR)
        else:
            commit = {"approval_id": approval.approval_id, "to": approval.arguments.get("to")}
    return model_admin.console_page(request, "admin/ctrlrun/policychange/propose.html", {
        "title": _g("Run the approved proposal") if commit else _g("Propose a policy"), "form": form,
        "current": current, "commit": commit,
        "list_url": url(model_admin.site, "ctrlrun_policydocument_changelist"),
    })


def _control() -> Any:
    from ..control import default_control

    return default_control()


def _commit(model_admin: Any, request: HttpRequest, approval_id: str, principal: Principal) -> HttpResponse:
    approval = store.get_approval(approval_id)
    if approval is None or approval.action != POLICY_CHANGE_ACTION:
        raise CTRLRunError(f"no policy change request {reveal(approval_id)}")
    target = approval.arguments.get("to") if isinstance(approval.arguments, dict) else None
    document = store.policy_document(target) if isinstance(target, str) else None
    if document is None:
        raise CTRLRunError(f"the candidate of {approval_id} is not stored here (or its row is not ctrlrun's)")
    return _outcome(model_admin, request, lambda: proposals.propose(
        _control(), document.text, source=document.source, principal=principal, approval=approval_id))


def _outcome(model_admin: Any, request: HttpRequest, propose: Any) -> HttpResponse:
    try:
        result = propose()
    except ApprovalRequired as asked:
        model_admin.message_user(request, _g(
            "Proposed as request %(id)s: another person must approve it; once granted, its page offers to run "
            "the approved proposal.") % {"id": asked.request_id}, messages.SUCCESS)
        return HttpResponseRedirect(change_url(model_admin.site, "approval", asked.request_id))
    except ActionDenied as exc:
        model_admin.message_user(request, reveal(str(exc)), messages.ERROR)
        return HttpResponseRedirect(request.path)
    model_admin.message_user(request, _g("Committed: %(hash)s is approved. Install that file to put it in force.") % {
        "hash": result["approved"]}, messages.SUCCESS)
    return HttpResponseRedirect(change_url(model_admin.site, "policydocument", result["approved"]))
