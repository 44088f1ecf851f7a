"""``scan``: find consequential call sites nothing protects (spec §F5), by reading source, never importing it.

A finder, not a proof. It parses each ``.py`` file under a root with ``ast`` and reports, in
severity order (``KINDS``):

- ``unprotected_call``: a call outside any protected code whose target names a consequence:
  a word of the vocabulary (rule ``vocabulary:<verb>``: ``stripe.Refund.create``,
  ``k8s.delete_namespace``, ``send_mail``), or an HTTP write through an HTTP client (rule
  ``http-write:<method>``: ``requests.post``, ``self.session.put``, ``httpx.request("PATCH", ...)``);
- ``protected_action_not_in_policy`` (``not-in-policy``): a protected name the policy does not list;
- ``action_without_effect`` (``no-effect-template``): a policy action whose name holds a verb, that
  some rule allows or sends for approval, and that has no ``effect:`` - nothing keeps it at most once;
- ``unparseable`` (``syntax-error`` / ``unreadable``): a file that could not be read or parsed
  (undecodable bytes, too large, not a regular file, a symlink loop).

Protected code: the body of a function decorated with ``protect(...)`` (``ctrlrun.protect``,
``control.protect``; the adapters' ``guarded_tool``/``guard_tool`` too), of a function wrapped later
(``protect(...)(send)``), and the arguments after the name of ``control.call("name", args, fn)`` /
``acall``. Nested functions inherit it. Calls whose target cannot be named
(``getattr(client, name)()``, ``handlers[kind]()``) are *undetermined*, listed apart.

A trailing ``# ctrlrun: not-consequential — <reason>`` comment on the call's first or last line
suppresses it; the reason is required, and without one the call stays a finding.

Hostile trees are reported, never a traceback: directories are walked without following symlinks
(no loop can trap the walk), a file is opened only when it is a regular file, read up to
``MAX_FILE_BYTES``, decoded by its PEP 263 declaration, and a parser's ``RecursionError`` or
``MemoryError`` is a finding. Standard library only, and pure: the policy is given, already loaded.
"""
from __future__ import annotations

import ast
import fnmatch
import io
import os
import re
import stat
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["VOCABULARY", "KINDS", "Finding", "Suppressed", "Undetermined", "ScanResult", "scan",
           "read_vocabulary", "HTTP_WRITE_METHODS", "MAX_FILE_BYTES", "PROGRESS_EVERY", "SCHEMA"]

SCHEMA = "ctrlrun.scan/v1"
#: The built-in consequence verbs (the reference's 25).
VOCABULARY: tuple[str, ...] = (
    "approve", "cancel", "charge", "delete", "deploy", "destroy", "disable", "drop", "grant", "issue",
    "merge", "pay", "payout", "publish", "purchase", "push", "refund", "remove", "revoke", "rotate",
    "send", "submit", "terminate", "transfer", "truncate",
)
#: Finding kinds, most severe first.
KINDS: tuple[str, ...] = ("unprotected_call", "protected_action_not_in_policy", "action_without_effect", "unparseable")
#: HTTP methods that write, and the words that name an HTTP client in a call's target.
HTTP_WRITE_METHODS = ("post", "put", "patch", "delete")
_HTTP_CLIENTS = frozenset({"requests", "httpx", "aiohttp", "urllib3", "session", "client", "http", "api"})
#: Words of one token that hold a verb without a separator.
_COMPOUNDS = {"sendmail": "send"}
#: A file larger than this is reported unreadable, not parsed.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: How many files between two progress reports.
PROGRESS_EVERY = 500
#: Directories never walked (virtualenvs, caches, VCS metadata).
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".nox",
                          ".mypy_cache", ".pytest_cache", "site-packages"})
_PROTECTORS = frozenset({"protect", "guarded_tool", "guard_tool"})
_SUPPRESSION = re.compile(r"#\s*ctrlrun:\s*not-consequential\b(.*)$")
_REASON_LEAD = re.compile(r"^\s*(?:—|–|--|-|:)?\s*")
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_EXPRESSION_MAX = 120


