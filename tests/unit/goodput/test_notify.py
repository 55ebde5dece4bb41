"""Notifications: a site command and a webhook (a loopback HTTP server), detached,
rate-limited, sent to the configured URL only."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wrapper import config as config_mod
from wrapper import notify


class _Server:
    def __init__(self, status: int = 200, location: str = "") -> None:
        self.bodies: list[dict[str, object]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def _cfg(tmp_path: Path, **notify_keys: object) -> config_mod.Config:
    lines = [f"{k} = {json.dumps(v)}" for k, v in notify_keys.items()]
    text = f'[paths]\nstate_dir = "{tmp_path / "state"}"\n[notify]\n' + "\n".join(lines)
    (tmp_path / "state").mkdir(exist_ok=True)
    return config_mod.parse(text.encode(), str(tmp_path / "config.toml"))


def _wait_for(check: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("not delivered in time")


def test_command_and_webhook_get_the_message(tmp_path: Path, server: _Server) -> None:
    out = tmp_path / "said"
    cfg = _cfg(tmp_path, webhook=server.url,
               command=["/bin/sh", "-c", f'cat > {out}.tmp; echo "$0|$1" >> {out}.tmp; '
                        f"mv {out}.tmp {out}", "{event}", "{job_id}:{node}"])
    assert notify.notify(cfg, "requeue", job_id="42", attempt=1, node="n1",
                         failure_class="hang", user="alice", reason="no progress {node}")
    _wait_for(out.exists)
    text = out.read_text()
    assert text.startswith("jobwrap: job 42 (attempt 1, user alice) requeued after hang")
    assert text.endswith("requeue|42:n1\n")
    assert "no progress {node}" in text  # a value is never expanded again
    _wait_for(lambda: server.bodies)
    body = server.bodies[0]
    assert body["event"] == "requeue" and body["job_id"] == "42" and body["class"] == "hang"
    assert "requeued" in str(body["message"])


def test_unwanted_events_and_no_target_send_nothing(tmp_path: Path, server: _Server) -> None:
    assert not notify.notify(_cfg(tmp_path), "stop", job_id="1")
    assert not notify.notify(_cfg(tmp_path, webhook=server.url, events=["drain"]), "stop",
                             job_id="1")
    time.sleep(0.5)
    assert server.bodies == []


def test_the_rate_limit_drops_and_counts(tmp_path: Path, server: _Server) -> None:
    cfg = _cfg(tmp_path, webhook=server.url, rate_limit=2, rate_window=1000.0)
    sent = [notify.notify(cfg, "drain", node="n1", reason=f"r{i}", now=100.0 + i)
            for i in range(5)]
    assert sent == [True, True, False, False, False]
    assert notify.notify(cfg, "drain", node="n1", reason="later", now=2000.0)
    _wait_for(lambda: len(server.bodies) == 3)
    last = next(b for b in server.bodies if "later" in str(b["message"]))
    assert last["dropped"] == 3 and "3 earlier notifications dropped" in str(last["message"])


def test_a_slow_command_never_holds_the_caller(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    cfg = _cfg(tmp_path, command=["/bin/sh", "-c", f"sleep 3; touch {marker}"], timeout=30.0)
    assert notify.notify(cfg, "stop", job_id="5")
    assert not marker.exists()  # notify returned while the command still ran
    _wait_for(marker.exists)


def test_the_webhook_posts_to_the_configured_url_only(server: _Server) -> None:
    redirecting = _Server(status=307, location=server.url)
    try:
        problem = notify.post(redirecting.url, {"event": "stop"}, timeout=5)
        assert problem is not None and "307" in problem
        assert len(redirecting.bodies) == 1 and server.bodies == []
    finally:
        redirecting.close()
    assert notify.post("file:///etc/passwd", {}, 1) is not None
    assert notify.post(server.url, {"event": "drain"}, 5) is None


def test_bad_notify_config_is_one_clear_message(tmp_path: Path) -> None:
    with pytest.raises(config_mod.ConfigError, match=r"\[notify\] events"):
        _cfg(tmp_path, events=["requeue", "explode"])


def test_fields_are_one_bounded_printable_line_and_the_reason_is_defused() -> None:
    from wrapper.notify import REASON_MAX, clean, defuse, message

    assert clean("a\nb\r\x1b[2Jc\u202ed", 100) == "a b [2Jc d"
    assert len(clean("x" * 10_000, REASON_MAX)) == REASON_MAX
    text = message({"event": "stop", "job_id": "7", "attempt": "0", "node": "n1", "user": "u",
                    "class": "user_error",
                    "reason": defuse(clean("x\njobwrap: node gpu07 drained <@here> @everyone "
                                           "[x](http://e.example)", 600))})
    assert text.count("\n") == 1 and "<@here>" not in text and "@everyone" not in text
    assert defuse("<!channel>") == "\u2039!channel\u203a" and "](" not in text
