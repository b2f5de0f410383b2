"""Pictures of a ``Trace``: a Mermaid sequence diagram, a Markdown table, and ``show()``.

The diagram has one participant per process (the manager included) in the order they first
appear; an arrow for each handoff between processes (the pickle bytes on the queue pipe,
the fd over ``SCM_RIGHTS``, a message to the manager's socket), matched sender to receiver
by order and by the segment's name; a note for each local step (create, unlink, mmap, the
refcount, close). Steps repeated in a row by one process are drawn once, with ``xN``.

Mirrors: nothing in torch.
"""

from __future__ import annotations

import re

from .model import Event, Trace

MAX_ROWS = 60


def _safe(text: str) -> str:
    """Mermaid's sequence text: no ';' or '#' (statement and entity marks), one line."""
    return re.sub(r"[;#\n\r<>{}]", " ", text).strip()[:90]


def _ms(trace: Trace, e: Event) -> str:
    first = trace.events[0].t if trace.events else e.t
    return f"{(e.t - first) * 1000:.1f} ms"


def _short(segment: str | None) -> str:
    return segment.lstrip("/") if segment else ""


def arrows(trace: Trace) -> dict[int, tuple[int, int, str]]:
    """index of a sender's event -> (the receiver's event index, its pid, the arrow's text).

    A pickle is matched to the unpickle of as many bytes in another process; an fd sent to
    the one received in another process with the same segment. A receiver's blocking call
    starts before the send it waits for, so the match looks both ways in time."""
    out, used = {}, set()
    events = trace.events
    have_syscalls = any(e.layer == "syscall" for e in events)

    def match(i, want, same):
        e = events[i]
        order = sorted(range(len(events)), key=lambda j: abs(events[j].t - e.t))
        return next((j for j in order if j not in used and events[j].name == want
                     and events[j].pid != e.pid and same(events[j], e)), None)

    for i, e in enumerate(events):
        if e.layer == "python" and e.name == "ForkingPickler.dumps":
            j = match(i, "ForkingPickler.loads", lambda o, e: o.detail == e.detail and o.t > e.t)
            text = f"pickle bytes via the queue pipe {e.detail}"
        elif e.layer == "python" and e.name == "sendfds" and not have_syscalls:
            j = match(i, "recvfds", lambda o, e: o.segment == e.segment)
            text = f"the fd over SCM_RIGHTS {_short(e.segment)}"
        elif e.layer == "syscall" and e.name == "sendmsg" and "SCM_RIGHTS" in e.detail:
            j = match(i, "recvmsg", lambda o, e: o.segment == e.segment
                      and "SCM_RIGHTS" in o.detail)
            text = f"the fd over SCM_RIGHTS {_short(e.segment)}"
        else:
            continue
        if j is not None:
            used.add(j)
            out[i] = (j, events[j].pid, text)
    return out


def _manager_pid(trace: Trace, e: Event) -> int | None:
    m = re.search(r"manager pid (\d+)", e.detail)
    if m:
        return int(m.group(1))
    managers = [p.pid for p in trace.processes.values() if p.label == "manager"]
    return managers[0] if managers else None