@dataclass(frozen=True)
class Finding:
    kind: str
    file: str
    line: int | None
    rule: str
    target: str | None
    name: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": self.file, "line": self.line, "rule": self.rule, "target": self.target,
                "name": self.name, "detail": self.detail}


@dataclass(frozen=True)
class Suppressed:
    file: str
    line: int
    rule: str
    target: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "rule": self.rule, "target": self.target, "reason": self.reason}


@dataclass(frozen=True)
class Undetermined:
    file: str
    line: int
    expression: str

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "expression": self.expression}


@dataclass
class ScanResult:
    root: str
    findings: list[Finding] = field(default_factory=list)
    suppressed: list[Suppressed] = field(default_factory=list)
    undetermined: list[Undetermined] = field(default_factory=list)
    #: (file, line, name) of each protected name found in the source.
    protected: list[tuple[str, int, str]] = field(default_factory=list)
    files_read: int = 0
    files_excluded: int = 0

    def sort(self) -> None:
        rank = {kind: n for n, kind in enumerate(KINDS)}
        self.findings.sort(key=lambda f: (rank[f.kind], f.file, f.line or 0, f.target or ""))
        self.suppressed.sort(key=lambda s: (s.file, s.line))
        self.undetermined.sort(key=lambda u: (u.file, u.line))

    @property
    def exit_code(self) -> int:
        """0 when nothing was found; 1 for any finding, suppressed finding or undetermined call."""
        return 1 if (self.findings or self.suppressed or self.undetermined) else 0


# --------------------------------------------------------------------------- words and names


def words(name: str) -> list[str]:
    """The lower-case words of a dotted, snake_case or CamelCase name (``Refund.create`` -> refund, create)."""
    return [w.lower() for w in _WORDS.findall(name)]


def verb_of(name: str, vocabulary: frozenset[str]) -> str | None:
    """The consequence verb a name holds (its last such word: the method says more than the module)."""
    for word in reversed(words(name)):
        for candidate in (word, _COMPOUNDS.get(word), *_inflections(word)):
            if candidate in vocabulary:
                return candidate
    return None


def _inflections(word: str) -> Iterator[str]:
    for ending in ("ing", "es", "ed", "s", "d"):
        if word.endswith(ending) and len(word) > len(ending) + 2:
            yield word[: -len(ending)]


def read_vocabulary(text: str) -> tuple[str, ...]:
    """A vocabulary file: one verb a line, ``#`` comments and blank lines ignored. ValueError when a
    line is not one lower-case word, or when no verb is left."""
    verbs: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not re.fullmatch(r"[a-z][a-z0-9]*", line):
            raise ValueError(f"line {number}: {line!r} is not one lower-case word (one verb a line)")
        if line not in verbs:
            verbs.append(line)
    if not verbs:
        raise ValueError("it lists no verb (one a line)")
    return tuple(verbs)


