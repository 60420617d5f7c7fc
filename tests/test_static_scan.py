"""The autograder's static scan of a submission's source (autograder.plan.scan_forbidden).

Graded code (answer cells, every def/class/lambda body) is scanned fully; module-level code in
the cells a student added is judged by what it can do to graded code. Cells are read as IPython
reads them; a cell that cannot be read fails the scan. Honest code keeps full marks: torch.compile,
getattr(self, name), a scratch cell that compares with nn.LayerNorm, model.eval(), re.compile.
"""
from __future__ import annotations

import pytest

from tools.fixture_class import read_code_fixture
from tools.make_submission import fixtures, split_cells
from autograder.plan import scan_forbidden
from coursekit.checks.ops import NORM_OPS
from course.release import ROOT

FIXTURES = ROOT / "tests" / "fixtures"

LN = '''import torch
from torch import nn


class LayerNorm(nn.Module):
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


def with_forward(expr: str, prefix: str = "") -> str:
    """LN whose forward returns ``expr`` (``prefix``: lines before the class)."""
    return prefix + LN.replace("        return (x - mu) * torch.rsqrt", f"        return {expr}  #")


def scan(answers, added=()):
    return scan_forbidden(list(answers), list(added), NORM_OPS)


# --------------------------------------------------------------------------------------------
# Honest code passes
# --------------------------------------------------------------------------------------------

def _fixture_cells(path):
    return split_cells(path.read_text())


RIGHT = [f for f in fixtures(FIXTURES / "right") if f.assignment in ("01_layernorm", "02_rmsnorm", "05_backward")]


@pytest.mark.parametrize("fx", RIGHT, ids=[f"{f.assignment}/{f.name}" for f in RIGHT])
def test_every_right_fixture_passes_the_scan(fx):
    answer, added = split_cells(fx.code)
    assert scan([answer], added) == []


@pytest.mark.parametrize("name", ["compiled_forward", "getattr_parameters", "scratch_cell_compares_torch",
                                  "scratch_cell_eval_mode"])
def test_the_honest_variants_exist_and_pass(name):
    answer, added = _fixture_cells(FIXTURES / "right" / "01_layernorm" / f"{name}.py")
    assert scan([answer], added) == []
    if name.startswith("scratch"):
        assert added, "the fixture should have a cell the student added"


@pytest.mark.parametrize("code", [
    with_forward("self._f(x)", "").replace("    def forward", "    @torch.compile\n    def forward"),
    LN.replace("    def forward", "    @torch.compile(dynamic=False, mode='max-autotune')\n    def forward"),
    LN + "\nLayerNorm.forward = torch.compile(LayerNorm.forward)\n",
    LN.replace("* self.weight + self.bias", "* getattr(self, 'weight') + getattr(self, names[1])"),
    LN.replace("        return (x - mu)", "        w, b = (getattr(self, n) for n in ('weight', 'bias'))\n        return (x - mu)"),
    LN.replace("self.eps = eps", "self.eps = eps\n        for n in ('a', 'b'):\n            setattr(self, n, None)"),
    "import torch\ndef layer_norm(x, eps=1e-5):\n    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)\n"
    + with_forward("layer_norm(x, self.eps)"),
    LN + "\n    def rms_norm(self, x):\n        return x\n\n    def g(self, x):\n        return self.rms_norm(x)\n",
    with_forward("(x - mu) / torch.linalg.vector_norm(x - mu, dim=-1, keepdim=True) * x.shape[-1] ** 0.5"),
    with_forward("(x - mu) / (x - mu).norm(dim=-1, keepdim=True) * x.shape[-1] ** 0.5"),
    LN.replace("class LayerNorm(nn.Module):", 'class LayerNorm(nn.Module):\n    """My layer_norm: like nn.LayerNorm, by hand."""'),
    LN + "\nm = LayerNorm(4)\nm.eval()\nimport re\npat = re.compile(r'LayerNorm\\((\\d+)')\n",
    "%timeit LayerNorm(4)(x)\n" + LN,
    "%matplotlib inline\n_here = %pwd\n" + LN,
], ids=["compile-decorator", "compile-call", "compile-rebound", "getattr-self-constant", "getattr-self-computed",
        "setattr-self", "own-function-named-layer_norm", "own-method-named-rms_norm", "vector_norm", "x.norm",
        "docstring", "eval-method-re-compile", "timeit-magic", "pwd-and-matplotlib"])
def test_honest_answer_cells_pass(code):
    assert scan([code]) == []


@pytest.mark.parametrize("cell", [
    "import torch.nn.functional as F\nx = torch.randn(4, 32)\nmine = LayerNorm(32)\nref = nn.LayerNorm(32)\n"
    "with torch.no_grad():\n    ref.weight.copy_(mine.weight)\n    mine.load_state_dict(ref.state_dict())\n"
    "print(torch.allclose(mine(x), ref(x), atol=1e-5))\nprint((mine(x) - F.layer_norm(x, (32,))).abs().max())\n",
    "assert torch.allclose(LayerNorm(8)(x), torch.nn.functional.layer_norm(x, (8,)))\n",
    "for n in ['weight', 'bias']:\n    print(getattr(model, n).shape)\n",
    "model = LayerNorm(16)\nmodel.eval()\nimport re\nprint(re.compile('a+').findall('aaa'))\n",
    "def check(a, b, x):\n    print(torch.allclose(a(x), b(x)))\ncheck(LayerNorm(8), nn.LayerNorm(8), torch.randn(2, 8))\n",
    "ref = nn.LayerNorm(8)\nmine = LayerNorm(ref.normalized_shape, eps=ref.eps)\n",
    "%timeit nn.LayerNorm(32)(x)\nr = %timeit -o -n 3 F.layer_norm(x, (32,))\n",
    "results = []\nresults.append(nn.LayerNorm(8)(x))\n",
    "x = nn.LayerNorm(32)(torch.randn(4, 32))\nmu = x.mean(-1)\nweight = nn.LayerNorm(32).weight\nself = nn.LayerNorm(3)\n",
    "eps = torch.nn.LayerNorm(8).eps\ndims = [t for t in nn.LayerNorm(8).normalized_shape]\n",
    '"""Checks against torch.nn.LayerNorm (the reference)."""\nprint("compare with torch.nn.LayerNorm (reference):", 1)\n',
], ids=["compare", "assert", "getattr-in-loop", "eval-and-re", "harmless-helper", "shape-from-torch",
        "timeit", "results-list", "names-graded-code-binds-itself", "names-graded-code-reads-as-attributes",
        "prose-naming-torch"])
def test_honest_scratch_cells_pass(cell):
    assert scan([LN], [cell]) == []


# --------------------------------------------------------------------------------------------
# Cheats are caught
# --------------------------------------------------------------------------------------------

def test_an_ipython_line_no_longer_hides_the_cell():
    code = "_here = %pwd\nimport torch.nn.functional as F\n" + with_forward("F.layer_norm(x, self.normalized_shape)")
    assert "F.layer_norm" in scan([code])


def test_the_python_inside_magics_is_scanned():
    assert scan([LN], ["%time LayerNorm.forward = lambda s, x: F.layer_norm(x, (4,))\n"])
    assert scan(["%%capture out\nimport torch.nn.functional as F\ny = F.layer_norm(x, (4,))\n"])
    assert scan([LN], ["!python -c 'import torch; print(torch.layer_norm)'\n"])


def test_a_cell_that_cannot_be_read_fails_the_scan_saying_which():
    found = scan([LN], ["print('fine')\n", "def f(:\n    pass\n"])
    assert len(found) == 1 and "could not be read" in found[0] and "cell you added 2" in found[0]
    assert "SyntaxError" in found[0] and "def f(:" in found[0]
    found = scan(["x = = 1\n"])
    assert found and "answer cell 1" in found[0]


def test_a_builtin_bound_in_a_scratch_cell_and_used_by_the_class_is_caught():
    found = scan([with_forward("_ref(x, self.normalized_shape)")], ["import torch.nn.functional as F\n_ref = F.layer_norm\n"])
    assert any("_ref" in f and "F.layer_norm" in f for f in found), found


@pytest.mark.parametrize("cell", [
    "import torch.nn.functional as F\nLayerNorm.forward = lambda self, x: F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)\n",
    "import torch.nn.functional as F\nsetattr(LayerNorm, 'forward', lambda s, x: F.layer_norm(x, (4,)))\n",
    "globals()['LayerNorm'] = nn.LayerNorm\n",
    "LayerNorm = nn.LayerNorm\n",
    "from torch.nn import LayerNorm\n",
    "from torch.nn import *\n",
    "import torch.nn.functional as F\nF.__dict__.update(mine=F.layer_norm)\n",
    "class LayerNorm(nn.LayerNorm):\n    pass\n",
    "def forward(self, x):\n    return torch.layer_norm(x, (4,))\nLayerNorm.forward = forward\n",
    "open('helper.py', 'w').write('from torch.nn.functional import layer_norm as f')\n",
    "get_ipython().run_cell(src)\n",
    "y = eval('1 + 1')\n",
    "exec(code)\n",
], ids=["monkeypatch-forward", "setattr", "globals-write", "rebinds-contract-name", "imports-over-contract-name",
        "star-import", "module-dict", "subclass", "def-then-patch", "code-in-a-string", "run_cell", "eval", "exec"])
def test_monkeypatching_from_a_scratch_cell_is_caught(cell):
    assert scan([LN], [cell])


def test_monkeypatching_forward_from_a_scratch_cell_says_so():
    cell = ("import torch.nn.functional as F\n"
            "LayerNorm.forward = lambda self, x: F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)\n")
    found = scan([LN], [cell])
    assert any("LayerNorm.forward" in f for f in found), found


@pytest.mark.parametrize("answer, added", [
    (with_forward("_impl[0](x, self.normalized_shape)"), "import torch.nn.functional as F\n_impl = []\n_impl.append(F.layer_norm)\n"),
    (with_forward("_impl(x, self.normalized_shape)") + "\n_impl = None\ndef set_impl(f):\n    global _impl\n    _impl = f\n",
     "import torch.nn.functional as F\nset_impl(F.layer_norm)\n"),
    (with_forward("_table['f'](x)"), "import torch.nn.functional as F\n_table = {'f': F.layer_norm}\n"),
    (with_forward("_g(x)"), "import torch.nn.functional as F\n_f = F.layer_norm\n_g = _f\n"),
    (with_forward("_f(x)"), "from torch.nn.functional import layer_norm as _f\n"),
    (with_forward("_f(x)"), "import torch.nn.functional as F\n_f = getattr(F, 'lay' + 'er_norm')\n"),
], ids=["list-append", "setter-function", "dict", "alias-chain", "import-as", "computed-getattr"])
def test_a_builtin_reaching_graded_code_through_scratch_state_is_caught(answer, added):
    assert scan([answer], [added])


@pytest.mark.parametrize("expr", [
    "torch.native_group_norm(x.reshape(-1, 1, x.shape[-1]), None, None, x.numel() // x.shape[-1], 1, x.shape[-1], 1, self.eps)[0].reshape(x.shape)",
    "torch.ops.aten.native_group_norm(x, None, None, 1, 1, 1, 1, self.eps)[0]",
    "torch.ops.aten.native_group_norm.default(x, None, None, 1, 1, 1, 1, self.eps)[0]",
    "torch._C._nn.layer_norm(x, self.normalized_shape)",
    "torch._C._VariableFunctions.native_layer_norm(x, [4], None, None, 1e-5)[0]",
    "torch.ops.aten.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)[0]",
    "torch.batch_norm_elemt(x, None, None, mu, var, 1e-5)",
    "torch._native_batch_norm_legit_no_training(x, None, None, mu, var, 0.1, 1e-5)[0]",
    "torch.nn.functional.group_norm(x, 1)",
    "torch.nn.functional.instance_norm(x)",
    "torch.nn.functional.local_response_norm(x, 3)",
    "torch.ops.quantized.layer_norm(x, [4], None, None, 1e-5, 1.0, 0)",
    "torch._refs.native_layer_norm(x, [4], None, None, 1e-5)[0]",
    "torch._decomp.decomposition_table[k](x)",
    "torch._C._get_operation_overload('aten::native_layer_norm', '')(x)",
    "getattr(torch.ops.aten, name)(x)",
    "getattr(F, 'layer_norm')(x, (4,))",
    "operator.attrgetter(path)(torch)(x)",
    "functools.reduce(getattr, ['ops', 'aten', name], torch)(x)",
    "vars(torch)[name](x)",
    "getattr(*(F, name))(x)",
    "[f for f in vars(F).values()][0](x)",
    "F.__dict__.get(name)(x)",
    "globals().get(name)(x)",
    "inspect.getmembers(F)[k][1](x)",
    "torch.nn.LayerNorm(x.shape[-1])(x)",
    "eval('F.layer_norm')(x, (4,))",
    "__import__('torch').layer_norm(x, (4,))",
    "builtins.exec(code)",
], ids=lambda e: e[:40])
def test_builtin_norms_by_any_route_are_caught(expr):
    assert scan([with_forward(expr)])


@pytest.mark.parametrize("code", [
    "from torch.nn.functional import layer_norm",
    "from torch import native_group_norm as ngn",
    "import torch._refs as R",
    "from torch._decomp import decomposition_table",
    "from builtins import exec",
    "from torch.nn.functional import *",
])
def test_forbidden_imports_in_an_answer_cell_are_caught(code):
    assert scan([code + "\n" + LN])


def test_getattr_with_a_computed_name_is_allowed_on_self_only_inside_a_method():
    assert scan([LN.replace("        return (x - mu)", "        w = getattr(self, 'wei' + 'ght')\n        return (x - mu)")]) == []
    assert scan(["import torch.nn.functional as self\nf = getattr(self, name)\n"])
    assert scan([LN.replace("        return (x - mu)", "        self = F\n        w = getattr(self, name)\n        return (x - mu)")])


def test_builtin_eval_is_caught_and_eval_methods_are_not():
    assert scan([LN], ["y = eval('1 + 1')\n"]) == ["eval()"]
    assert scan([LN], ["m = LayerNorm(4)\nm.eval()\nimport re\nre.compile('x')\n"]) == []
    assert scan([LN + "\nm = LayerNorm(4).eval()\n"]) == []
    assert scan([LN + "\nc = compile('1', 'f', 'eval')\n"]) == ["compile()"]


def test_the_old_call_scans_every_cell_as_an_answer():
    """``scan_forbidden(code_cells, ops)`` (the grader's call before it passes the added cells
    apart) keeps working: strictly, a scratch cell is scanned like an answer."""
    assert scan_forbidden([LN], NORM_OPS) == []
    assert scan_forbidden([LN, "ref = nn.LayerNorm(8)\n"], NORM_OPS) == ["nn.LayerNorm"]
    assert scan_forbidden([LN], ["ref = nn.LayerNorm(8)\n"], NORM_OPS) == []


# --------------------------------------------------------------------------------------------
# The hostile fixtures whose cheat is in the source
# --------------------------------------------------------------------------------------------

SOURCE_CHEATS = ["builtin_layernorm", "builtin_obfuscated", "native_group_norm", "aten_group_norm_unrecorded",
                 "ipython_line_hides_source"]


@pytest.mark.parametrize("name", SOURCE_CHEATS)
def test_hostile_fixtures_that_call_a_builtin_fail_the_scan(name):
    fx = read_code_fixture(FIXTURES / "hostile" / f"{name}.py")
    answer, added = split_cells(fx["code"])
    assert scan([answer], added), name
