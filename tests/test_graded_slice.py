"""The graded slice (autograder.intake.slicing) and what the grader reads in it (autograder.intake.scan).

Only the graded slice runs: the locked cells, the answer cells, and what in the cells a student
added the contract's names reach. Built-ins cost points only where graded code names them; code
that reaches around the course is flagged for review, which costs nothing. Cells here are in the
layout students hand in: the locked setup cell imports torch, nn and F, the answer cell holds the
answer, scratch cells are cells the student added.
"""
from __future__ import annotations

import pytest

from autograder.intake import scan
from autograder.intake.slicing import Cell, slice_cells
from coursekit.checks import get
from course.release import ROOT
from tools.fixture_class import read_code_fixture
from tools.make_submission import fixtures, split_cells

FIXTURES = ROOT / "tests" / "fixtures"
SETUP = ("try:\n    import torch\n    from torch import nn\n    import torch.nn.functional as F\n"
         "    from coursekit import run, smoke\nexcept ModuleNotFoundError:\n    raise\n")

LN = '''class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x):
        dims = tuple(range(-len(self.normalized_shape), 0))
        mu = x.mean(dims, keepdim=True)
        var = (x - mu).pow(2).mean(dims, keepdim=True)
        return (x - mu) * torch.rsqrt(var + self.eps) * self.weight + self.bias
'''
NORM = scan.forbidden_names(get("layernorm_matches_torch"))


def with_forward(expr: str, prefix: str = "") -> str:
    """LN whose forward returns ``expr`` (``prefix``: lines before the class)."""
    return prefix + LN.replace("        return (x - mu) * torch.rsqrt", f"        return {expr}  #")


def sliced(answers, added=(), gid="layernorm_impl"):
    cells = [Cell("locked", "setup", SETUP)]
    cells += [Cell("answer", f"answer cell {gid}", a) for a in answers]
    cells += [Cell("added", f"cell you added {i}", a) for i, a in enumerate(added, 1)]
    return slice_cells(cells)


def costs(answers, added=()):
    return scan.costs(sliced(answers, added), NORM)


def review(answers, added=()):
    return scan.review(sliced(answers, added))


def runs(answers, added=()):
    """The code that runs of each added cell."""
    return sliced(answers, added).runs[1 + len(answers):]


# --------------------------------------------------------------------------------------------
# What runs
# --------------------------------------------------------------------------------------------

def test_a_scratch_cell_that_graded_code_does_not_need_does_not_run():
    cell = ("x = torch.randn(4, 32)\nmine = LayerNorm(32)\nprint(torch.allclose(mine(x), nn.LayerNorm(32)(x)))\n"
            "assert torch.allclose(mine(x), F.layer_norm(x, (32,)))\n")
    assert runs([LN], [cell]) == [""]


def test_a_helper_in_a_scratch_cell_runs_and_the_rest_of_the_cell_does_not():
    answer = with_forward("_scale(x - mu, var, self.eps) * self.weight + self.bias")
    cell = "def _scale(d, v, e):\n    return d * torch.rsqrt(v + e)\nprint(_scale(torch.ones(2), torch.ones(2), 1e-5))\n"
    out = runs([answer], [cell])[0]
    assert "def _scale" in out and "print" not in out
    assert out.splitlines()[:2] == cell.splitlines()[:2]  # line numbers stay the student's


@pytest.mark.parametrize("brk", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_the_slice_keeps_a_statements_own_line_after_characters_python_does_not_break_at(brk):
    """str.splitlines() breaks at these characters, Python's tokenizer does not: the kept text must be
    the statement Python numbered, not the line after it (the seventh red team's smuggling route)."""
    answer = with_forward("_scale(x - mu, var, self.eps) * self.weight + self.bias")
    page_break = "\x0c\n" if brk == "\x0c" else ""  # alone on a line only a form feed is Python (whitespace)
    cell = (f"print('helpers below')\n# a note{brk}import sys; _scale = sys.gettrace\n{page_break}"
            f"def _scale(d, v, e):  # another{brk}note\n    return d * torch.rsqrt(v + e)\n")
    out = runs([answer], [cell])[0]
    assert "    return d * torch.rsqrt(v + e)" in out
    assert "gettrace" not in out and "print" not in out
    ns = {"torch": __import__("torch")}
    exec(compile(out, "<slice>", "exec"), ns)  # what runs is what Python reads: the helper, whole
    assert ns["_scale"](ns["torch"].ones(2), ns["torch"].zeros(2), 1.0).tolist() == [1.0, 1.0]


def test_what_graded_code_needs_is_followed_transitively_and_in_statement_order():
    answer = with_forward("_a(x)")
    cells = ["K = 2.0\nunused = 1\n", "def _b(x):\n    return x * K\n", "def _a(x):\n    return _b(x)\n"]
    assert runs([answer], cells) == ["K = 2.0\n\n", cells[1], cells[2]]


def test_writes_into_graded_objects_run():
    out = runs([LN], ["LayerNorm.extra = 1\nsetattr(LayerNorm, 'tag', 'x')\nprint(LayerNorm)\n"])[0]
    assert "LayerNorm.extra = 1" in out and "setattr" in out and "print" not in out


def test_a_test_function_in_a_scratch_cell_does_not_run_and_costs_nothing():
    cell = ("def check():\n    x = torch.randn(3, 8)\n    assert torch.allclose(LayerNorm(8)(x), F.layer_norm(x, (8,)))\n"
            "check()\n")
    assert runs([LN], [cell]) == [""]
    assert costs([LN], [cell]) == [] and review([LN], [cell]) == []


def test_the_inside_of_a_time_cell_is_sliced_like_a_cell():
    cell = "%%time\ndef helper(x):\n    return x\nprint(nn.LayerNorm(3)(torch.ones(3)))\n"
    out = runs([with_forward("helper(x)")], [cell])[0]
    assert "def helper" in out and "print" not in out and "run_cell_magic" not in out


def test_magics_and_shell_escapes_in_scratch_cells_do_not_run():
    assert runs([LN], ["%timeit LayerNorm(4)(x)\n!pip install einops\n%matplotlib inline\n"]) == [""]


def test_a_scratch_cell_that_cannot_be_read_does_not_run_and_an_answer_that_cannot_is_flagged():
    sl = sliced([LN], ["def f(:\n    pass\n"])
    assert sl.runs[-1] == "" and scan.review(sl) == []
    found = review(["class LayerNorm(:\n    pass\n"])
    assert len(found) == 1 and "could not be read" in found[0] and "answer cell layernorm_impl" in found[0]


# --------------------------------------------------------------------------------------------
# Honest code keeps full marks and raises no flag
# --------------------------------------------------------------------------------------------

RIGHT = [f for f in fixtures(FIXTURES / "right")]


@pytest.mark.parametrize("fx", RIGHT, ids=[f"{f.assignment}/{f.name}" for f in RIGHT])
def test_every_right_fixture_costs_nothing_and_is_not_flagged(fx):
    from autograder.grade import Course
    answer, added = split_cells(fx.code)
    sl = sliced([answer], added)
    for t in Course().tests(fx.assignment):
        assert scan.costs(sl, scan.forbidden_names(get(t.grade_id))) == [], (fx.name, t.grade_id)
    assert scan.review(sl) == [], fx.name


@pytest.mark.parametrize("code", [
    with_forward("self._f(x)", "").replace("    def forward", "    @torch.compile\n    def forward"),
    LN.replace("    def forward", "    @torch.compile(dynamic=False, mode='max-autotune')\n    def forward"),
    LN + "\nLayerNorm.forward = torch.compile(LayerNorm.forward)\n",
    LN.replace("* self.weight + self.bias", "* getattr(self, 'weight') + getattr(self, names[1])"),
    LN.replace("        return (x - mu)", "        w, b = (getattr(self, n) for n in ('weight', 'bias'))\n        return (x - mu)"),
    LN.replace("self.eps = eps", "self.eps = eps\n        for n in ('a', 'b'):\n            setattr(self, n, None)"),
    "def layer_norm(x, eps=1e-5):\n    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)\n"
    + with_forward("layer_norm(x, self.eps)"),
    LN + "\n    def rms_norm(self, x):\n        return x\n\n    def g(self, x):\n        return self.rms_norm(x)\n",
    with_forward("(x - mu) / torch.linalg.vector_norm(x - mu, dim=-1, keepdim=True) * x.shape[-1] ** 0.5"),
    LN.replace("class LayerNorm(nn.Module):", 'class LayerNorm(nn.Module):\n    """My layer_norm: like nn.LayerNorm, by hand."""'),
    LN.replace("class LayerNorm(nn.Module):", 'class LayerNorm(nn.Module):\n    kind = "layer_norm"  # F.layer_norm'),
    LN + "\n    def extra_repr(self):\n        return ', '.join(f'{k}={v}' for k, v in self.__dict__.items() if k == 'eps')\n",
    LN + "\n    def extra_repr(self):\n        return str(vars(self).get('eps'))\n",
    LN + "\nm = LayerNorm(4)\nm.eval()\nimport re\npat = re.compile(r'LayerNorm\\((\\d+)')\n",
    "%timeit LayerNorm(4)(x)\n" + LN,
    "%matplotlib inline\n" + LN,
    LN + "\nx = torch.randn(4, 32)\nprint(torch.allclose(LayerNorm(32)(x), nn.LayerNorm(32)(x)))\n",
], ids=["compile-decorator", "compile-call", "compile-rebound", "getattr-self-constant", "getattr-self-computed",
        "setattr-self", "own-function-named-layer_norm", "own-method-named-rms_norm", "vector_norm", "docstring",
        "class-attribute-tag", "extra_repr-self-dict", "extra_repr-vars-self", "eval-method-re-compile",
        "timeit-magic", "matplotlib-magic", "compare-below-the-class"])
def test_honest_answer_cells_cost_nothing_and_are_not_flagged(code):
    assert costs([code]) == [] and review([code]) == []


@pytest.mark.parametrize("cell", [
    "x = torch.randn(4, 32)\nmine = LayerNorm(32)\nref = nn.LayerNorm(32)\n"
    "with torch.no_grad():\n    mine.load_state_dict(ref.state_dict())\n"
    "print(torch.allclose(mine(x), ref(x), atol=1e-5))\nprint((mine(x) - F.layer_norm(x, (32,))).abs().max())\n",
    "print(torch.allclose(mine(x), nn.LayerNorm(32)(x)))\n",
    "assert torch.allclose(LayerNorm(8)(x), torch.nn.functional.layer_norm(x, (8,)))\n",
    "for n in ['weight', 'bias']:\n    print(getattr(model, n).shape)\n",
    "def check(a, b, x):\n    print(torch.allclose(a(x), b(x)))\ncheck(LayerNorm(8), nn.LayerNorm(8), torch.randn(2, 8))\n",
    "%timeit nn.LayerNorm(32)(x)\nr = %timeit -o -n 3 F.layer_norm(x, (32,))\n",
    "import time, gc, sys\nt = time.perf_counter()\nLayerNorm(8)(torch.randn(2, 8))\nprint(time.perf_counter() - t, sys.version)\n",
    "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n",
], ids=["compare", "print-allclose", "assert", "getattr-in-loop", "harmless-helper", "timeit", "timing-imports", "plot"])
def test_honest_scratch_cells_cost_nothing_and_are_not_flagged(cell):
    assert costs([LN], [cell]) == [] and review([LN], [cell]) == []


# --------------------------------------------------------------------------------------------
# Built-ins in graded code cost the implementation checks
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer, added", [
    (LN, "LayerNorm.forward = lambda self, x: F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)\n"),
    (LN, "setattr(LayerNorm, 'forward', lambda s, x: F.layer_norm(x, (4,)))\n"),
    (LN, "LayerNorm = nn.LayerNorm\n"),
    (LN, "from torch.nn import LayerNorm\n"),
    (LN, "class LayerNorm(nn.LayerNorm):\n    pass\n"),
    (LN, "def forward(self, x):\n    return torch.layer_norm(x, (4,))\nLayerNorm.forward = forward\n"),
    (with_forward("_ref(x, self.normalized_shape)"), "_ref = F.layer_norm\n"),
    (with_forward("_impl[0](x, self.normalized_shape)"), "_impl = []\n_impl.append(F.layer_norm)\n"),
    (with_forward("_table['f'](x)"), "_table = {'f': F.layer_norm}\n"),
    (with_forward("_g(x)"), "_f = F.layer_norm\n_g = _f\n"),
    (with_forward("_f(x)"), "from torch.nn.functional import layer_norm as _f\n"),
    (with_forward("_impl(x)") + "\n_impl = None\ndef set_impl(f):\n    global _impl\n    _impl = f\n",
     "set_impl(F.layer_norm)\n"),
], ids=["monkeypatch-forward", "setattr", "rebinds-contract-name", "imports-over-contract-name", "subclass",
        "def-then-patch", "alias", "list-append", "dict", "alias-chain", "import-as", "setter-function"])