def _dotted(node: ast.AST) -> str | None:
    """A call target as written (``stripe.Refund.create``, ``get_client().refunds.create``), or None.
    A loop, not recursion: a chain thousands of attributes long is still named."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(f".{node.attr}")
            node = node.value
        elif isinstance(node, ast.Call):
            parts.append("()")
            node = node.func
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            break
        else:
            if not parts or parts[-1] == "()":
                return None  # a lambda or a subscript called: nothing names it
            parts.append("…")
            break
    return "".join(reversed(parts))


def _short(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # a tree unparse cannot render (too deep): say where, not what
        text = "<expression>"
    text = " ".join(text.split())
    return text if len(text) <= _EXPRESSION_MAX else text[: _EXPRESSION_MAX - 1] + "…"


def _is_getattr_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr") or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__getattribute__")


def _protector(node: ast.AST) -> tuple[bool, str | None]:
    """Whether a decorator (or a wrapper call's callee) protects, and the action name it gives."""
    call = node if isinstance(node, ast.Call) else None
    target = _dotted(call.func if call is not None else node)
    if target is None or target.rsplit(".", 1)[-1] not in _PROTECTORS:
        return False, None
    if call is None:
        return True, None
    for argument in call.args[:1]:
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            return True, argument.value
    for keyword in call.keywords:
        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
            return True, keyword.value.value
    return True, None


def _control_call(node: ast.Call) -> str | None:
    """``control.call("name", arguments, fn)`` / ``acall``: the action name, else None."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr in ("call", "acall") and len(node.args) >= 3):
        return None
    first, second = node.args[0], node.args[1]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and isinstance(second, (ast.Dict, ast.Name)):
        return first.value
    return None


def _http_write(target: str, node: ast.Call) -> str | None:
    parts = target.split(".")
    method = parts[-1].lower()
    receiver = {w for part in parts[:-1] for w in words(part)}
    if not receiver & _HTTP_CLIENTS:
        return None
    if method in HTTP_WRITE_METHODS:
        return method
    if method == "request" and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str) and node.args[0].value.lower() in HTTP_WRITE_METHODS:
        return node.args[0].value.lower()
    return None


# --------------------------------------------------------------------------- one file


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on it (tokenize: a '#' inside a string is no comment)."""
    found: dict[int, str] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                found[token.start[0]] = token.string
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass  # what was read so far still counts
    return found


def suppression(comment: str | None) -> str | None:
    """The reason of a suppression comment ('' when it gives none); None when it is no suppression."""
    if comment is None:
        return None
    match = _SUPPRESSION.search(comment)
    if match is None:
        return None
    return _REASON_LEAD.sub("", match.group(1), count=1).strip()


class _FileScan:
    def __init__(self, relative: str, tree: ast.Module, source: str, vocabulary: frozenset[str],
                 result: ScanResult) -> None:
        self.file, self.tree, self.vocabulary, self.result = relative, tree, vocabulary, result
        self.comments = _comments(source)
        self.wrapped: set[str] = set()

    def run(self) -> None:
        self._find_wrapped()
        # Iterative, so a deeply nested tree cannot exhaust Python's recursion here.
        stack: list[tuple[ast.AST, bool, str | None]] = [(self.tree, False, None)]
        while stack:
            node, protected, where = stack.pop()
            children_protected = protected
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = node.name if where is None else f"{where}.{node.name}"
                for decorator in node.decorator_list:
                    guards, name = _protector(decorator)
                    if guards:
                        children_protected = True
                        if name is not None:
                            self.result.protected.append((self.file, node.lineno, name))
                if node.name in self.wrapped:
                    children_protected = True
                decorators = {id(d) for d in node.decorator_list}
                for child in ast.iter_child_nodes(node):
                    # Decorators are not calls of the function's body (@router.delete("/x") routes, it deletes nothing).
                    if id(child) not in decorators:
                        stack.append((child, children_protected, where))
                continue
            if isinstance(node, ast.ClassDef):
                where = node.name if where is None else f"{where}.{node.name}"
            if isinstance(node, ast.Call):
                name = _control_call(node)
                if name is not None:
                    self.result.protected.append((self.file, node.lineno, name))
                    stack.extend((child, protected, where) for child in (node.func, node.args[0]))
                    stack.extend((child, True, where) for child in (*node.args[1:], *node.keywords))
                    continue
                if not protected:
                    self._call(node, where)
            stack.extend((child, protected, where) for child in ast.iter_child_nodes(node))

    def _find_wrapped(self) -> None:
        """Functions protected after their definition: ``protect("x")(send)``."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and node.args:
                guards, name = _protector(node.func)
                if guards and isinstance(node.args[0], ast.Name):
                    self.wrapped.add(node.args[0].id)
                    if name is not None:
                        self.result.protected.append((self.file, node.lineno, name))

    def _call(self, node: ast.Call, where: str | None) -> None:
        func = node.func
        if _is_getattr_call(func) or isinstance(func, ast.Subscript):
            if not self._suppressed(node, "undetermined", _short(func)):
                self.result.undetermined.append(Undetermined(self.file, node.lineno, _short(node)))
            return
        target = _dotted(func)
        if target is None:
            return  # a lambda called in place, a conditional expression: nothing named, nothing to say
        if _protector(func)[0] or _protector(node)[0]:
            return
        verb = verb_of(target, self.vocabulary)
        method = _http_write(target, node) if verb is None or verb == "delete" else None
        if method is not None:
            rule, detail = f"http-write:{method}", f"an HTTP {method.upper()} outside any protected function"
        elif verb is not None:
            rule, detail = f"vocabulary:{verb}", f"the call names {verb!r} and runs outside any protected function"
        else:
            return
        if len(target) > _EXPRESSION_MAX:
            target = target[: _EXPRESSION_MAX - 1] + "…"
        reason = self._reason(node)
        if reason:
            self.result.suppressed.append(Suppressed(self.file, node.lineno, rule, target, reason))
            return
        if reason == "":
            detail += "; its not-consequential comment gives no reason, so it is not honoured"
        self.result.findings.append(Finding("unprotected_call", self.file, node.lineno, rule, target, where, detail))

    def _reason(self, node: ast.Call) -> str | None:
        reasons = [suppression(self.comments.get(line)) for line in {node.lineno, getattr(node, "end_lineno", None)}]
        given = [r for r in reasons if r]
        if given:
            return given[0]
        return "" if "" in reasons else None

    def _suppressed(self, node: ast.Call, rule: str, target: str) -> bool:
        if len(target) > _EXPRESSION_MAX:
            target = target[: _EXPRESSION_MAX - 1] + "…"
        reason = self._reason(node)
        if reason:
            self.result.suppressed.append(Suppressed(self.file, node.lineno, rule, target, reason))
            return True
        return False


# --------------------------------------------------------------------------- the tree


def _read(path: Path) -> bytes:
    """A regular file's bytes, at most MAX_FILE_BYTES; OSError/ValueError say why not."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # a FIFO opens without blocking and is refused below, never read
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{info.st_size} bytes, larger than the {MAX_FILE_BYTES} a file may have to be scanned")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"larger than the {MAX_FILE_BYTES} bytes a file may have to be scanned")
        return data
    finally:
        os.close(fd)


def _decode(data: bytes) -> str:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)  # SyntaxError for an unknown coding
    return data.decode(encoding)


