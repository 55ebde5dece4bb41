"""Notifications to the site on requeue, stop and drain: a command and/or a webhook.

``notify(cfg, event, ...)`` is what a hook calls. It never blocks the hook and never
raises: it decides (is the event wanted, is the node within its rate limit), then
hands the message to a detached ``python -I -m wrapper.notify`` (its own session, no
inherited descriptors, the message on a pipe) and returns. That process runs the site
command (argv from the config, placeholders filled in whole arguments, no shell, the
message on its stdin) and POSTs the message as JSON to the webhook, each inside
``[notify] timeout``; the webhook's redirects are refused and no proxy is used, so the
message goes to the configured URL and nowhere else.

Rate limit: a root-owned JSON file under ``<state_dir>/notify.json`` keeps the node's
recent send times under a lock; past ``rate_limit`` per ``rate_window`` a notification is
dropped and counted, and the next one sent says how many were dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wrapper.config import Config, NotifyConfig

STAMP = "notify.json"
MAX_MESSAGE = 16384  # under a pipe's buffer: writing it never blocks the hook
FIELDS = ("event", "job_id", "attempt", "node", "class", "user", "reason")


def notify(cfg: Config, event: str, *, job_id: str = "", attempt: int | None = None,
           node: str = "", failure_class: str = "", user: str = "", reason: str = "",
           now: float | None = None) -> bool:
    """Send ``event`` (requeue | stop | drain) if wanted and within the rate limit; True
    when a delivery process was started."""
    settings = cfg.notify
    if not (settings.command or settings.webhook) or event not in settings.events:
        return False
    from wrapper import log

    try:
        dropped = _admit(Path(cfg.paths.state_dir) / STAMP, settings,
                         time.time() if now is None else now)
    except OSError as exc:
        log.get().warning("notify.rate_state_unusable", error=str(exc))
        dropped = 0
    if dropped is None:
        log.get().warning("notify.rate_limited", notify_event=event, job_id=job_id)
        return False
    fields = {"event": event, "job_id": job_id, "attempt": "" if attempt is None
              else str(attempt), "node": node, "class": failure_class, "user": user,
              "reason": reason}
    fields = {k: clean(v, REASON_MAX if k == "reason" else FIELD_MAX)
              for k, v in fields.items()}
    # the job's words, wherever they go (the message, the webhook's fields, {reason})
    fields["reason"] = defuse(fields["reason"])
    text = message(fields, dropped)
    payload = {"fields": fields, "message": text, "dropped": dropped,
               "command": list(settings.command), "webhook": settings.webhook,
               "timeout": settings.timeout}
    try:
        _spawn(json.dumps(payload).encode()[:MAX_MESSAGE * 4])
    except OSError as exc:
        log.get().warning("notify.unsent", error=str(exc))
        return False
    return True


FIELD_MAX = 128  # characters of a field other than the reason
REASON_MAX = 600  # characters of the reason (it quotes the job's output)
# Mention syntax of the chat services operators wire webhooks to (Slack's <!here> and
# <@U123>, Discord's and Teams' @everyone / @here): a zero-width space after "@" and
# angle brackets swapped for look-alikes keep them from pinging anyone or linking.
_MENTION = str.maketrans({"<": "\u2039", ">": "\u203a"})


def clean(value: str, limit: int) -> str:
    """One line of printable text, at most ``limit`` characters: control characters
    (newlines, ESC, CR, bidi overrides) become spaces, so that no part of a notification
    can forge a line of its own ("node gpu07 drained") or a terminal's colours."""
    import unicodedata

    text = "".join(c if c.isprintable() and unicodedata.category(c) != "Cf" else " "
                   for c in str(value)[:limit * 2])
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def defuse(text: str) -> str:
    """The job's words as inert text in a chat message: no mention, no markup link
    (``<url|text>``, ``[text](url)``)."""
    return text.translate(_MENTION).replace("@", "@\u200b").replace('"', "'") \
        .replace("](", "]\u200b(")