def test_a_builtin_reaching_graded_code_from_a_scratch_cell_costs(answer, added):
    assert costs([answer], [added]), (answer[-80:], added)


@pytest.mark.parametrize("expr", [
    "torch.native_group_norm(x.reshape(-1, 1, x.shape[-1]), None, None, x.numel() // x.shape[-1], 1, x.shape[-1], 1, self.eps)[0].reshape(x.shape)",
    "torch.ops.aten.native_group_norm(x, None, None, 1, 1, 1, 1, self.eps)[0]",
    "torch._C._nn.layer_norm(x, self.normalized_shape)",
    "torch.ops.aten.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)[0]",
    "torch.nn.functional.group_norm(x, 1)",
    "torch._refs.native_layer_norm(x, [4], None, None, 1e-5)[0]",
    "torch.nn.LayerNorm(x.shape[-1])(x)",
    "F.layer_norm(x, self.normalized_shape)",
], ids=lambda e: e[:40])
def test_builtin_norms_named_in_graded_code_cost(expr):
    found = costs([with_forward(expr)])
    assert found and "answer cell layernorm_impl, line 13" in found[0], found


@pytest.mark.parametrize("code", [
    "from torch.nn.functional import layer_norm",
    "from torch import native_group_norm as ngn",
    "import torch._refs as R",
    "from torch._decomp import decomposition_table",
    "from torch.nn.functional import *",
])
def test_imports_of_builtins_in_an_answer_cell_cost(code):
    assert costs([code + "\n" + with_forward("R(x) + decomposition_table + ngn + layer_norm")])


def test_torch_transformer_layers_cost_the_blocks_checks_only_where_a_check_forbids_them():
    code = ("class TransformerBlock(nn.Module):\n    def __init__(self, d, h, f):\n        super().__init__()\n"
            "        self.inner = nn.TransformerEncoderLayer(d, h, f, batch_first=True)\n")
    sl = sliced([code], gid="block_impl")
    assert scan.costs(sl, frozenset({"TransformerEncoderLayer"})) and scan.costs(sl, NORM) == []


# --------------------------------------------------------------------------------------------
# Code that reaches around the course is flagged, with its cell and line, and costs nothing
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, why", [
    ("getattr(torch.ops.aten, name)(x)", "computed name"),
    ("getattr(F, 'lay' + 'er_norm')(x, (4,))", "computed name"),
    ("vars(torch)[name](x)", "vars() of another object"),
    ("F.__dict__.get(name)(x)", "namespace"),
    ("globals().get(name)(x)", "globals()"),
    ("eval('F.layer_norm')(x, (4,))", "eval()"),
    ("__import__('torch').layer_norm(x, (4,))", "__import__()"),
    ("run.__globals__['_ACTIVE'].release() or x", "module namespace"),
    ("torch._C._get_operation_overload('aten::native_layer_norm', '')(x)", "torch internals (torch._C"),
    ("torch.autograd.Variable._execution_engine.run_backward(x)", "_execution_engine"),
    ("torch.sys.modules['coursekit.checks.ops']._ACTIVE.pop() or x", "the module sys reached through another object"),
    ("getattr(torch.sys.modules['torch._refs'], 'native_layer_norm')(x, (4,), None, None, 1e-5)[0]", "module sys"),
    ("getattr(run, '__globals__')['_ACTIVE'].pop() or x", "module namespace"),
    ("torch.library.Library('aten', 'IMPL')", "torch.library"),
], ids=lambda e: e[:40] if isinstance(e, str) else "")
def test_lookups_around_the_names_in_graded_code_are_flagged(expr, why):
    found = review([with_forward(expr)])
    assert any(why in f and "answer cell layernorm_impl, line 13" in f for f in found), found


@pytest.mark.parametrize("line, why", [
    ("import gc", "imports gc"), ("import sys; m = sys.modules", "sys.modules"), ("import importlib", "imports importlib"),
    ("import inspect", "imports inspect"), ("import ctypes", "imports ctypes"), ("import threading", "imports threading"),
    ("import subprocess", "imports subprocess"), ("from multiprocessing import Process", "multiprocessing"),
    ("import coursekit.checks", "imports coursekit.checks"), ("from coursekit.checks import REGISTRY", "coursekit.checks"),
    ("from torch._C import DisableTorchFunction", "torch internals"), ("import os", "imports os"),
    ("text = open('/etc/passwd').read()", "file access"), ("get_ipython().events.register('pre_run_cell', f)", "IPython"),
    ("get_ipython().run_cell('x = 1')", "IPython"), ("!ls /", "shell command"), ("%run other.py", "%run"),
    ("exec('x = 1')", "exec()"), ("F.layer_norm = lambda *a: a[0]", "writes into an imported module"),
], ids=lambda e: e[:30] if isinstance(e, str) else "")
def test_reaching_around_the_course_in_an_answer_cell_is_flagged_with_its_line(line, why):
    found = review([LN + line + "\n"])
    assert any(why in f and "line 14" in f for f in found), found
    assert costs([LN + line + "\n"]) == []


@pytest.mark.parametrize("code, why", [
    ("import torch as T\ndef _f(x):\n    return T._C._nn.layer_norm(x)\n", "torch internals (torch._C._nn.layer_norm)"),
    ("import torch.utils._python_dispatch as pd\n", "imports torch.utils._python_dispatch"),
    ("from torch.utils import _python_dispatch\n", "imports torch internals"),
    ("import numpy as np\ndef _f(x):\n    return np.os.getcwd()\n", "the module os reached through another object"),
], ids=["alias-torch-C", "import-python-dispatch", "from-import-python-dispatch", "np.os"])
def test_routes_around_an_import_are_flagged_however_they_are_spelled(code, why):
    found = review([LN.replace("        return (x - mu) * torch.rsqrt", "        _f(x)\n        return (x - mu) * torch.rsqrt") + code])
    assert any(why in f for f in found), found


