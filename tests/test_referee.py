"""The referee (autograder/referee/calls.py, coursekit/checks/remote.py): the hidden checks' probes run in
the grader's process and the student's code answers their calls.

Fast, in-process (through :class:`coursekit.checks.remote.Loopback`, the same encoding as the pipe):
the reference solutions pass every hidden check for several draws of the inputs, the wrong versions
that must lose a hidden check lose it under other draws too, the notebook's side runs only the
course's registered helpers, and the draw is a function of the handed-in file and the course's
secret. The same checks through a real sandbox: tests/test_hidden_checks_stay_hidden.py (nothing of
them inside), tests/test_checks_in_process.py (every fixture, through the referee's encoding) and the
hostile and verdict classes.
"""
from __future__ import annotations

import functools

import pytest
import torch

from autograder.referee import calls as referee
from coursekit.checks import HIDDEN_IDS, CheckFailed, get, load_all
from coursekit.checks.remote import HELPERS, Answerer, Loopback, RemoteHandle
from course.release import ROOT
from notebook_ns import grade_ids, outcome, solution_ns
from tools.make_submission import fixtures
from notebook_ns import code_ns

load_all()
ASSIGNMENTS = ("01_layernorm", "02_rmsnorm", "03_residual", "04_transformer_block", "05_backward", "06_streams")
OWNER = {g: a for a in ASSIGNMENTS for g in grade_ids(a)}
HIDDEN = sorted(HIDDEN_IDS)
_solution = functools.cache(solution_ns)


def test_every_test_but_the_benchmarks_is_refereed():
    assert len(HIDDEN) >= 20
    for gid in HIDDEN:
        assert gid in OWNER, gid
        assert referee.refereed(gid)
    for gid in OWNER:
        assert referee.refereed(gid) == (get(gid).kind != "benchmark"), gid
    visible = [g for g in OWNER if g not in HIDDEN_IDS and get(g).kind != "benchmark"]
    assert visible and all(referee.refereed_check(g).probe is not get(g).probe for g in visible)
    assert all(referee.refereed_check(g).probe is get(g).probe for g in HIDDEN)


@pytest.mark.parametrize("draw", [1, 977, 2 ** 40 + 3, 123456789])
def test_the_solution_passes_every_hidden_check_for_any_draw(draw):
    failed = {g: m for g in HIDDEN if (m := outcome(g, _solution(OWNER[g]), draw))}
    assert not failed, failed


WRONG = [f for f in fixtures(ROOT / "tests" / "fixtures" / "wrong")
         if any(g in HIDDEN_IDS for g in (f.loses if isinstance(f.loses, list) else []))]


@pytest.mark.parametrize("fx", WRONG, ids=[f"{f.assignment}/{f.name}" for f in WRONG])
def test_a_wrong_version_loses_its_hidden_checks_under_another_draw(fx):
    ns = code_ns(fx.assignment, fx.code, str(fx.path))
    for gid in [g for g in fx.loses if g in HIDDEN_IDS]:
        for draw in (7, 31337):
            assert outcome(gid, ns, draw) is not None, (fx.name, gid, draw)


def test_the_draw_changes_the_hidden_inputs_and_nothing_else():
    """Same draw, same inputs; another draw, other inputs; draw 0 is the notebook's fixed seeds."""
    from coursekit.checks.seeded import randn, salted
    with salted(5):
        a, b = randn(21, 3, 4), randn(21, 3, 4)
    with salted(6):
        c = randn(21, 3, 4)
    with salted(0):
        d = randn(21, 3, 4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(d, randn(21, 3, 4))


def test_the_draw_is_the_files_and_the_course_secrets(tmp_path):
    nb = tmp_path / "layernorm.ipynb"
    nb.write_bytes(b'{"cells": []}')
    d1 = referee.draw_for("s", "ada", "01_layernorm", nb)
    assert d1 == referee.draw_for("s", "ada", "01_layernorm", nb)  # a regrade draws the same
    assert d1 != referee.draw_for("t", "ada", "01_layernorm", nb)  # another course
    assert d1 != referee.draw_for("s", "ben", "01_layernorm", nb)  # another student
    nb.write_bytes(b'{"cells": [], "x": 1}')
    assert d1 != referee.draw_for("s", "ada", "01_layernorm", nb)  # a new submission draws anew


def test_the_course_secret_is_made_once_private_and_never_through_a_link(tmp_path):
    s = referee.course_secret(tmp_path)
    assert len(s) == 32 and referee.course_secret(tmp_path) == s
    assert (tmp_path / referee.DRAW_SECRET).stat().st_mode & 0o777 == 0o600
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / referee.DRAW_SECRET).symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        referee.course_secret(other)
    assert not (tmp_path / "target").exists()


def test_the_notebook_side_runs_only_the_courses_helpers():
    """What the referee may ask for is a fixed table of the course's own functions; anything else
    is refused, and the namespace is reached only through them."""
    assert HELPERS and all(name.startswith("coursekit.checks.") for name in HELPERS)
    ans = Answerer({"LayerNorm": torch.nn.Identity})
    for name in ("os.system", "builtins.exec", "coursekit.checks.remote.tag", "__import__"):
        reply = ans.answer({"helper": name, "args": [], "kwargs": {"__d__": {}}})
        assert reply["ok"] is False and reply["error"] == "CheckFailed", reply
    reply = ans.answer({"helper": "has", "args": ["LayerNorm"], "kwargs": {"__d__": {}}})
    assert reply == {"ok": True, "value": True}


