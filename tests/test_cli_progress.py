"""``baechi place`` shows a progress bar on a terminal, and nothing on a pipe or with
``--quiet``; the plan is the same either way."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from helpers import edge, graph_doc, op

ARGS = ["place", "--devices", "2", "--time-limit", "1", "--algorithm", "m-etf"]


def run_on_terminal(args: list[str]) -> str:
    """Everything ``baechi`` writes to a pseudo-terminal (stdout and stderr)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "baechi.cli", *args], stdin=follower,
                               stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=120)
    os.close(leader)
    assert process.returncode == 0
    return b"".join(chunks).decode()


def test_place_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(graph_doc([op("a", 5), op("b", 7)], [edge("a", "b", 10)])))
    on_terminal = run_on_terminal([*ARGS[:1], str(graph), *ARGS[1:], "-o",
                                   str(tmp_path / "tty.json")])
    assert "placing: " in on_terminal and "s left" in on_terminal
    quiet = run_on_terminal([*ARGS[:1], str(graph), *ARGS[1:], "--quiet", "-o",
                             str(tmp_path / "quiet.json")])
    assert "placing: " not in quiet and "s left" not in quiet
    piped = subprocess.run([sys.executable, "-m", "baechi.cli", *ARGS[:1], str(graph),
                            *ARGS[1:], "-o", str(tmp_path / "pipe.json")],
                           capture_output=True, text=True, check=True)
    assert "s left" not in piped.stderr + piped.stdout
    plans = [json.loads((tmp_path / f"{name}.json").read_text())
             for name in ("tty", "quiet", "pipe")]
    assert plans[0]["placement"] == plans[1]["placement"] == plans[2]["placement"]