def test_a_constant_getattr_of_a_builtin_costs_like_the_attribute():
    assert costs([with_forward("getattr(F, 'layer_norm')(x, self.normalized_shape)")])
    assert costs([with_forward("getattr(torch.sys.modules['torch._refs'], 'native_layer_norm')(x, [4], None, None, 1e-5)[0]")])


def test_switching_autograd_off_and_reducing_with_operator_are_not_flagged():
    code = ("import functools, operator\n"
            "def rmsnorm_backward(grad_out, x, weight, rstd):\n    with torch.set_grad_enabled(False), torch.inference_mode():\n"
            "        n = functools.reduce(operator.mul, x.shape[:-1], 1)\n        return grad_out, weight\n")
    assert scan.review(sliced([code], gid="rmsnorm_backward_impl")) == []


def test_a_graded_function_that_writes_into_module_state_is_flagged():
    answer = with_forward("_keep(x)") + "\n_SEEN = {}\ndef _keep(x):\n    _SEEN['x'] = x\n    return x\n"
    assert any("module-level state" in f for f in review([answer]))


#: honest closure code the fourteenth red team found flagged as module-level state (name, code in forward)
CLOSURE_HONEST = {
    "nested-fills-enclosing-dict": "        out = {}\n        def put(k, v):\n            out[k] = v\n"
                                   "        put('y', x - mu)\n",
    "nonlocal-in-nested-helper": "        steps = 0\n        def bump():\n            nonlocal steps\n            steps += 1\n"
                                 "        bump()\n",
    "nested-sets-its-own-argument": "        def _fill(p, v):\n            p.data = torch.full_like(p, v)\n"
                                    "            p.grad = None\n",
    "except-as-target": "        try:\n            r = torch.rsqrt(var + self.eps)\n"
                        "        except RuntimeError as e:\n            e.args = ('LayerNorm: ' + str(e),)\n            raise\n",
    "two-levels-down": "        acc = []\n        def outer():\n            def inner(t):\n                acc.append(t)\n"
                       "                acc[0] = t\n            inner(x)\n        outer()\n",
    "nested-def-and-import-names": "        def helper():\n            pass\n        helper.calls = 1\n"
                                   "        class Box:\n            pass\n        Box.value = x\n",
}


@pytest.mark.parametrize("body", CLOSURE_HONEST.values(), ids=CLOSURE_HONEST.keys())
def test_a_closure_writing_into_its_enclosing_functions_locals_is_not_module_state(body):
    answer = LN.replace("        return (x - mu)", body + "        return (x - mu)")
    assert review([answer]) == []


#: writes a closure makes into real module state: still flagged (name, (module-level code, code in forward, phrase))
CLOSURE_HOSTILE = {
    "nested-writes-module-dict": ("_SEEN = {}\n", "        def put(k, v):\n            _SEEN[k] = v\n        put('x', x)\n",
                                  "writes into module-level state: _SEEN[k]"),
    "nested-appends-to-module-list": ("_SEEN = []\n", "        def put(v):\n            _SEEN.append(v)\n        put(x)\n",
                                      "writes into module-level state"),
    "global-in-nested-helper": ("_LAST = None\n", "        def keep():\n            global _LAST\n            _LAST = x\n"
                                "        keep()\n", "rebinds module-level names: global _LAST"),
    "enclosing-global-name": ("_SEEN = {}\n", "        global _SEEN\n        _SEEN = {}\n        def put(v):\n"
                              "            _SEEN['x'] = v\n        put(x)\n", "writes into module-level state: _SEEN['x']"),
    "nested-writes-an-imported-module": ("", "        def patch():\n            F.layer_norm = None\n        patch()\n",
                                         "writes into module-level state: F.layer_norm"),
    "import-in-a-nested-helper": ("", "        def patch():\n            import math\n            math.pi = 3\n        patch()\n",
                                  "writes into module-level state: math.pi"),
    "arg-of-a-sibling-only": ("_SEEN = {}\n", "        def a(_SEEN):\n            return _SEEN\n        def b():\n"
                              "            _SEEN['x'] = x\n        b()\n", "writes into module-level state: _SEEN['x']"),
}


@pytest.mark.parametrize("prefix, body, why", CLOSURE_HOSTILE.values(), ids=CLOSURE_HOSTILE.keys())
def test_a_closure_writing_into_module_state_is_still_flagged(prefix, body, why):
    answer = prefix + LN.replace("        return (x - mu)", body + "        return (x - mu)")
    found = review([answer])
    assert any(why in f for f in found), found


def test_reaching_around_in_a_scratch_cell_that_does_not_run_is_not_flagged():
    cell = "import gc, inspect\nrun.__globals__['_ACTIVE'].release()\nprint(inspect.getsource(run))\n"
    assert runs([LN], [cell]) == [""] and review([LN], [cell]) == []


def test_reaching_around_in_a_scratch_helper_that_graded_code_uses_is_flagged():
    cell = "import gc\ndef _h(x):\n    gc.collect()\n    return x\n"
    found = review([with_forward("_h(x)")], [cell])
    assert any("imports gc" in f and "cell you added 1, line 1" in f for f in found), found


@pytest.mark.parametrize("switch", ["torch.enable_grad()", "torch.set_grad_enabled(True)", "torch.inference_mode(False)"])
def test_exercise_05_autograd_switched_on_inside_a_hand_written_backward_is_flagged(switch):
    code = (f"def rmsnorm_backward(grad_out, x, weight, rstd):\n    with {switch}:\n"
            "        y = x.detach().requires_grad_()\n    return grad_out, weight\n")
    found = scan.review(sliced([code], gid="rmsnorm_backward_impl"))
    assert any("autograd switched back on" in f and "line 2" in f for f in found), found
    honest = "def rmsnorm_backward(grad_out, x, weight, rstd):\n    with torch.no_grad():\n        return grad_out, weight\n"
    assert scan.review(sliced([honest], gid="rmsnorm_backward_impl")) == []


# --------------------------------------------------------------------------------------------
# The hostile fixtures whose cheat is in the source
# --------------------------------------------------------------------------------------------

SOURCE_CHEATS = ["builtin_layernorm", "builtin_obfuscated", "native_group_norm", "aten_group_norm_unrecorded",
                 "ipython_line_hides_source"]


@pytest.mark.parametrize("name", SOURCE_CHEATS)
def test_hostile_fixtures_that_reach_a_builtin_cost_or_are_flagged(name):
    fx = read_code_fixture(FIXTURES / "hostile" / f"{name}.py")
    answer, added = split_cells(fx["code"])
    assert costs([answer], added) or review([answer], added), name


# --------------------------------------------------------------------------------------------
# Bounded planning: linear slicing, a time budget, code and JSON too deep to read
# --------------------------------------------------------------------------------------------

def _chain(n: int) -> str:
    return "a1 = 1\n" + "".join(f"a{i} = a{i - 1} + 1\n" for i in range(2, n + 1)) + f"LayerNorm.chain_end = a{n}\n"


def test_a_4000_statement_chain_that_graded_code_reads_runs_whole_and_nothing_else_does():
    sl = sliced([LN], [_chain(4000), "b1 = 1\nb2 = b1 + 1\n", "print(a4000)\n"])
    chain = [s for s in sl.statements if s.cell == 2]
    assert len(chain) == 4001 and all(s.graded and s.runs for s in chain)
    assert sl.runs[2] == _chain(4000)  # whole, as written
    assert sl.runs[3:] == ["", ""]
    assert {f"a{i}" for i in range(1, 4001)} <= sl.needed and "b1" not in sl.needed


def test_a_chain_read_through_functions_is_followed_to_its_start():
    helpers = "".join(f"def f{i}(x):\n    return f{i - 1}(x) + 0\n" for i in range(1, 1000)).replace("f0(x)", "x")
    out = runs([with_forward("f999(x - mu) * torch.rsqrt(var + self.eps) * self.weight + self.bias")],
               [helpers, "def unused(x):\n    return f5(x)\n"])
    assert out == [helpers, ""]


def _student(answer: str, added=()):
    """Exercise 01's cells as read from a student's file: its released cells, ``answer`` in the
    first answer cell, ``added`` cells after it (no grade id: cells the student added)."""
    from autograder.grade import Course
    out, first = [], True
    for c in Course().release("01_layernorm"):
        if c["role"] == "markdown":
            continue
        src = c["source"]
        if c["role"] == "answer":
            src, first = (answer, False) if first else ("# (everything is in the first answer cell)", first)
        out.append({"source": src, "grade_id": c["grade_id"], "id": c["id"]})
        if c["role"] == "answer" and src == answer:
            out += [{"source": a, "grade_id": None, "id": None} for a in added]
    return out


