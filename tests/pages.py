"""The documentation as tests read it: a page's sections and its fenced code blocks.

Pages promise commands, manifests and configurations; the tests that hold them to it read
them here, the one way.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def section(page: Path, heading: str) -> str:
    """The text of ``page`` under its level-2 ``heading``, up to the next one."""
    text = page.read_text()
    marker = f"\n## {heading}\n"
    assert marker in text, f"{page.name} has no section '## {heading}'"
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language`` in ``text``, in order."""
    return [body for lang, body in _BLOCK.findall(text) if lang == language]


def labelled_blocks(page: Path, language: str, label: str) -> list[str]:
    """The blocks of ``page`` in ``language`` whose first line is the comment ``# label``."""
    found = [b for b in code_blocks(page.read_text(), language) if b.startswith(f"# {label}\n")]
    assert found, f"{page.name} has no {language} block starting with '# {label}'"
    return found
