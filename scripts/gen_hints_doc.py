"""Write docs/hints.md from the hint rules themselves, so the docs cannot drift.

    .venv/bin/python scripts/gen_hints_doc.py          # rewrite docs/hints.md
    .venv/bin/python scripts/gen_hints_doc.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_gpu_eff.report.hints import rules_markdown  # noqa: E402

TARGET = REPO / "docs" / "hints.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/hints.md is out of date")
    args = parser.parse_args(argv)
    text = rules_markdown()
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else None
    if args.check:
        if current != text:
            print(f"{TARGET} is out of date: run scripts/gen_hints_doc.py", file=sys.stderr)
            return 1
        return 0
    if current != text:
        TARGET.parent.mkdir(parents=True, exist_ok=True)
        TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