def _grade_unsandboxed(tmp_path, student_cells=None, raw: bytes | None = None):
    """grade_one's row for a file that never reaches the sandbox (planning or reading stops it)."""
    import json
    from autograder.grade import Course, grade_one
    from autograder.intake.ingest import Entry
    from autograder.sandbox.bwrap import Limits
    path = tmp_path / "layernorm.ipynb"
    if raw is None:
        nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "code", "source": c["source"], "metadata": {"nbgrader": {"grade_id": c["grade_id"]}}
             if c["grade_id"] else {}, "outputs": [], "execution_count": None} for c in student_cells]}
        raw = json.dumps(nb).encode()
    path.write_bytes(raw)
    course = Course()

    def no_sandbox(*a, **k):
        raise AssertionError("the submission reached the sandbox")

    import autograder.grade as g
    orig = g.run_sandboxed
    g.run_sandboxed = no_sandbox
    try:
        row = grade_one(Entry("ann", "01_layernorm", path), course, Limits(), tmp_path, sandbox=False)
    finally:
        g.run_sandboxed = orig
    return row, sum(t.points for t in course.tests("01_layernorm"))


def test_planning_past_its_budget_gives_a_row_with_the_assignments_points_and_says_why(tmp_path, monkeypatch):
    from autograder.intake import plan as planmod
    monkeypatch.setattr(planmod, "PLAN_BUDGET_S", 0.0)
    row, full = _grade_unsandboxed(tmp_path, _student(LN, [_chain(50)]))
    assert row.status == "unreadable" and row.max_score == full > 0 and row.score == 0
    assert "could not work out which of your code to run within the 0 s" in row.message
    assert all(t.points == 0 and t.max_points > 0 for t in row.tests)


def test_the_budget_stops_slicing_at_its_deadline():
    import time
    from autograder.intake.slicing import PlanningTimeout
    cells = [Cell("locked", "setup", SETUP), Cell("answer", "answer cell layernorm_impl", LN)]
    with pytest.raises(PlanningTimeout):
        slice_cells(cells + [Cell("added", "cell you added 1", _chain(2000))], deadline=time.thread_time() - 1)


def test_a_pasted_table_of_numbers_plans_well_inside_the_budget(tmp_path):
    """The twentieth red team's honest notebook: the reference LayerNorm with a table of 200,000
    numbers pasted into its answer cell (1.6 MB, under the 2 MB limit) was 'unreadable' on a busy
    machine and full marks on a quiet one. Each statement is now walked once and copied only to
    rewrite a constant getattr, and the budget is processor time: it plans, with nothing flagged."""
    import json
    import random

    from autograder.intake.plan import bounded_plan, read_student_notebook, release_cells
    from tools.fixture_class import release_dict, solved_dict
    rng = random.Random(0)
    table = "TABLE = [" + ", ".join(f"{rng.random():.4f}" for _ in range(200_000)) + "]\n"
    nb = solved_dict("01_layernorm")
    answer = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    src = "".join(answer["source"]) if isinstance(answer["source"], list) else answer["source"]
    answer["source"] = table + src
    name, _ = release_dict("01_layernorm")
    (tmp_path / name).write_text(json.dumps(nb))
    plan, found = bounded_plan(release_cells(ROOT / "exercises" / "01_layernorm" / name),
                               read_student_notebook(tmp_path / name))
    assert found == [] and any(st["kind"] == "cell" and "TABLE = [" in st["source"] for st in plan.steps)


def test_the_planning_budget_is_the_planning_threads_processor_time():
    """Waiting (another process holding the cores) does not use the budget up: the deadline is read
    on this thread's processor clock, so a notebook plans the same on a busy machine as on a quiet one."""
    import time
    from autograder.intake.slicing import in_time
    deadline = time.thread_time() + 0.05
    time.sleep(0.2)  # wall time passes, this thread's processor time does not
    in_time(deadline)


def test_reading_values_stops_at_the_deadline_and_the_costs_reuse_the_reviews_reading():
    """The twenty-first red team: many defs of one name, each called many times, cost their product
    in the review's reading of values, which never looked at the deadline, and every test's costs
    (in the referee, with no budget) read them again. The reading checks the deadline per binding and
    per call, and the costs reuse the reading the review made under the budget."""
    import ast
    import time
    from autograder.intake.slicing import PlanningTimeout
    code = "".join(f"def f(a, b):\n    return a + b + {i}\n" for i in range(50)) + \
        "".join(f"_v{i} = f({i}, {i})\n" for i in range(50))
    with pytest.raises(PlanningTimeout):
        scan.Values([ast.parse(code)], [], deadline=time.thread_time() - 1)
    sl = sliced([LN + code])
    assert scan.review(sl) == []
    made = sl._values_cache
    assert scan.costs(sl, frozenset({"layer_norm"})) == [] and sl._values_cache is made


def test_the_review_stops_at_the_planning_deadline_too():
    """The review of the slice runs in the planning thread under the same budget: past the deadline
    it stops (a notebook of many nested definitions kept it running 100 s after its row was
    written, the red team's a12), and without a deadline it reviews as before."""
    import time
    from autograder.intake.slicing import PlanningTimeout
    sl = sliced([LN])
    assert scan.review(sl) == []
    with pytest.raises(PlanningTimeout):
        scan.review(sl, deadline=time.thread_time() - 1)


def test_code_too_deep_to_read_runs_as_written_in_an_answer_cell_and_is_flagged_and_not_in_an_added_cell():
    deep = with_forward("x" + ".real" * 600)
    sl = sliced([deep], ["y = LayerNorm" + ".a" * 600 + "\n"])
    assert sl.runs[1] == deep and sl.runs[2] == ""
    assert "nests more than 150 levels deep at line 13" in sl.unreadable[1]
    assert sl.notes == ["cell you added 1 did not run: its code nests more than 150 levels deep at line 1, "
                        "too deep for the grader to read"]
    found = scan.review(sl)
    assert len(found) == 1 and "could not be read" in found[0] and "(answer cell layernorm_impl)" in found[0]


def test_code_that_still_recurses_too_deep_gives_the_student_a_message_not_a_grader_error(tmp_path, monkeypatch):
    import copy

    from autograder.intake import slicing
    monkeypatch.setattr(slicing, "MAX_NESTING", 10 ** 6)  # the guard off: the readers recurse past Python's limit
    # a reader that recurses (the review's copy of a statement did, before it copied only what it rewrites)
    monkeypatch.setattr(scan, "resolved", lambda node: copy.deepcopy(node))
    row, full = _grade_unsandboxed(tmp_path, _student(with_forward("x" + ".real" * 600)))
    assert row.status == "unreadable" and row.max_score == full > 0 and row.score == 0
    assert "nests too deep" in row.message and "internal grader error" not in row.message


def test_a_notebook_whose_json_nests_too_deep_is_unreadable_with_the_assignments_points(tmp_path):
    deep = b'{"cells": [], "metadata": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}, \"nbformat\": 4}"
    row, full = _grade_unsandboxed(tmp_path, raw=deep)
    assert row.status == "unreadable" and row.max_score == full > 0 and row.score == 0
    assert "nests too deep" in row.message


def test_plain_python_is_read_as_ipython_reads_it_and_too_many_magics_for_a_cell_are_not_read():
    from IPython.core.inputtransformer2 import TransformerManager
    from autograder.intake.slicing import transform
    for src in (LN, "  x = 1\n", ">>> x = 1\n... \n", "In [3]: y = 2\n", "a = (1\n     / 2)\n", "\n\nz = 3"):
        assert transform(src) == TransformerManager().transform_cell(src), src
    assert "run_line_magic" in transform("%time x = 1\n")
    sl = sliced([LN], ["%time x\n" * 400 + "LayerNorm.k = 1\n"])
    assert "more than the grader reads" in sl.unreadable[2] and sl.runs[2] == ""


# --------------------------------------------------------------------------------------------
# Honest habits that need a scratch cell: %%writefile modules, star imports
# --------------------------------------------------------------------------------------------

HELPER = ("%%writefile helper.py\nimport torch\n\n\ndef layer_norm_fn(x, eps):\n"
          "    mu = x.mean(-1, keepdim=True)\n    var = (x - mu).pow(2).mean(-1, keepdim=True)\n"
          "    return (x - mu) * torch.rsqrt(var + eps)\n")


@pytest.mark.parametrize("answer", [
    "from helper import layer_norm_fn\n" + with_forward("layer_norm_fn(x, self.eps) * self.weight + self.bias"),
    "import helper\n" + with_forward("helper.layer_norm_fn(x, self.eps) * self.weight + self.bias"),
    with_forward("layer_norm_fn(x, self.eps) * self.weight + self.bias").replace(
        "    def forward(self, x):\n", "    def forward(self, x):\n        from helper import layer_norm_fn\n"),
], ids=["from-import", "import-module", "import-inside-forward"])
def test_a_writefile_cell_whose_module_graded_code_imports_runs_whole_unflagged(answer):
    sl = sliced([answer], [HELPER, "%%writefile notes.txt\nnothing\n"])
    assert sl.runs[2] == HELPER and sl.runs[3] == ""
    written = [s for s in sl.statements if s.module == "helper"]
    assert written and all(s.graded and s.runs for s in written)
    assert sl.notes == [] and scan.review(sl) == [] and scan.costs(sl, NORM) == []
    assert sl.where(written[-1]) == "cell you added 1, line 5"  # the cell's own line numbers


def test_a_writefile_cell_nothing_graded_imports_does_not_run_and_the_row_says_so():
    sl = sliced([LN], [HELPER, "import helper\nprint(helper.layer_norm_fn(torch.ones(3), 1e-5))\n"])
    assert sl.runs[2:] == ["", ""]
    assert sl.notes == ["cell you added 1: %%writefile helper.py did not run: no graded code imports helper"]


