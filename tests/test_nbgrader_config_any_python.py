"""The course's nbgrader_config.py names the course's own exchange classes (autograder/): they must
resolve for any nbgrader that reads the file, also one whose Python does not have the course
installed (the config puts the course folder on sys.path itself)."""
from __future__ import annotations

import subprocess
import sys

from course.release import ROOT

PROBE = r'''
import sys
# a Python without the course: no editable install's finder, no current folder on sys.path (-I)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__
                    and "editable" not in getattr(f, "__module__", "")]
try:
    import autograder  # noqa: F401
    print("COURSE ALREADY IMPORTABLE")
except ImportError:
    pass
from traitlets.config import Config
from traitlets.utils.importstring import import_item
c = Config()
ns = {"get_config": lambda: c, "__file__": sys.argv[1]}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), ns)
names = [v for k, v in c.ExchangeFactory.items()]
assert names, "the config names no exchange class"
for name in names:
    print("RESOLVED", import_item(name).__name__)
'''


def test_the_configs_exchange_classes_resolve_without_the_course_installed(tmp_path):
    out = subprocess.run([sys.executable, "-I", "-c", PROBE, str(ROOT / "nbgrader_config.py")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "COURSE ALREADY IMPORTABLE" not in out.stdout  # the probe really runs without the course
    assert out.stdout.count("RESOLVED") >= 2, out.stdout