def _excluded(relative: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(relative, p) or fnmatch.fnmatchcase(os.path.basename(relative), p)
               for p in patterns)


def _files(root: Path, exclude: Sequence[str], result: ScanResult) -> Iterator[tuple[Path, str]]:
    def unreadable_dir(error: OSError) -> None:
        where = os.path.relpath(error.filename, root) if error.filename else "."
        result.findings.append(Finding("unparseable", where, None, "unreadable", None, None,
                                       f"the folder could not be read: {error.strerror or error}"))

    for folder, dirs, names in os.walk(root, onerror=unreadable_dir, followlinks=False):
        relative_folder = os.path.relpath(folder, root)
        kept = []
        for name in sorted(dirs):
            relative = os.path.normpath(os.path.join(relative_folder, name))
            if name in SKIPPED_DIRS or _excluded(relative, exclude) or _excluded(relative + "/", exclude):
                continue
            kept.append(name)
        dirs[:] = kept
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            relative = os.path.normpath(os.path.join(relative_folder, name))
            if _excluded(relative, exclude):
                result.files_excluded += 1
                continue
            yield Path(folder) / name, relative


def scan(root: str | os.PathLike[str], *, vocabulary: Iterable[str] = VOCABULARY, exclude: Sequence[str] = (),
         policy: Any = None, policy_file: str | None = None,
         progress: Callable[[int], None] | None = None) -> ScanResult:
    """Scan the ``.py`` files under ``root`` (or ``root`` itself, one file). ``policy`` (a loaded
    ``ctrlrun.policy.Policy``) adds the policy's findings; ``policy_file`` is how they name it."""
    base = Path(root)
    result = ScanResult(root=str(root))
    verbs = frozenset(vocabulary)
    if base.is_file():
        files: Iterable[tuple[Path, str]] = [(base, base.name)]
        base = base.parent
    else:
        files = _files(base, exclude, result)
    for path, relative in files:
        relative = relative.replace(os.sep, "/")
        _scan_file(path, relative, verbs, result)
        if progress is not None and result.files_read % PROGRESS_EVERY == 0:
            progress(result.files_read)
    if policy is not None:
        _policy_findings(policy, policy_file, verbs, result)
    result.sort()
    return result


