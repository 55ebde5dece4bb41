"""The goodput block of ``jobwrap status``: text for a terminal."""

from __future__ import annotations

from wrapper.goodput.accounting import Ledger


def render(ledger: Ledger, advice: str | None = None) -> str:
    if not ledger.attempts:
        return ""
    lines = [f"goodput  ETTR {ledger.ettr:.1%} of {_span(ledger.wall_s)}: productive "
             f"{_span(ledger.productive_s)}, lost {_span(ledger.lost_s)}, restart gaps "
             f"{_span(ledger.gap_s)}, startup {_span(ledger.startup_s)}"]
    for a in ledger.attempts:
        said = [f"productive {_span(a.productive_s)}"]
        if a.lost_s:
            said.append(f"lost {_span(a.lost_s)} ({a.kind})")
        if a.number and a.gap_before_s:
            said.append(f"restart gap {_span(a.gap_before_s)}")
        lines.append(f"  attempt {a.number}  " + ", ".join(said))
    if ledger.checkpoint_interval_s is not None:
        lines.append(f"  checkpoint every {_span(ledger.checkpoint_interval_s)} (median)")
    if advice:
        lines.append(f"  advice   {advice}")
    return "\n".join(lines) + "\n"


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
