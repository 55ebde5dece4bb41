"""The goodput block of ``jobwrap status``: text for a terminal."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wrapper.archive.ledger import Ledger


def render(ledger: Ledger, advice: str | None = None) -> str:
    if not ledger.attempts:
        return ""
    lines = [f"goodput  ETTR {ledger.ettr:.1%} of {span(ledger.wall_s)}: productive "
             f"{span(ledger.productive_s)}, lost {span(ledger.lost_s)}, restart gaps "
             f"{span(ledger.gap_s)}, startup {span(ledger.startup_s)}"]
    for a in ledger.attempts:
        said = [f"productive {span(a.productive_s)}"]
        if a.lost_s:
            said.append(f"lost {span(a.lost_s)} ({a.kind})")
        if (a.number or a.restart) and a.gap_before_s:
            said.append(f"restart gap {span(a.gap_before_s)}")
        which = f"{a.number}.{a.restart} (in place)" if a.restart else f"{a.number}"
        lines.append(f"  attempt {which}  " + ", ".join(said))
    if ledger.checkpoint_interval_s is not None:
        lines.append(f"  checkpoint every {span(ledger.checkpoint_interval_s)} (median)")
    if advice:
        lines.append(f"  advice   {advice}")
    return "\n".join(lines) + "\n"


def span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