def _scan_file(path: Path, relative: str, verbs: frozenset[str], result: ScanResult) -> None:
    result.files_read += 1
    try:
        source = _decode(_read(path))
    except (OSError, ValueError, SyntaxError, LookupError) as exc:  # UnicodeDecodeError is a ValueError
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        result.findings.append(Finding("unparseable", relative, None, "unreadable", None, None,
                                       f"could not be read: {type(exc).__name__}: {detail}"))
        return
    try:
        tree = ast.parse(source, filename=relative)
    except SyntaxError as exc:
        result.findings.append(Finding("unparseable", relative, exc.lineno, "syntax-error", None, None,
                                       f"not valid Python: {exc.msg}"))
        return
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes; nesting too deep for the parser
        result.findings.append(Finding("unparseable", relative, None, "syntax-error", None, None,
                                       f"could not be parsed: {type(exc).__name__}: {exc}"))
        return
    try:
        _FileScan(relative, tree, source, verbs, result).run()
    except (RecursionError, MemoryError) as exc:  # ast.unparse of a pathological expression
        result.findings.append(Finding("unparseable", relative, None, "syntax-error", None, None,
                                       f"could not be analysed: {type(exc).__name__}"))


# --------------------------------------------------------------------------- the policy


def _can_act(entry: Any) -> bool:
    decisions = [entry.decision, *(rule.decision for rule in entry.rules)]
    return any(getattr(d, "value", d) in ("allow", "approve") for d in decisions if d is not None)


def _action_lines(text: str) -> dict[str, int]:
    """Each action's line in the policy file (1-based), from the YAML node tree."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except Exception:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    for key, value in node.value:
        if getattr(key, "value", None) == "actions" and isinstance(value, yaml.MappingNode):
            return {k.value: k.start_mark.line + 1 for k, _ in value.value if isinstance(k, yaml.ScalarNode)}
    return {}


def _policy_findings(policy: Any, policy_file: str | None, verbs: frozenset[str], result: ScanResult) -> None:
    named = policy_file or getattr(policy, "source", "policy")
    lines = _action_lines(getattr(policy, "text", "") or "")
    actions = policy.actions
    for file, line, name in result.protected:
        if name not in actions:
            result.findings.append(Finding("protected_action_not_in_policy", file, line, "not-in-policy", name, name,
                                           f"{name!r} is protected here but the policy has no such action, so every "
                                           "call of it is refused"))
    for name, entry in actions.items():
        verb = verb_of(name, verbs)
        if verb is None or entry.effect is not None or not _can_act(entry):
            continue
        result.findings.append(Finding("action_without_effect", named, lines.get(name), "no-effect-template", None, name,
                                       f"{name!r} names {verb!r} and can be allowed, but has no effect: template, so "
                                       "nothing keeps it at most once"))


def root_grant_holders(policy: Any) -> list[dict[str, Any]]:
    """The subjects of the authority section's own grants (the roots every delegation hangs from)."""
    authority = getattr(policy, "authority", None)
    if authority is None:
        return []
    return [{"grant_id": grant.id, "agent": grant.agent, "user": grant.user, "actions": list(grant.actions)}
            for grant in authority.grants.values()]
