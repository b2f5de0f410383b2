"""The notebooks' pictures: six topics, each with its Mermaid diagram.

Cheap, no browser: each required diagram is a ```mermaid fence in a Markdown cell of the notebook
that teaches its topic, and says the words that make it that diagram (the table below); there
are at least six in all, each starts with a diagram kind this project uses, and none has a ``;``
or a ``#`` outside an entity code such as ``#35;`` (a ``;`` ends a Mermaid statement, and a stray
``#`` silently ate the rest of a label in JupyterLab's Mermaid 11). Whether they render is
test_browser_diagrams.py's job.
"""

from __future__ import annotations

import re

import nbformat
from support import mermaid, nbutil

NOTEBOOKS = nbutil.REPO / "notebooks"
# topic -> (notebook, words its diagram must contain)
REQUIRED = {
    "a tensor's path through Queue.put, both channels": (
        "04_file_descriptor_strategy.ipynb",
        ("resource_sharer", "4-byte length", "pickle", "authkey", "SCM_RIGHTS")),
    "the file_system header and its refcount over time": (
        "05_file_system_strategy_and_shm_manager.ipynb",
        ("[0:4)", "refcount 1", "_shared_incref", "_shared_decref", "shm_unlink")),
    "the manager's life cycle": (
        "05_file_system_strategy_and_shm_manager.ipynb",
        ("torch_shm_manager", "setsid()", "SHUTDOWN_TIMEOUT", "2000 ms", "shm_unlink")),
    "CUDA IPC: block, offset, counter file, limbo": (
        "03_sharing_cuda_tensors.ipynb",
        ("cudaMalloc block", "(handle, offset)", "ref-counter file", "Limbo", "ipc_collect")),
    "process trees under fork, spawn and forkserver": (
        "08_when_the_parent_dies.ipynb",
        ('"fork"', '"spawn"', '"forkserver"', "the fork server", "fork + exec")),
    "a DataLoader batch, from a worker to the main process": (
        "15_dataloader_workers.ipynb",
        ("_new_shared", "prefetch_factor", "worker_init_fn", "SIGCHLD", "pin_memory")),
    "Hogwild vs DDP": (
        "06_hogwild_training.ipynb",
        ("share_memory()", "no lock", "all-reduced", "broadcast", "bit-identical")),
}
MIN_DIAGRAMS = 6


def missing(required, found) -> list[str]:
    """One line per required diagram that no fence of its notebook matches."""
    problems = []
    for topic, (name, words) in required.items():
        texts = [text for _, text in found.get(name, [])]
        if not any(all(w in t for w in words) for t in texts):
            best = max(texts, key=lambda t: sum(w in t for w in words), default="")
            lacks = [w for w in words if w not in best]
            problems.append(f"{name}: no diagram of {topic!r} (closest lacks {lacks})")
    return problems


def malformed(found) -> list[str]:
    problems = []
    for name, diagrams in found.items():
        for cell_id, text in diagrams:
            first = text.strip().split(None, 1)[0] if text.strip() else ""
            if first not in mermaid.KINDS:
                problems.append(f"{name} cell {cell_id}: starts with {first!r}, "
                                f"not one of {mermaid.KINDS}")
            body = "\n".join(line for line in text.splitlines()
                             if not line.lstrip().startswith("%%"))  # comments
            stray = set(re.sub(r"#\w+;", "", body)) & {";", "#"}
            if stray:
                problems.append(f"{name} cell {cell_id}: {sorted(stray)} outside an entity "
                                "code (write #59; or #35;)")
    return problems


def _found():
    return {path.name: diagrams for path, diagrams in mermaid.notebooks_with_diagrams().items()}


def test_each_topic_has_its_diagram_where_it_is_taught():
    problems = missing(REQUIRED, _found())
    assert not problems, "\n".join(problems)


def test_there_are_at_least_six_diagrams_and_each_is_well_formed():
    found = _found()
    total = sum(len(d) for d in found.values())
    assert total >= MIN_DIAGRAMS, {name: len(d) for name, d in found.items()}
    problems = malformed(found)
    assert not problems, "\n".join(problems)


def test_the_checks_can_fail():
    cell = nbformat.v4.new_markdown_cell(
        "Text.\n\n```mermaid\nflowchart LR\n    A[\"fork\"] --> B\n```\n\n"
        "```mermaid\ngraph LR; A --> B\n```\n"
        "```mermaid\nsequenceDiagram\n    %% a comment; fine\n    A->>B: #35;1 #lt;ok#gt;\n```\n"
        "```mermaid\nsequenceDiagram\n    A->>B: #CHALLENGE# is eaten\n```\n")
    code = nbformat.v4.new_code_cell("```mermaid\nflowchart LR\n```")  # not Markdown: ignored
    nb = nbformat.v4.new_notebook(cells=[cell, code])
    found = {"n.ipynb": mermaid.fences(nb)}
    assert [text for _, text in found["n.ipynb"]][:2] == [
        "flowchart LR\n    A[\"fork\"] --> B\n", "graph LR; A --> B\n"]
    assert missing({"t": ("n.ipynb", ('"fork"',))}, found) == []
    (problem,) = missing({"t": ("n.ipynb", ('"fork"', "spawn"))}, found)
    assert "closest lacks ['spawn']" in problem
    assert missing({"t": ("other.ipynb", ("x",))}, found)
    problems = malformed(found)  # 'graph' is not ours and has a ';'; '#CHALLENGE#' is eaten
    assert len(problems) == 3 and "[';']" in problems[1] and "['#']" in problems[2], problems
