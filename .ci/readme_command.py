"""Print the README's N-th command (1 or 2) from its "Two commands" block, exactly as written.

CI runs what this prints, so the README and CI cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands(text: str) -> list[str]:
    section = text.split("## Two commands", 1)
    if len(section) != 2:
        raise SystemExit("README.md has no '## Two commands' section")
    block = re.search(r"```sh\n(.*?)```", section[1], re.DOTALL)
    if block is None:
        raise SystemExit("README.md's '## Two commands' section has no ```sh block")
    return [
        line
        for line in block.group(1).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def main(argv: list[str]) -> int:
    commands = readme_commands(README.read_text(encoding="utf-8"))
    if len(argv) != 1 or argv[0] not in {str(i + 1) for i in range(len(commands))}:
        print(f"usage: readme_command.py N, N in 1..{len(commands)}", file=sys.stderr)
        return 2
    print(commands[int(argv[0]) - 1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
