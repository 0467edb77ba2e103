"""The commands the README and docs/*.md show run as written.

A fenced block preceded by the line ``<!-- runnable -->`` (invisible when rendered) is
extracted and run: ``bash`` / ``sh`` / ``console`` blocks with ``bash -euo pipefail``,
``python`` blocks with this interpreter. The blocks of one file run in order in one fresh
working directory, so a later block sees what an earlier one wrote (``cache``). The
``alphafeat`` and ``alphamodel`` commands are this checkout's CLIs run as
``python -m MODULE`` (:data:`CLI_MODULES`: the console scripts of an environment may point at
another checkout). Install commands are not marked runnable; the README's two set-up commands
are checked verbatim instead (CI and reviewers copy them).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROJECT

#: Where each console script's ``main`` lives, run as ``python -m MODULE`` (update when the CLIs move).
CLI_MODULES = {"alphafeat": "cli.alphafeat", "alphamodel": "cli.alphamodel"}
MARKER = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 120
README_MAX_LINES = 250
SETUP_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
    "alphafeat precompute --instrument-mode front-month",
    "python3 -m venv .venv && . .venv/bin/activate && pip install 'torch==2.13.0+cpu' "
    "--index-url https://download.pytorch.org/whl/cpu && pip install -e '.[test]' && pytest -q",
)
SHELLS = {"bash", "sh", "console", "shell"}


def doc_files() -> list[Path]:
    """README.md and every docs/*.md of the checkout."""
    return [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]


def runnable_blocks(text: str, name: str = "<text>") -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of each fenced block right after a :data:`MARKER` line.

    Blank lines may separate the marker from the fence. A marker not followed by a fence, a
    fence left open or a language other than a shell or python raises ``ValueError`` naming
    ``name`` and the line, so a marked block cannot be skipped silently.
    """
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[j]) if j < len(lines) else None
        if m is None:
            raise ValueError(f"{name}:{i + 1}: {MARKER} is not followed by a fenced block")
        indent, fence, lang = m.groups()
        lang = lang.lower()
        if lang not in SHELLS | {"python", "py"}:
            raise ValueError(f"{name}:{j + 1}: runnable block in {lang or 'no language'}: give bash or python")
        end = next((k for k in range(j + 1, len(lines)) if lines[k].strip() == fence), None)
        if end is None:
            raise ValueError(f"{name}:{j + 1}: fenced block not closed")
        code = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[j + 1:end])
        blocks.append((j + 1, "python" if lang in ("python", "py") else "bash", code + "\n"))
    return blocks


def cli_functions(python: str = sys.executable) -> str:
    """Bash functions standing in for the console scripts: ``alphafeat ARGS`` runs
    ``python -m cli.alphafeat ARGS`` of this checkout."""
    return "".join(f'{name}() {{ {shlex.quote(python)} -m {mod} "$@"; }}\n' for name, mod in CLI_MODULES.items())


def run_block(lang: str, code: str, cwd: Path, timeout: float = BLOCK_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run one block in ``cwd`` with this checkout first on ``PYTHONPATH``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg", COLUMNS="120")  # fmt: skip
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", cli_functions() + code]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _files_with_blocks() -> list[Path]:
    return [p for p in doc_files() if p.exists() and runnable_blocks(p.read_text(), p.name)]


@pytest.mark.parametrize("doc", _files_with_blocks(), ids=lambda p: p.relative_to(PROJECT).as_posix())
def test_runnable_blocks_run(doc, tmp_path):
    """Every marked block of the file exits 0, in order, in one fresh folder."""
    t0 = time.perf_counter()
    for line, lang, code in runnable_blocks(doc.read_text(), doc.name):
        done = run_block(lang, code, tmp_path)
        assert done.returncode == 0, (
            f"{doc.name}:{line}: {lang} block exited {done.returncode}\n--- code\n{code}"
            f"--- stdout (tail)\n{done.stdout[-3000:]}\n--- stderr (tail)\n{done.stderr[-3000:]}")
    assert time.perf_counter() - t0 < 4 * BLOCK_TIMEOUT_S


def test_readme_keeps_setup_commands_and_length():
    text = (PROJECT / "README.md").read_text()
    for cmd in SETUP_COMMANDS:
        assert f"```bash\n{cmd}\n```" in text, f"README lost its set-up command: {cmd}"
    assert len(text.splitlines()) <= README_MAX_LINES
    assert len(runnable_blocks(text, "README.md")) >= 3


def test_extractor_finds_blocks_and_refuses_broken_markers():
    text = f"x\n{MARKER}\n\n```bash\necho hi\n```\n```bash\nnot marked\n```\n{MARKER}\n```python\nprint(1)\n```\n"
    assert runnable_blocks(text) == [(4, "bash", "echo hi\n"), (11, "python", "print(1)\n")]
    for bad in (f"{MARKER}\ntext\n", f"{MARKER}\n```bash\necho open\n", f"{MARKER}\n```json\n{{}}\n```\n"):
        with pytest.raises(ValueError, match=r"<text>:\d+"):
            runnable_blocks(bad)


def test_a_failing_block_fails_and_cli_is_this_checkout(tmp_path):
    assert run_block("bash", "false\necho not reached\n", tmp_path).returncode != 0
    assert run_block("python", "raise SystemExit(3)\n", tmp_path).returncode == 3
    done = run_block("bash", "type alphafeat\n", tmp_path)
    assert done.returncode == 0 and f"-m {CLI_MODULES['alphafeat']}" in done.stdout