def test_what_a_written_module_holds_is_graded_code_and_reviewed():
    answer = "import helper\n" + with_forward("helper.layer_norm_fn(x, self.eps)")
    assert costs([answer], [HELPER.replace("    mu = x.mean", "    mu = F.layer_norm(x, x.shape[-1:])\n    mu = x.mean")])
    found = review([answer], [HELPER.replace("import torch", "import torch\nimport gc")])
    assert found == ["imports gc: import gc (cell you added 1, line 3)"]


def test_a_written_module_that_imports_another_written_module_brings_it_along():
    inner = "%%writefile inner.py\nimport torch\ndef scale(x, v, e):\n    return x * torch.rsqrt(v + e)\n"
    outer = ("%%writefile helper.py\nfrom inner import scale\ndef layer_norm_fn(x, eps):\n"
             "    mu = x.mean(-1, keepdim=True)\n    return scale(x - mu, (x - mu).pow(2).mean(-1, keepdim=True), eps)\n")
    out = runs(["from helper import layer_norm_fn\n" + with_forward("layer_norm_fn(x, self.eps)")], [inner, outer])
    assert out == [inner, outer]


def test_a_star_import_runs_when_graded_code_reads_a_name_nothing_binds():
    answer = with_forward("(x - mu) * torch.rsqrt(var + self.eps) * sqrt(prod(x.shape[-1:])) / sqrt(prod(x.shape[-1:]))")
    assert runs([answer], ["from math import *\nprint(pi)\n"]) == ["from math import *\n\n"]


def test_a_star_import_graded_code_needs_nothing_from_does_not_run():
    assert runs([LN], ["from math import *\nprint(pi)\n"]) == [""]  # LN reads builtins and torch only
    assert runs([with_forward("(x - mu) * torch.rsqrt(var + self.eps) * scale", "scale = 1.0\n")],
                ["from math import *\n"]) == [""]  # every name graded code reads is bound


def test_a_kept_star_import_costs_only_through_the_names_graded_code_reads():
    uses_relu = with_forward("relu(x - mu) * torch.rsqrt(var + self.eps)")
    uses_norm = with_forward("layer_norm(x, self.normalized_shape, eps=self.eps)")
    star = "from torch.nn.functional import *\n"
    assert runs([uses_relu], [star]) == [star] and costs([uses_relu], [star]) == []
    assert costs([uses_norm], [star]) == ["layer_norm (answer cell layernorm_impl, line 13)"]


def test_the_harness_imports_from_the_working_folder_only_the_modules_the_plan_says_are_written(tmp_path):
    from autograder.inside.harness import _WorkingFolder
    answer = "from helper import layer_norm_fn\n" + with_forward("layer_norm_fn(x, self.eps)")
    assert sliced([answer], [HELPER]).written == ["helper"] and sliced([LN], [HELPER]).written == []
    for name in ("helper", "triton", "json"):
        (tmp_path / f"{name}.py").write_text("X = 1\n")
    finder = _WorkingFolder(str(tmp_path), ["helper"])
    assert finder.find_spec("helper").origin == str(tmp_path / "helper.py")
    assert finder.find_spec("triton") is None and finder.find_spec("json") is None


# --------------------------------------------------------------------------------------------
# Review reads values: what a name is bound to decides, not how it is spelled
# --------------------------------------------------------------------------------------------