def mermaid(trace: Trace) -> str:
    """The trace as a Mermaid ``sequenceDiagram``."""
    order = list(dict.fromkeys([*trace.processes, *(e.pid for e in trace.events)]))
    names = {pid: f"P{pid}" for pid in order}
    body: list[str] = []
    pairs = arrows(trace)
    received = {j for j, _, _ in pairs.values()}
    have_syscalls = any(x.layer == "syscall" for x in trace.events)
    have_pickles = any(x.name == "ForkingPickler.dumps" for x in trace.events)
    notes: list = []  # the local steps of one process in a row: drawn as one note

    def arrow(sender: int, target: str, text: str) -> None:
        _flush(body, notes, names)
        body.append(f"    {names[sender]}->>{target}: {_safe(text)}")

    # Events go in by their start, except a pickle's arrow: its bytes leave when dumps()
    # returns, after the reduce_* calls it made (drawn first, in the note before the arrow).
    def when(i: int) -> float:
        e = trace.events[i]
        return e.end if i in pairs and e.name == "ForkingPickler.dumps" else e.t

    for i in sorted(range(len(trace.events)), key=when):
        e = trace.events[i]
        if i in pairs:
            _, pid, text = pairs[i]
            arrow(e.pid, names[pid], text)
        elif i in received or (have_pickles and "pickle on the queue pipe" in e.detail):
            continue  # an arrow draws it
        elif ("to the manager" in e.detail and e.layer == "syscall") or (
                e.name.startswith("ManagerClient.") and not have_syscalls):
            target = _manager_pid(trace, e)
            if target is None:
                names.setdefault("MGR", "MGR")
                target_name = "MGR"
            else:
                target_name = names.setdefault(target, f"P{target}")
                order += [target] if target not in order else []
            text = e.detail.split("to the manager: ", 1)[-1] if e.layer == "syscall" \
                else f"{e.name.split('.')[-1].upper()} {_short(e.segment)}"
            arrow(e.pid, target_name, text)
        else:
            if notes and notes[0] != e.pid:
                _flush(body, notes, names)
            notes[:1] = [e.pid]
            notes.append((e.name, e.segment))
    _flush(body, notes, names)
    lines = ["sequenceDiagram"]
    for pid in order:
        info = trace.processes.get(pid)
        label = info.label if info else "process"
        lines.append(f"    participant {names[pid]} as {_safe(label)} {pid}")
    if "MGR" in names:
        lines.append("    participant MGR as manager (not traced)")
    return "\n".join(lines + body) + "\n"


def _flush(body: list[str], notes: list, names: dict) -> None:
    """One note for a process's steps in a row: repeats as ``xN``, the segment said once."""
    if len(notes) < 2:
        notes.clear()
        return
    pid, steps = notes[0], notes[1:]
    words: list[list] = []
    for name, _ in steps:
        if words and words[-1][0] == name:
            words[-1][1] += 1
        else:
            words.append([name, 1])
    text = [_safe(name) + (f" x{n}" if n > 1 else "") for name, n in words]
    segments = {seg for _, seg in steps if seg}
    rows = [", ".join(text[k:k + 4]) for k in range(0, len(text), 4)]
    if len(segments) == 1:
        rows.append(f"({_short(segments.pop())})")
    body.append(f"    Note over {names[pid]}: " + "<br/>".join(rows))
    notes.clear()


def table(trace: Trace, rows: int = MAX_ROWS) -> str:
    """A Markdown table of the first ``rows`` events."""
    out = ["| t | process | thread | layer | step | segment | detail |",
           "|---|---|---|---|---|---|---|"]
    for e in trace.events[:rows]:
        info = trace.processes.get(e.pid)
        who = f"{info.label if info else '?'} {e.pid}"
        out.append(f"| {_ms(trace, e)} | {who} | {e.thread or e.tid} | {e.layer} | {e.name} | "
                   f"{_short(e.segment)} | {e.detail.replace('|', '/')[:80]} |")
    if len(trace.events) > rows:
        out.append(f"| ... | {len(trace.events) - rows} more | | | | | |")
    return "\n".join(out)


def summary(trace: Trace) -> str:
    limits = "\n".join(f"- {line}" for line in trace.limits)
    over = ", ".join(f"{k} {v}" for k, v in trace.overhead.items())
    return f"**Limits**\n\n{limits}\n\n**Overhead**: {over}"


def show(trace: Trace) -> None:
    """The diagram (JupyterLab 4.1+ draws a ```mermaid fence), the table, the limits."""
    from IPython.display import Markdown, display
    display(Markdown(f"```mermaid\n{trace.to_mermaid()}```\n\n{table(trace)}\n\n"
                     f"{summary(trace)}"))
