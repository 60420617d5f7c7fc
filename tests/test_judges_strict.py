"""Judges count what comes back against their own cases (coursekit.checks.compare.paired).

For every registered check: the reference solution's probe record passes; the same record with
its structure changed (each list emptied, each list shortened by one, each dict key dropped)
fails with CheckFailed. A probe made to skip cases (a case list emptied in the student's
process, a forged record with empty outputs) used to pass an empty ``zip``: the untouched stub
earned 9/15 in exercises 01 and 02, 7/12 in 03, 8/18 in 04.

Left out (``FREE_FORM``): the benchmark's ``notes`` (free-form text, printed, never judged), its
``course solution`` timings (there only where solutions/ is, never inside the sandbox) and, on a
GPU, its ``torch.compile`` timing or the reason it is unavailable (shown, never judged). The
hard-rows checks return one tensor: nothing to mutate (the judge checks its shape).
"""
from __future__ import annotations

import copy
import functools

import pytest

from coursekit.checks import CheckFailed, collect, get, load_all, verdict
from notebook_ns import _quiet, grade_ids, solution_ns

ASSIGNMENTS = {
    "01_layernorm": pytest.mark.layernorm,
    "02_rmsnorm": pytest.mark.rmsnorm,
    "03_residual": pytest.mark.residual,
    "04_transformer_block": pytest.mark.transformer,
    "05_backward": pytest.mark.backward,
    "06_streams": pytest.mark.streams,
}
#: (check kind, path in the record's tree) of what a record may lack or shorten
FREE_FORM = {("benchmark", ("notes",)), ("benchmark", ("times", "course solution")),
             # exercise 06 times sinkhorn_knopp too: its course solution row likewise
             ("benchmark", ("sinkhorn", "course solution")),
             # on a GPU: torch.compile's row, or why there is none (shown, never judged)
             ("benchmark", ("times", "torch.compile")), ("benchmark", ("unavailable", "torch.compile"))}

_solution = functools.cache(solution_ns)


@functools.cache
def _record(assignment: str, gid: str) -> dict:
    with _quiet():
        rec = collect(get(gid), _solution(assignment))
    assert rec["ok"], rec
    return rec


def _checks():
    load_all()
    params = []
    for a, mark in ASSIGNMENTS.items():
        for gid in grade_ids(a):
            params.append(pytest.param(a, gid, marks=mark, id=gid))
    return params


def _mutations(tree, path=()):
    """(description, path of what changes, path of the node to mutate, function that mutates it)
    for each list (emptied, shortened by one) and each dict key (dropped) in an encoded tree."""
    if isinstance(tree, list):
        if tree:
            yield f"{_show(path)} emptied", path, path, lambda node: node.clear()
            yield f"{_show(path)} shortened by one", path, path, lambda node: node.pop()
        for i, x in enumerate(tree):
            yield from _mutations(x, path + (i,))
    elif isinstance(tree, dict) and "__dict__" in tree:  # a dict ({"__tensor__": ...} is a tensor)
        for k, v in tree["__dict__"].items():
            yield f"{_show(path)} without key {k!r}", path + (k,), path, lambda node, k=k: node["__dict__"].pop(k)
            yield from _mutations(v, path + (k,))


def _show(path) -> str:
    return "out" + "".join(f"[{p!r}]" for p in path)


def _node(tree, path):
    for p in path:
        tree = tree["__dict__"][p] if isinstance(p, str) else tree[p]
    return tree


def _free_form(gid, path) -> bool:
    return any(get(gid).kind == kind and path[:len(p)] == p for kind, p in FREE_FORM)


@pytest.mark.parametrize("assignment,gid", _checks())
def test_the_solutions_record_passes(assignment, gid):
    with _quiet():
        verdict(get(gid), copy.deepcopy(_record(assignment, gid)))


@pytest.mark.parametrize("assignment,gid", _checks())
def test_a_record_of_another_structure_fails(assignment, gid):
    rec = _record(assignment, gid)
    muts = [m for m in _mutations(rec["out"]["tree"]) if not _free_form(gid, m[1])]
    if not muts:
        pytest.skip("the probe returns one tensor: no list and no dict to mutate")
    passed = []
    for desc, _, where, mutate in muts:
        bad = copy.deepcopy(rec)
        mutate(_node(bad["out"]["tree"], where))
        try:
            with _quiet():
                verdict(get(gid), bad)
        except CheckFailed:
            continue
        except Exception as e:  # noqa: BLE001 -- must be a verdict, not a crash of the judge
            passed.append(f"{desc}: {type(e).__name__}: {e}")
            continue
        passed.append(f"{desc}: passed")
    assert not passed, f"{gid} does not fail these records: {passed[:10]}"


@pytest.mark.parametrize("assignment,gid", _checks())
def test_an_empty_output_fails_saying_how_many_were_expected(assignment, gid):
    rec = _record(assignment, gid)
    tree = rec["out"]["tree"]
    if not isinstance(tree, list):
        pytest.skip("the probe returns a dict or a tensor")
    bad = copy.deepcopy(rec)
    bad["out"]["tree"] = []
    with pytest.raises(CheckFailed, match=rf"expected {len(tree)} results from the probe, got 0"):
        with _quiet():
            verdict(get(gid), bad)


EMPTY_CASES_RUN = r'''
import sys
sys.path.insert(0, "tests")
from pathlib import Path
from notebook_ns import code_ns, grade_ids, outcome
from coursekit.checks import get
ns = code_ns("01_layernorm", Path("tests/fixtures/hostile/empty_case_lists.py").read_text())
for gid in grade_ids("01_layernorm"):
    if get(gid).kind != "benchmark":
        try:
            print("RESULT", gid, "passed" if outcome(gid, ns) is None else "failed")
        except Exception as e:  # a judge tripping on the record: no points either
            print("RESULT", gid, "error")
'''


@pytest.mark.layernorm
def test_a_stub_that_empties_the_case_lists_earns_nothing_in_process():
    """tests/fixtures/hostile/empty_case_lists.py, run the way a notebook's test cells run it (in a
    subprocess: it rewrites coursekit.checks' state). Before the judges counted, it passed 6 of the 7 (11 of 15 points)."""
    import subprocess
    import sys

    from course.release import ROOT, venv_env
    proc = subprocess.run([sys.executable, "-c", EMPTY_CASES_RUN], capture_output=True, text=True, cwd=ROOT,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), timeout=600)
    results = dict(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    correctness = [g for g in grade_ids("01_layernorm") if get(g).kind != "benchmark"]  # 7 then, 10 now
    assert len(results) == len(correctness) == 10, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert set(results.values()) == {"failed"}, results  # failed with a message, not an error
