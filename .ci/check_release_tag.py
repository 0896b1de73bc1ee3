"""Refuse a release tag the project does not describe: the tag's version must be
pyproject.toml's, and CHANGELOG.md must have an entry for it (a ``## [X.Y.Z]``
heading). The wheels workflow runs it before anything is published:

    python .ci/check_release_tag.py v0.1.0

It exits 0, or 1 with a line on stderr for each problem.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency on Python 3.10, where the unit tests run this too
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def problems(tag: str, root: Path = ROOT) -> list[str]:
    """What stops tag from being released.

    Arguments:
        tag: the git tag, "v" and the version (``v0.1.0``).
        root: the project's root, holding pyproject.toml and CHANGELOG.md.

    Returns:
        One line per problem; empty when the tag may be released.
    """
    with open(root / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]["version"]
    version = tag.removeprefix("v")
    found = []
    if version != project:
        found.append(f"the tag {tag} is not pyproject.toml's version, {project}")
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    if version not in re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.M):
        found.append(f"CHANGELOG.md has no entry for {version} (a '## [{version}]' heading)")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_release_tag.py TAG", file=sys.stderr)
        return 2
    found = problems(argv[0])
    for problem in found:
        print(f"release refused: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