def message(fields: Mapping[str, str], dropped: int = 0) -> str:
    what = {"requeue": "requeued", "stop": "stopped (not requeued)",
            "drain": "drained"}.get(fields["event"], fields["event"])
    subject = f"node {fields['node']}" if fields["event"] == "drain" else \
        f"job {fields['job_id']} (attempt {fields['attempt']}, user {fields['user'] or '?'})"
    text = f"jobwrap: {subject} {what}"
    if fields.get("class"):
        text += f" after {fields['class']}"
    if fields.get("reason"):
        # the reason carries the job's own words (an output line, a path): quoted as data
        text += f": \"{fields['reason']}\""
    if fields["event"] != "drain" and fields.get("node"):
        text += f" [node {fields['node']}]"
    if dropped:
        text += f" ({dropped} earlier notifications dropped by the rate limit)"
    return text[:MAX_MESSAGE] + "\n"


def _admit(path: Path, settings: NotifyConfig, now: float) -> int | None:
    """None: over the limit (this one is dropped and counted); else the count dropped
    since the last one sent (reset)."""
    from wrapper.osl import files

    fd = files.open_regular(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 65536, 0)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        sent = [float(t) for t in data.get("sent", []) if isinstance(t, int | float)
                and now - float(t) < settings.rate_window]
        dropped = int(data.get("dropped", 0)) if isinstance(data.get("dropped"), int) else 0
        if len(sent) >= settings.rate_limit:
            result, dropped = None, dropped + 1
        else:
            result, dropped = dropped, 0
            sent.append(now)
        blob = json.dumps({"sent": sent[-settings.rate_limit:], "dropped": dropped}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, blob, 0)
        return result
    finally:
        os.close(fd)


def _spawn(payload: bytes) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-m", "wrapper.notify"], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/", close_fds=True,
        start_new_session=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    if proc.stdin is None:  # pragma: no cover - stdin=PIPE always gives one
        return
    try:
        proc.stdin.write(payload)
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    # Reaped by a daemon thread when it ends: a long-lived caller (a test, a service)
    # collects no zombies, and a hook that exits first leaves it to init.
    import threading

    threading.Thread(target=proc.wait, name="notify-reaper", daemon=True).start()


# -- the detached delivery process -----------------------------------------------------
def deliver(payload: dict[str, Any]) -> list[str]:
    """Run the command and POST the webhook; returns the problems (empty: all delivered)."""
    fields = {k: str(v) for k, v in (payload.get("fields") or {}).items() if k in FIELDS}
    text = str(payload.get("message") or "")
    timeout = float(payload.get("timeout") or 10.0)
    problems = []
    command = [str(a) for a in payload.get("command") or []]
    if command:
        argv = [_fill(arg, fields) for arg in command]
        try:
            done = subprocess.run(argv, input=text.encode(), timeout=timeout, cwd="/",
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  check=False)
            if done.returncode:
                problems.append(f"{argv[0]} exited {done.returncode}")
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{argv[0]}: {exc}")
    url = str(payload.get("webhook") or "")
    if url:
        problem = post(url, {**fields, "message": text, "dropped": payload.get("dropped", 0)},
                       timeout)
        if problem:
            problems.append(problem)
    return problems


def post(url: str, body: dict[str, Any], timeout: float) -> str | None:
    """POST ``body`` as JSON to ``url`` only (no redirect, no proxy); None when accepted."""
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        return f"[notify] webhook {url!r} is not an http or https URL"

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # the 3xx is then an error: nothing is sent elsewhere

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    headers = {"Content-Type": "application/json", "User-Agent": "jobwrap-notify"}
    data = json.dumps(body).encode()
    # http(s) only, checked above; no redirect, no proxy
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)  # noqa: S310
    try:
        with opener.open(request, timeout=timeout) as response:
            response.read(65536)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"webhook {url}: {exc}"
    return None


def _fill(arg: str, fields: Mapping[str, str]) -> str:
    """One pass: a value that holds ``{node}`` is never expanded again."""
    import re

    return re.sub(r"\{(" + "|".join(FIELDS) + r")\}", lambda m: fields.get(m.group(1), ""),
                  arg)


def main() -> int:
    try:
        payload = json.loads(sys.stdin.buffer.read(MAX_MESSAGE * 4))
    except ValueError:
        return 2
    if not isinstance(payload, dict):
        return 2
    problems = deliver(payload)
    if problems:
        import syslog

        for problem in problems:
            syslog.syslog(syslog.LOG_WARNING, f"jobwrap notify: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
