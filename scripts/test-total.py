"""The total of a `make test` run, from the JUnit XML its parts wrote.

Each pass of `make test` runs in parts (scripts/test-pass.sh), each ending with its own
pytest summary; the last of them may rightly have selected no test. This prints one line
for the whole run, in pytest's words, so the reader (or CI) need not add them up, and
fails if a part that should have written its results did not.

usage: test-total.py RESULTS_DIR START_EPOCH EXPECTED_PART...
"""

import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in total:
            total[key] += int(suite.get(key, 0))
    return total


def main(argv: list[str]) -> int:
    folder, start, parts = Path(argv[1]), float(argv[2]), argv[3:]
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    missing = []
    for part in parts:
        path = folder / f"{part}.xml"
        try:
            part_counts = counts(path)
        except (OSError, ET.ParseError) as err:
            missing.append(f"{part} ({err.__class__.__name__})")
            continue
        for key in total:
            total[key] += part_counts[key]
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    words = [f"{passed} passed"]
    words += [f"{total[key]} {name}" for key, name in
              (("failures", "failed"), ("skipped", "skipped"), ("errors", "errors")) if total[key]]
    took = time.time() - start
    clock = f"{int(took // 3600)}:{int(took % 3600 // 60):02}:{int(took % 60):02}"
    print(f"--- make test, every part of every pass ({len(parts) - len(missing)} of {len(parts)}):")
    print(f"{'=' * 20} {', '.join(words)} in {took:.2f}s ({clock}) {'=' * 20}")
    for part in missing:
        print(f"make test: the part {part} wrote no results", file=sys.stderr)
    return 1 if missing or total["failures"] or total["errors"] or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
