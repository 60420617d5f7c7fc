"""The order and the pairing of make test's files (tests/conftest.py) name files that exist: a file
renamed or removed would otherwise drop silently out of the ONE_AT_A_TIME group (and run beside a
file that makes unix accounts) or out of the longest-first order."""
from __future__ import annotations

from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parent.parent


def test_the_one_at_a_time_group_and_the_longest_first_order_name_real_test_files():
    named = set(conftest.ONE_AT_A_TIME) | {u for u, _ in conftest.LONGEST if u != "one at a time"}
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"tests/conftest.py names test files that do not exist: {missing}"


def test_every_file_that_makes_unix_accounts_is_in_the_one_at_a_time_group():
    makers = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
              if any(w in p.read_text() for w in ("useradd", "class_server", "/srv/"))}
    makers.discard("tests/test_suite_pairing.py")
    assert makers <= conftest.ONE_AT_A_TIME, sorted(makers - conftest.ONE_AT_A_TIME)


def test_a_file_is_its_own_unit_unless_it_is_in_the_group():
    assert conftest.unit_of("tests/test_cluster.py") == "tests/test_cluster.py"
    assert conftest.unit_of("tests/test_class_load.py") == "one at a time"