#: (code appended to the answer cell, a phrase the review must hold): every spelling names its route
ALIASES = [
    ("import sys\n_s = sys\n_s.modules['coursekit.checks.ops']._ACTIVE.clear()\n",
     "every imported module (sys.modules) (through the alias _s)"),
    ("import sys as s\ns.modules['coursekit.checks.ops']._ACTIVE.clear()\n",
     "every imported module (sys.modules) (through the alias s)"),
    ("from sys import modules as m\nm['coursekit.checks.ops']._ACTIVE.clear()\n",
     "every imported module (sys.modules) (through the alias m)"),
    ("import sys\nmods = [sys]\nmods[0].modules['coursekit.checks'].OpRecorder = None\n",
     "every imported module (sys.modules) (through the alias mods)"),
    ("import sys\nmods = [sys]\n", "the module sys kept in a container or class attribute"),
    ("import sys\nbox = {'s': sys}\nbox['s'].modules.get('coursekit.checks.ops')\n",
     "every imported module (sys.modules) (through the alias box)"),
    ("import sys\nclass K:\n    s = sys\nK.s.modules['coursekit.checks.ops']._ACTIVE.clear()\n",
     "every imported module (sys.modules) (through the alias K)"),
    ("import sys\nclass K:\n    s = sys\n", "the module sys kept in a container or class attribute"),
    ("import sys\n_keep = []\n_keep.append(sys)\n", "the module sys kept in a container or class attribute"),
    ("import sys\ndef _get():\n    return sys\n_get().modules['coursekit.checks.ops']._ACTIVE.clear()\n",
     "every imported module (sys.modules) (through the alias _get)"),
    ("import sys\ndef _off(mod):\n    mod.modules['coursekit.checks.ops']._ACTIVE.clear()\n_off(sys)\n",
     "every imported module (sys.modules) (through the alias mod)"),
    ("import sys\n_s = sys\n_s.settrace(None)\n", "tracing other code (through the alias _s)"),
    ("g = getattr\n_name = input()\n_ns = g(run, _name)\n",
     "getattr() with a computed name on another object (through the alias g)"),
    ("g = getattr\n_ns = g(run, '__globals__')['_ACTIVE']\n", "a function's module namespace (through the alias g)"),
    ("g = getattr\n_ns = g(run, '__glo' + 'bals__')['_ACTIVE']\n", "a function's module namespace (through the alias g)"),
    ("g = getattr\n_ln = g(torch.sys, 'modules')\n", "every imported module (sys.modules) (through the alias g)"),
    ("import base64\ne = exec\ne(base64.b64decode(b'eCA9IDE=').decode())\n",
     "exec() (runs a string as code) (through the alias e)"),
    ("ev = eval\n_f = ev('F.layer_' + 'norm')\n", "eval() (runs a string as code) (through the alias ev)"),
    ("cc = compile\n_c = cc('x = 1', 'x', 'exec')\n", "compile() (compiles a string as code) (through the alias cc)"),
    ("imp = __import__\n_gc = imp('gc')\n", "__import__() (imports by a computed name) (through the alias imp)"),
    ("imp = __import__\nimp('sys').modules['coursekit.checks.ops']._ACTIVE.clear()\n",
     "every imported module (sys.modules)"),
    ("v = vars\n_ln = v(F)['layer_norm']\n", "vars() of another object (through the alias v)"),
    ("gl = globals\n_r = gl()['run']\n", "globals() (the module namespace) (through the alias gl)"),
    ("o = open\n_t = o('/etc/hostname').read()\n", "open() (file access) (through the alias o)"),
    ("sa = setattr\nsa(F, 'layer_norm', lambda *a: a[0])\n", "setattr() on a module (through the alias sa)"),
    ("import functools\n_ns = functools.reduce(getattr, ['__globals__'], run)\n",
     "getattr() with a computed name on another object (passed to functools.reduce)"),
    ("from functools import reduce\n_ns = reduce(getattr, ['__globals__'], run)\n",
     "getattr() with a computed name on another object (passed to reduce)"),
    ("import functools\n_ns = functools.partial(getattr, run)('__globals__')\n",
     "getattr() with a computed name on another object (passed to functools.partial)"),
    ("_ns = list(map(getattr, [run], ['__globals__']))\n",
     "getattr() with a computed name on another object (passed to map)"),
    ("from operator import attrgetter as ag\n_ns = ag('__globals__')(run)\n",
     "a lookup by a computed name (through the alias ag)"),
    ("from operator import methodcaller as mc\n_subs = mc('__subclasses__')(object)\n",
     "a call by a computed name (through the alias mc)"),
    ("T = torch\n_ln = T._C._nn.layer_norm\n", "torch internals (torch._C._nn) (through the alias T)"),
    ("T = torch\n_lib = T.library.Library('aten', 'IMPL')\n", "torch internals (torch.library) (through the alias T)"),
    ("T = torch\nT.nn.functional.layer_norm = lambda *a: a[0]\n", "writes into an imported module (through the alias T)"),
    ("import builtins\nb = builtins.__dict__\nb['exec']('x = 1')\n",
     "exec() (runs a string as code) (through the alias b)"),
    ("B = __builtins__\n_x = B.exec\n", "the builtins namespace (through the alias B)"),
    ("getattr(__builtins__, 'ex' + 'ec')('x = 1')\n", "exec() (runs a string as code)"),
    ("import sys\n_m = (lambda: sys)().modules\n", "every imported module (sys.modules)"),
    ("g = getattr\n_ns = g.__call__(run, '__globals__')\n", "a function's module namespace (through the alias g)"),
    ("from sys import *\n_m = modules['coursekit.checks.ops']\n", "every imported module (sys.modules)"),
    ("import sys\ndef _f(s=sys):\n    return s.modules\n", "every imported module (sys.modules) (through the alias s)"),
    ("import sys\n_m = [m for m in (sys,)][0].modules\n", "every imported module (sys.modules) (through a value held"),
    ("_g = vars()['getattr']\n_ns = _g(run, '__globals__')\n", "a function's module namespace (through the alias _g)"),
    ("import sys\nclass _K:\n    def get(self):\n        return sys\n_m = _K().get().modules\n",
     "every imported module (sys.modules) (through the alias _K)"),
    ("import sys\nclass _K:\n    @property\n    def s(self):\n        return sys\n_m = _K().s.modules\n",
     "every imported module (sys.modules) (through the alias _K)"),
    # round 20: a lambda's default argument, a match capture and a generator's yield are aliases too
    ("make_fx = (lambda n, i=__import__: i(n, fromlist=['_']))('torch.' + 'fx.experimental.proxy_tensor').make_fx\n",
     "__import__() (imports by a computed name) (through the alias i)"),
    ("_tracer = (lambda i=__import__: i('sys'))().gettrace\n",
     "whether the code is being traced (the benchmark counts with a tracer)"),
    ("_f = (lambda s, e=exec: e(s))('x = 1')\n", "exec() (runs a string as code) (through the alias e)"),
    ("_g = (lambda g=globals: g())()\n", "globals() (the module namespace) (through the alias g)"),
    ("_ns = (lambda o, n, g=getattr: g(o, n))(run, '__glo' + 'bals__')\n",
     "a function's module namespace (through the alias g)"),
    ("_t = (lambda *, i=__import__: i('sys'))().gettrace\n",
     "whether the code is being traced (the benchmark counts with a tracer)"),
    ("match __import__:\n    case i:\n        _t = i('sys').gettrace\n",
     "whether the code is being traced (the benchmark counts with a tracer) (through the alias i)"),
    ("def _g():\n    yield __import__\n_t = next(_g())('sys').gettrace\n",
     "whether the code is being traced (the benchmark counts with a tracer)"),
    ("import pydoc\n_f = pydoc.locate('torch.nn.functional.' + 'layer_norm')\n", "imports pydoc"),
    # round 21: a module another module holds under another name is that module, read by value
    ("import collections\n_tracer = collections._sys.gettrace\n",
     "whether the code is being traced (the benchmark counts with a tracer)"),
    ("import collections\n_m = collections._sys.modules['coursekit.checks.ops']\n", "every imported module (sys.modules)"),
    ("import argparse\n_t = argparse._sys.gettrace\n", "whether the code is being traced (the benchmark counts with a tracer)"),
    ("import enum\n_i = enum.bltns.__import__('gc')\n", "__import__() (imports by a computed name)"),
    # round 21's list of routes not read yet, each read by value now
    ("import random\n_os = random._os\n", "the module os reached through another object"),
    ("import logging\n_w = logging.weakref\n", "the module weakref reached through another object"),
    ("import cgitb\n_loc = cgitb.pydoc.locate\n", "the module pydoc reached through another object"),
    ("from curses import _sys as q\n_m = q.modules\n", "imports the module sys from curses (as _sys)"),
    ("import collections\ntry:\n    collections._sys.nope\nexcept AttributeError as e:\n    _s = e.obj\n",
     "the module sys reached through another object"),
    ("import collections\n_s = next(iter(lambda: collections._sys, None))\n",
     "the module sys reached through another object"),
    ("_g = next(iter(lambda: getattr, None))\n_x = _g(run, '__glob' + 'als__')\n",
     "getattr() with a computed name on another object"),
    ("def _d(f):\n    return getattr\n@_d\ndef _g(): pass\n_x = _g(run, '__glob' + 'als__')\n",
     "a function's module namespace (through the alias _g)"),
    ("@lambda f: vars\nclass _K: pass\n_x = _K(run)\n", "vars() of another object (through the alias _K)"),
    ("def _f(a: \"__import__('sys').modules\"): pass\n", "__import__() (imports by a computed name)"),
    ("import typing\ndef _f(a: \"typing.List['__import__(\\\"gc\\\")']\"): pass\n",
     "__import__() (imports by a computed name)"),
    ("import typing, collections\ndef _f(a: 'c._sys'): pass\n_m = typing.get_type_hints(_f, {'c': collections})\n",
     "string annotations evaluated as code"),
    ("import timeit\ntimeit.timeit('import gc; gc.collect()', number=1)\n", "a string run as code (timeit.timeit)"),
    ("from timeit import Timer as T\n_t = T('x = 1', setup='im' + 'port gc')\n", "a string run as code (timeit.Timer)"),
    ("import logging.config\n_m = logging.config.BaseConfigurator({}).resolve('sys.modules')\n",
     "objects and modules looked up by dotted names in a string (logging.config)"),
    ("import string\n_o = string.Formatter().get_field('0.__globals__', (run,), {})[0]\n",
     "by the names in a format string (string.Formatter)"),
    ("from unittest import mock\nmock.patch('coursekit.checks.ops._ACTIVE', set()).start()\n",
     "objects replaced by their dotted names (unittest.mock)"),
    ("import doctest\ndef _f():\n    \"\"\">>> import gc\"\"\"\ndoctest.run_docstring_examples(_f, {})\n",
     "docstrings run as code (doctest)"),
    ("import cProfile\ncProfile.run('import gc')\n", "a string run as code (cProfile)"),
    # round 22: the Python a line magic runs is read as that Python; IPython's output cache is no route
    ("%time import sys as _s; _gt = _s.gettrace\n", "whether the code is being traced"),
    ("_gt = %time torch.sys.gettrace\n", "the module sys reached through another object"),
    ("%time from torch.fx.experimental.proxy_tensor import make_fx\n", "imports torch internals"),
    ("%timeit -n 1 -r 1 import gc\n", "imports gc"),
    ("%prun -s cumulative -q import gc\n", "imports gc"),
    ("%config InlineBackend.figure_format = __import__('gc')\n", "the magic %config with code on its right side"),
    ("%load_ext coursekit\n", "imports coursekit (%load_ext)"),
    ("_g = _.gettrace\n", "IPython's output cache or input history"),
    ("_o = Out[3]\n", "IPython's output cache or input history"),
    # exercise 05's saved-bytes probe measures the Python heap with tracemalloc
    ("import tracemalloc\n_on = tracemalloc.is_tracing()\n", "imports tracemalloc"),
    # round 23: a magic's code as IPython's own parser splits it; the shell's other attributes; strings
    # that hold code, whatever evaluates them; libraries that keep data in their own C allocations
    ("%time -len([_g:=__import__('sys').gettrace])\n", "__import__() (imports by a computed name)"),
    ("_g = get_ipython().find_line_magic('time')\n", "the IPython shell's find_line_magic"),
    ("_ip = get_ipython()\n_m = _ip.magics_manager\n", "the IPython shell's magics_manager (it reaches the notebook's machinery) (through the alias _ip)"),
    ("_x = [get_ipython()]\n", "the IPython shell kept in a container"),
    ("from sympy.parsing.sympy_parser import parse_expr\n_g = parse_expr(\"__import__('sys').gettrace\", transformations=())\n",
     "a string holding code that reaches around the course (__import__()"),
    ("_code = 'import gc; gc.collect()'\n", "a string holding code that reaches around the course (imports gc)"),
    ("import sqlite3\n_db = sqlite3.connect(':memory:')\n", "imports sqlite3"),
    ("import ssl\n_b = ssl.MemoryBIO()\n", "imports ssl"),
    # libraries whose objects made before forward take bytes into memory they allocated then
    ("import bz2\n_pool = [bz2.BZ2Compressor(1) for _ in range(8)]\n", "imports bz2"),
    ("from zlib import compressobj\n_c = compressobj(0)\n", "zlib"),
    ("import lzma as _l\n_c = _l.LZMACompressor()\n", "imports lzma"),
    ("from PIL import Image\n_im = Image.new('F', (64, 64))\n", "PIL"),
    # round 24: sys's functions that read the interpreter's own state (the benchmark's tracer allocates
    # per line: sys.getallocatedblocks told the counted call from the timed ones, 18/18 unflagged)
    ("import sys\n_b = sys.getallocatedblocks()\n", "the interpreter's own state"),
    ("from sys import getallocatedblocks as _blocks\n", "the interpreter's own state"),
    ("import sys as _s\n_r = _s.getrefcount(LayerNorm)\n", "the interpreter's own state"),
    ("import sys\n_f = [sys][0].getallocatedblocks\n", "the interpreter's own state"),
    ("import sys\n_f = getattr(sys, 'setswitchinterval')\n", "the interpreter's own state"),
]


@pytest.mark.parametrize("code, why", ALIASES, ids=[c.replace("\n", "; ")[:60] for c, _ in ALIASES])
def test_an_alias_of_a_reflective_value_is_flagged_with_the_direct_reason_and_the_alias(code, why):
    found = review([LN + code])
    assert any(why in f and "answer cell layernorm_impl, line " in f for f in found), found
    assert costs([LN + code]) == [] or "layer_norm" in code


BACKWARD = ("def rmsnorm_backward(grad_out, x, weight, rstd):\n    {line}\n"
            "    return grad_out * rstd * weight, (grad_out * x * rstd).reshape(-1, x.shape[-1]).sum(0)\n")
