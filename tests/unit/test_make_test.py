"""make test runs the `serial` tests (they stop the machine's services) by collecting only the
files the Makefile names in SERIAL_TESTS: a serial test in any other file would never run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _makefile_serial_tests() -> set[str]:
    match = re.search(r"^SERIAL_TESTS := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile names its serial test files in SERIAL_TESTS"
    return set(match[1].split())


def test_the_makefile_names_every_file_that_holds_a_serial_test():
    marked = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
              if re.search(r"mark\.serial\b", path.read_text())}
    assert marked, "the serial tests are found by their mark"
    assert _makefile_serial_tests() == marked