def test_objects_that_are_not_data_stay_in_the_notebook_behind_a_handle():
    lb = Loopback({"LayerNorm": torch.nn.LayerNorm})
    ns = lb.namespace()
    cls = ns["LayerNorm"]
    assert isinstance(cls, RemoteHandle)
    m = cls(4)
    assert isinstance(m, RemoteHandle)
    y = m(torch.ones(2, 4))
    assert type(y) is torch.Tensor and torch.equal(y, torch.zeros(2, 4))


def test_the_students_exception_comes_back_as_the_students():
    from coursekit.checks import collect

    code = "class LayerNorm(nn.Module):\n    def __init__(self, *a, **k):\n        raise ValueError('mine')\n"
    ns = code_ns("01_layernorm", code)
    rec = collect(get("layernorm_hard_rows"), Loopback(ns).namespace())
    assert rec["ok"] is False and rec["error"] == "ValueError" and rec["message"] == "mine"
    assert "__init__" in rec["where"]


def test_a_watched_op_called_by_the_students_code_is_seen_by_the_referee():
    code = ("class LayerNorm(nn.Module):\n    def __init__(self, d, eps=1e-5):\n        super().__init__()\n"
            "        self.d, self.eps = d, eps\n        self.weight = nn.Parameter(torch.ones(d))\n"
            "        self.bias = nn.Parameter(torch.zeros(d))\n"
            "    def forward(self, x):\n        return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)\n")
    msg = outcome("layernorm_hard_rows", code_ns("01_layernorm", code))
    assert msg is not None and "layer_norm" in msg


def test_a_refereed_test_in_the_plan_names_what_it_needs_and_watches():
    from autograder.grade import _test_step
    st = _test_step({"kind": "test", "grade_id": "layernorm_hard_rows", "index": 3}, 7)
    assert st["refereed"] is True and st["needs"] == ["LayerNorm"] and "native_layer_norm" in st["watch"]
    st = _test_step({"kind": "test", "grade_id": "layernorm_matches_torch", "index": 1}, 7)
    assert st["refereed"] is True
    st = _test_step({"kind": "test", "grade_id": "layernorm_benchmark", "index": 7}, 7)
    assert not st.get("refereed") and st["served"] is True
    # the count of work runs on inputs from the submission's draw: another draw, other inputs
    assert type(st["count_seed"]) is int
    assert st["count_seed"] != _test_step({"kind": "test", "grade_id": "layernorm_benchmark", "index": 7}, 8)["count_seed"]


def test_a_check_failed_inside_a_helper_keeps_its_message():
    ns = code_ns("01_layernorm", "LayerNorm = 3\n")
    with pytest.raises(CheckFailed, match="should be a class derived from torch.nn.Module"):
        from coursekit.checks.normcheck import student_class
        student_class(Loopback(ns).namespace(), "LayerNorm")


_PLANTED = r'''
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from coursekit.checks import load_all, normcheck, remote
load_all()
asked = []


class FakeLink:  # what a notebook could make: a link of its own, answering whatever it likes
    def ask(self, name, args, kwargs):
        asked.append(name)
        return torch.zeros(2, 4)


ns = {"LayerNorm": torch.nn.LayerNorm, "planted": [remote.RemoteNamespace(FakeLink(), 0)]}
out = normcheck.forward_case(ns, "LayerNorm", (4,), {}, None, None, torch.ones(2, 4))
print(json.dumps({"sandbox_side": remote.SANDBOX_SIDE, "asked": asked,
                  "plain": normcheck.forward_case is remote.HELPERS[normcheck.forward_case.remote_name],
                  "out_is_layer_norm": bool(torch.allclose(out, torch.nn.functional.layer_norm(torch.ones(2, 4), (4,))))}))
'''


@pytest.mark.parametrize("side", ["sandbox", "notebook"])
def test_in_the_sandbox_a_helper_never_asks_a_link_the_notebook_planted(side):
    """A helper that calls another with the notebook's globals (forward_case -> build_norm) looked
    through them for a remote object, and would ask a handle the notebook made, with a link of its
    own, for the answer. In the grader's sandbox (COURSEKIT_SIDE=sandbox, set by the zygote and the
    harness before the checks are imported) a helper is the plain function: nothing is looked for
    and the planted link is never asked. Elsewhere (a student's own Jupyter, where the notebook only
    fools itself, and the in-process tests) the decorator still routes remote arguments."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COURSEKIT_SIDE"}
    if side == "sandbox":
        env["COURSEKIT_SIDE"] = "sandbox"
    proc = subprocess.run([sys.executable, "-c", _PLANTED], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if side == "sandbox":
        assert got == {"sandbox_side": True, "asked": [], "plain": True, "out_is_layer_norm": True}
    else:  # the route the sandbox closes: the planted link answers build_norm
        assert got["sandbox_side"] is False and got["asked"] and not got["plain"]