#: exercise 05: (module-level code, a line inside the hand-written backward, a phrase the review must hold)
AUTOGRAD_ALIASES = [
    ("_on = torch.enable_grad\n", "with _on():\n        y = x.detach().requires_grad_()",
     "autograd switched back on inside a hand-written backward (through the alias _on)"),
    ("_im = torch.inference_mode\n", "with _im(False):\n        y = x.detach().requires_grad_()",
     "autograd switched back on inside a hand-written backward (through the alias _im)"),
    ("_sg = torch.set_grad_enabled\n", "_sg(True)",
     "autograd switched back on inside a hand-written backward (through the alias _sg)"),
    ("from torch import enable_grad as eg\n", "with eg():\n        y = x.detach().requires_grad_()",
     "autograd switched back on inside a hand-written backward (through the alias eg)"),
    ("", "with getattr(torch, 'enable_grad')():\n        y = x.detach().requires_grad_()",
     "autograd switched back on inside a hand-written backward"),
    ("_ag = torch.autograd.grad\n", "g = _ag(x.sum(), x)",
     "autograd run inside a hand-written backward (torch.autograd.grad) (through the alias _ag)"),
    ("", "g = torch.autograd.grad(x.sum(), x)", "autograd run inside a hand-written backward (torch.autograd.grad)"),
    ("", "j = torch.func.vmap(torch.func.jacfwd(torch.sin))(x)",
     "autograd run inside a hand-written backward (torch.func.jacfwd)"),
    ("from torch.func import jacrev as _jr\n", "j = _jr(torch.sin)(x)",
     "autograd run inside a hand-written backward (torch.func.jacrev) (through the alias _jr)"),
    ("import torch.autograd.forward_ad as fwAD\n", "with fwAD.dual_level():\n        d = fwAD.make_dual(x, x)",
     "autograd run inside a hand-written backward (torch.autograd.forward_ad.dual_level) (through the alias fwAD)"),
]


@pytest.mark.parametrize("prefix, line, why", AUTOGRAD_ALIASES, ids=[a[1].split("\n")[0][:40] for a in AUTOGRAD_ALIASES])
def test_exercise_05_autograd_reached_by_any_name_inside_a_hand_written_backward_is_flagged(prefix, line, why):
    found = scan.review(sliced([prefix + BACKWARD.format(line=line)], gid="rmsnorm_backward_impl"))
    assert any(why in f for f in found), found


def test_exercise_05_autograd_outside_the_hand_written_functions_and_switched_off_is_not_flagged():
    code = ("_off = torch.no_grad\n_im = torch.inference_mode\n_ag = torch.autograd.grad\n"
            + BACKWARD.format(line="with _off(), _im():\n        y = x * 2"))
    assert scan.review(sliced([code], gid="rmsnorm_backward_impl")) == []


#: honest code on torch's public API and seeding boilerplate: no flag
PUBLIC_IDIOMS = [
    "NAMES = {'gelu': 'GELU', 'relu': 'ReLU'}\ndef make_act(kind):\n    return getattr(nn, NAMES[kind])()\n",
    "def make_norm(kind, dim):\n    return getattr(nn, kind)(dim)\n_n = make_norm('LayerNorm', 8)\n",
    "_act = getattr(nn, 'GELU')()\n",
    "def act(x, act_name='gelu'):\n    return getattr(F, act_name)(x)\n",
    "def cast(x, dtype_name='float32'):\n    return x.to(getattr(torch, dtype_name))\n",
    "class Cfg:\n    act = 'silu'\n_fn = getattr(F, Cfg.act)\n",
    "import os\nos.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'\n",
    "import os\nos.environ['PYTHONHASHSEED'] = '0'\nos.environ['CUDA_LAUNCH_BLOCKING'] = '1'\n",
    "import os\nos.environ.setdefault('PYTHONHASHSEED', '0')\n",
    "from os import environ\nenviron['CUBLAS_WORKSPACE_CONFIG'] = ':16:8'\n",
    "torch.backends.cudnn.deterministic = True\ntorch.backends.cudnn.benchmark = False\n"
    "torch.backends.cuda.matmul.allow_tf32 = False\ntorch.use_deterministic_algorithms(True)\n",
    "import random\nimport numpy as np\nrandom.seed(0)\nnp.random.seed(0)\ntorch.manual_seed(0)\n",
    "T = torch\n_x = T.ones(3)\nACTS = {'gelu': F.gelu, 'relu': F.relu}\n_y = ACTS['gelu'](_x)\n",
    "import functools, operator\n_n = functools.reduce(operator.mul, (2, 3), 1)\n_p = functools.partial(F.gelu, approximate='tanh')\n",
    # string annotations, timing with a callable, decorators of the standard library and torch
    "from typing import Optional\ndef _f(a: 'torch.Tensor', b: Optional['nn.Module'] = None) -> 'torch.Tensor':\n"
    "    return a\n_z: 'int' = 3\n",
    "import timeit\n_t = timeit.timeit(lambda: F.gelu(torch.ones(3)), number=3)\n_r = timeit.Timer(lambda: 1).repeat(2, 3)\n",
    "import functools\n@functools.lru_cache(None)\ndef _f(n):\n    return n\n@torch.no_grad()\ndef _g(x):\n    return x\n"
    "class _A:\n    @staticmethod\n    def s():\n        return 1\n    @property\n    def p(self):\n        return 2\n",
    "import random, logging\n_r = random.Random(0).random()\n_log = logging.getLogger('course')\n",
    # line magics that time or configure, and a throwaway name
    "%time _w = torch.ones(3)\n%timeit -n 1 -r 1 F.gelu(torch.ones(3))\n",
    "%config InlineBackend.figure_format = 'svg'\n%load_ext autoreload\n%autoreload 2\n%matplotlib inline\n",
    "for _ in range(2):\n    pass\n_t = _\n",
    "from types import SimpleNamespace\nDEFAULTS = SimpleNamespace(eps=1e-6)\n",
    # strings that read as code but reach nothing, and a bare string statement
    "_msg = 'x.mean() should be close to 0'\n_f = '{:.3f}'.format(1.0)\n_see = 'torch.nn.LayerNorm(d)'\n",
    '"""Notes: sys.modules is not used here."""\n',
    # sys's plain data, streams and settings (every other attribute of sys is flagged)
    "import sys\nassert sys.version_info >= (3, 10)\nprint('forward', file=sys.stderr)\n_e = sys.float_info.epsilon\n",
    "import sys\nsys.path.append('..')\n_n = sys.getsizeof([1, 2])\n_m = sys.maxsize\nsys.setrecursionlimit(5000)\n",
    "from sys import stderr, version_info\n",
]


@pytest.mark.parametrize("code", PUBLIC_IDIOMS, ids=[c.replace("\n", "; ")[:50] for c in PUBLIC_IDIOMS])
def test_common_idioms_on_torchs_public_api_and_seeding_are_not_flagged(code):
    assert review([LN + code]) == [] and costs([LN + code]) == []


@pytest.mark.parametrize("code, why", [
    ("import os\nos.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'\n_l = os.listdir('/')\n", "imports os"),
    ("import os\nos.environ['LD_PRELOAD'] = '/tmp/x.so'\n", "imports os"),
    ("import os\nos.environ['LD_PRELOAD'] = '/tmp/x.so'\n", "writes into an imported module"),
    ("import os\n_k = 'PYTHONHASHSEED'\nos.environ[_k] = '0'\n", "imports os"),
    ("def make(kind):\n    return getattr(nn, '_' + kind)\n", "computed name"),
    ("NAMES = {'a': '_C'}\ndef make(kind):\n    return getattr(torch, NAMES[kind])\n", "computed name"),
    ("def f(name):\n    return getattr(torch, name)\n_c = f('_C')\n", "computed name"),
    ("def f(o, name):\n    return getattr(o, name)\n", "computed name"),
    ("_name = ''.join(['lay', 'er', '_no', 'rm'])\n_fn = getattr(torch.nn.functional, _name)\n", "computed name"),
    ("_name = 'lay' + 'er_norm'\n_fn = getattr(F, _name)\n", "computed name"),
    ("_name = 'mron_reyal'[::-1]\n_fn = getattr(F, _name)\n", "computed name"),
    ("_name = f'{\"layer\"}_norm'\n_fn = getattr(F, _name)\n", "computed name"),
    ("def f(n):\n    return getattr(F, n)\n_fn = f('layer_' + 'norm')\n", "computed name"),
    ("torch.backends.cudnn.deterministic = True\ntorch.backends.cudnn.thing = 1\n", "writes into an imported module"),
], ids=["os-other-use", "os-other-variable", "os-other-variable-write", "os-computed-key", "nn-private-name",
        "torch-table-private-name", "torch-name-passed-private", "getattr-on-any-object", "name-joined",
        "name-added", "name-reversed", "name-f-string", "name-added-passed", "cudnn-other-setting"])
def test_near_misses_of_the_idioms_are_still_flagged(code, why):
    assert any(why in f for f in review([LN + code])), review([LN + code])


#: the hostile fixtures (real layout) whose cheat is an alias or another route the review reads by value
VALUE_CHEATS = ["alias_sys_releases_guards", "alias_getattr_globals", "alias_exec_base64", "reduce_getattr_globals",
                "modules_in_containers", "alias_torch_internals", "alias_vars_and_import", "alias_enable_grad",
                "alias_inference_mode", "loop_unless_a_dispatch_mode"]
ANSWER_CELL = {"01_layernorm": "layernorm_impl", "02_rmsnorm": "rmsnorm_impl", "05_backward": "rmsnorm_backward_impl"}


def test_a_name_assembled_from_pieces_is_a_computed_name_on_torchs_namespaces_too():
    fx = read_code_fixture(FIXTURES / "hostile" / "builtin_obfuscated.py")
    answer, added = split_cells(fx["code"])
    assert any("computed name" in f for f in review([answer], added))


@pytest.mark.parametrize("name", VALUE_CHEATS)
def test_hostile_fixtures_that_reach_around_through_an_alias_are_flagged_naming_it(name):
    fx = read_code_fixture(FIXTURES / "hostile" / f"{name}.py")
    answer, added = split_cells(fx["code"])
    found = scan.review(sliced([answer], added, gid=ANSWER_CELL[fx["assignment"]]))
    assert fx["review"] and any(fx["review"] in f and ", line " in f for f in found), found


def test_a_chain_of_aliases_longer_than_the_review_follows_is_itself_flagged():
    chain = "".join(f"def _f{i}():\n    return _f{i + 1}()\n" for i in range(60))
    code = LN + chain + "import sys\ndef _f60():\n    return sys\n_f0().modules['coursekit.checks.ops']._ACTIVE.clear()\n"
    assert any("more aliases in a row than the review follows" in f for f in review([code]))
    short = LN + chain.replace("_f60", "_end") + "def _end():\n    return 1\n"
    assert review([short]) == []


def test_a_lookup_on_torch_by_a_name_with_no_known_value_is_a_computed_name():
    """The red team's route: a name picked from dir(torch) has no value the review can read, so
    getattr(torch, it) is a lookup by a computed name, flagged (a config's name has known values)."""
    code = ("_cands = [_nm for _nm in dir(torch) if len(_nm) == 3 and _nm.startswith('sy')]\n"
            "_s = getattr(torch, _cands[0])\n"
            "LayerNorm.mods = _s\n")
    assert any("getattr" in r for r in review([LN + code]))


def test_getattr_naming_a_forbidden_builtin_by_value_costs_like_its_spelling():
    """getattr(F, TABLE["k"]) with "layer_norm" among TABLE's values costs as F.layer_norm does."""
    code = with_forward("getattr(F, _FN['k'])(x, x.shape[-1:])", prefix="_FN = {'k': 'layer_norm'}\n")
    found = costs([code])
    assert any("layer_norm" in c for c in found), found


def test_a_value_passed_to_a_method_binds_after_self_and_self_keeps_none_of_it():
    """obj.m(a) binds a to m's second parameter (the first is the receiver), a staticmethod's to its
    first; the red team's honest self._work(torch.float64) once made self hold torch.float64, and
    every self._x read as torch internals. Cls.m(a) (unbound) still binds a to self, and
    type(obj).m(obj, a) a to m's second parameter."""
    method = ("class _Cast:\n    def _work(self, dtype):\n        return dtype\n\n"
              "    def run(self, x):\n        self._scale = 2\n        return x.to(self._work(torch.float64)) * self._scale\n")
    static = method.replace("    def _work(self, dtype)", "    @staticmethod\n    def _work(dtype)")
    klass = method.replace("    def _work(self, dtype)", "    @classmethod\n    def _work(cls, dtype)")
    for code in (method, static, klass):
        assert review([LN + code]) == [], code
    hostile = [("class _K:\n    def _m(self, mod):\n        return mod._C._nn\n_ln = _K()._m(torch).layer_norm\n",
                "torch internals (torch._C._nn) (through the alias mod)"),
               ("class _K:\n    @staticmethod\n    def _m(mod):\n        return mod._C._nn\n_ln = _K()._m(torch)\n",
                "torch internals (torch._C._nn) (through the alias mod)"),
               ("class _K:\n    def m(self):\n        return self._C._nn\n_ln = _K.m(torch)\n",
                "torch internals (torch._C._nn) (through the alias self)"),
               ("class _K:\n    def _m(self, mod):\n        return mod._C._nn\n\n"
                "    def go(self):\n        return type(self)._m(self, torch)\n",
                "torch internals (torch._C._nn) (through the alias mod)")]
    for code, why in hostile:
        assert any(why in f for f in review([LN + code])), (code, review([LN + code]))


# ------------------------------------------------------------------------------------------------
# Reading cells in threads (the grader plans several notebooks at once)
# ------------------------------------------------------------------------------------------------

def _parse_in_threads(parse, rounds: int) -> list[str]:
    """SystemErrors raised by ``parse`` in three threads at once, each parsing a cell ``rounds``
    times while garbage with ``__del__`` (which lets another thread in mid-parse) is collected."""
    import gc
    import sys
    import threading
    import time

    src = "\n".join(f"def f{i}(x):\n    return [[(x, {i}) for _ in y] for y in x]" for i in range(60))

    class Cyclic:
        def __init__(self):
            self.me = self

        def __del__(self):
            time.sleep(0)

    errors: list[str] = []

    def work():
        for _ in range(rounds):
            Cyclic(), Cyclic()
            try:
                parse(src)
            except SystemError as e:
                errors.append(str(e))

    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(10, 1, 1)
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)
    return errors


def test_cells_read_in_several_threads_at_once_are_never_called_unreadable():
    """CPython 3.11 counts ``ast.parse``'s nesting per interpreter, so two threads parsing at once
    can raise "AST constructor recursion depth mismatch" on sound code (a CI run flagged an honest
    transformer block as "a cell that could not be read"). The grader's parse takes one thread at
    a time. The race is shown first with bare ``ast.parse``; a Python without it skips."""
    import ast

    from autograder.intake import slicing

    rounds = 300
    for _ in range(5):
        if _parse_in_threads(ast.parse, rounds):
            break
    else:
        pytest.skip("this Python parsed in threads without the race (python/cpython#106905 fixed)")
    assert _parse_in_threads(slicing.parse, rounds) == []


@pytest.mark.parametrize("code", [
    "class Norms:\n    pass\nNorms = F\n" + with_forward("Norms.layer_norm(x, (4,))"),
    "class Norms:\n    layer_norm = staticmethod(F.layer_norm)\n" + with_forward("Norms.layer_norm(x, (4,))"),
    "class Norms:\n    pass\nNorms.layer_norm = F.layer_norm\n" + with_forward("Norms.layer_norm(x, (4,))"),
], ids=["class name rebound to F", "the built-in as a class attribute", "the built-in set on the class"])
def test_an_own_class_holding_the_builtin_still_costs(code):
    """An attribute named like a forbidden built-in is the student's own only when its object may be
    nothing but the notebook's own class or %%writefile module; the built-in put there costs."""
    assert costs([code]), code


def test_an_own_static_method_named_like_the_builtin_costs_nothing():
    code = ("class Norms:\n    @staticmethod\n    def layer_norm(x, mu, var, eps):\n"
            "        return (x - mu) * torch.rsqrt(var + eps)\n\n" + with_forward("Norms.layer_norm(x, mu, var, self.eps)"))
    assert costs([code]) == [] and review([code]) == []


#: exercise 05: a function's local or parameter named like a module-level import holds its own value, not the import's
SHADOWED_IMPORT = [
    BACKWARD.format(line="grad = grad_out * rstd\n    _y = grad.to(x.dtype)"),
    BACKWARD.replace("(grad_out, x", "(grad, x").replace("grad_out", "grad").format(line="_y = grad.to(x.dtype)"),
    BACKWARD.format(line="for grad in (grad_out, x):\n        _y = grad.to(x.dtype)"),
    BACKWARD.format(line="def _h(grad):\n        return grad.to(x.dtype)\n    _y = _h(grad_out)"),
    BACKWARD.format(line="grad = grad_out * 2\n    def _h():\n        return grad.to(x.dtype)\n    _y = _h()"),
]


@pytest.mark.parametrize("code", SHADOWED_IMPORT, ids=range(len(SHADOWED_IMPORT)))
def test_exercise_05_a_local_named_like_an_imported_autograd_function_is_not_flagged(code):
    sl = sliced(["from torch.autograd import grad\n" + code], gid="rmsnorm_backward_impl")
    assert scan.review(sl) == []


@pytest.mark.parametrize("prefix, line", [
    ("g = torch.autograd.grad\n", "y = g(x.sum(), x)"),
    ("from torch.autograd import grad\n", "y = grad(x.sum(), x)"),
    ("from torch.autograd import grad\n", "global grad\n    grad = grad\n    y = grad(x.sum(), x)"),
    ("from torch.autograd import grad\ndef _run(f, t):\n    return f(t.sum(), t)\n", "y = _run(grad, x)"),
    ("from torch.autograd import grad\ndef _pick(f):\n    g = f\n    return g\n", "y = _pick(grad)(x.sum(), x)"),
    ("import torch.autograd as ag\n", "a = ag\n    def _h():\n        return a.grad(x.sum(), x)\n    y = _h()"),
    ("import torch.autograd as ag\n", "a = 1\n    def _h():\n        nonlocal a\n        a = ag\n    _h()\n    y = a.grad(x.sum(), x)"),
])
def test_exercise_05_autograd_through_parameters_closures_and_globals_is_still_flagged(prefix, line):
    found = scan.review(sliced([prefix + BACKWARD.format(line=line)], gid="rmsnorm_backward_impl"))
    assert any("autograd run inside a hand-written backward" in f for f in found), found
