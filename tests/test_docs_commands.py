"""The README and the instructors' pages (docs/) name only commands that exist (issue 29).

Every ``make`` target they name is a target of the Makefile; every ``python -m MODULE`` is an
importable module; every ``--flag`` given to a command is in that command's ``--help`` (the course's
own commands, nbgrader's, dask's, bwrap's, pip's, jupyter's), and a flag named on its own (`--jobs`)
is in the help of one of them. Commands and flags are read from code only: fenced blocks and inline
code spans, never prose.
"""
from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course.release import ROOT, venv_env

pytestmark = pytest.mark.book

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
FLAG = re.compile(r"(?<![\w./-])--[A-Za-z][\w.-]*")
BIN = Path(sys.executable).parent
#: programs outside the course whose flags the pages name, and how to ask each for its help
OTHER_HELP = {
    "nbgrader": lambda sub: ["nbgrader", *sub, "--help-all"],  # asked in this process: see help_of
    "dask": lambda sub: [str(BIN / "dask"), *sub, "--help"],
    "jupyter": lambda sub: [str(BIN / "jupyter"), *sub, "--help-all"],
    "pip": lambda sub: [sys.executable, "-m", "pip", *sub, "--help"],
    "bwrap": lambda sub: ["bwrap", "--help"],
    "useradd": lambda sub: ["useradd", "--help"],
}


def code_lines(text: str) -> list[str]:
    """Each line of the fenced code blocks, and each inline code span, without shell comments."""
    lines = [ln for body in FENCE.findall(text) for ln in body.splitlines()]
    lines += [m.replace("\n", " ") for m in re.findall(r"`([^`]+)`", FENCE.sub("", text))]
    out = []
    for ln in lines:
        ln = ln.strip()
        if ln.startswith("#"):
            continue
        out.append(re.split(r"\s#\s", ln)[0])
    return out


@functools.cache
def all_code() -> tuple[tuple[str, str], ...]:
    return tuple((p.relative_to(ROOT).as_posix(), ln) for p in DOCS for ln in code_lines(p.read_text()))


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {t for t in re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M)}


@functools.cache
def help_of(cmd: tuple[str, ...]) -> str | None:
    """The help a command prints, or None when the program is not installed here."""
    if cmd[0] == "nbgrader":  # nbgrader's apps, in this process (a second or two saved per command)
        from nbgrader.apps import NbGraderApp
        from traitlets.utils.importstring import import_item

        app = NbGraderApp
        for word in cmd[1:-1]:
            sub = app.subcommands[word][0]
            app = import_item(sub) if isinstance(sub, str) else sub
        return "\n".join(app().emit_help(classes=True))
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        return None
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=venv_env(), cwd=ROOT, timeout=300)
    return proc.stdout + proc.stderr


#: where nbgrader's configurable classes live (a ``--Class.trait`` flag sets a trait of one of them)
TRAIT_MODULES = ("nbgrader.apps", "nbgrader.exchange.default", "nbgrader.coursedir", "nbgrader.preprocessors",
                 "autograder.nbgrader.collect")


def is_trait(flag: str) -> bool | None:
    """For a traitlets flag (``--Class.trait``): whether some nbgrader or course class has that
    trait; None for an ordinary flag."""
    if "." not in flag:
        return None
    cls, _, trait = flag[2:].partition(".")
    for name in TRAIT_MODULES:
        c = getattr(importlib.import_module(name), cls, None)
        if c is not None and hasattr(c, "class_trait_names") and trait in c.class_trait_names():
            return True
    return False


def makefile_commands() -> list[tuple[str, ...]]:
    """The help commands of the modules the Makefile runs (``$(PY) -m MODULE [SUB]``)."""
    out = []
    for mod, sub in re.findall(r"\$\(PY\) -m ([\w.]+)(?: ([a-z][a-z_]*))?", (ROOT / "Makefile").read_text()):
        out.append((sys.executable, "-m", mod, *([sub] if sub and _has_subcommands(mod) else []), "--help"))
    return out


def commands() -> list[tuple[str, str, tuple[str, ...], list[str]]]:
    """(page, line, help command, flags) for every command line that gives flags."""
    out = []
    for page, ln in all_code():
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", ln):
            words = [w for w in part.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # env assignments
            if not words:
                continue
            flags = FLAG.findall(part)
            head = Path(words[0]).name
            if head.startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
                mod, rest = words[2], words[3:]
                sub = [rest[0]] if rest and re.fullmatch(r"[a-z][a-z_]*", rest[0]) and _has_subcommands(mod) else []
                out.append((page, ln, (sys.executable, "-m", mod, *sub, "--help"), flags))
            elif head in OTHER_HELP:
                sub = [w for w in words[1:3] if re.fullmatch(r"[a-z][a-z_]*", w)][:1 if head != "nbgrader" else 2]
                if head == "nbgrader":
                    words3 = [w for w in words[1:4] if re.fullmatch(r"[a-z][a-z_]*", w)]
                    sub = words3[:3] if words3[:1] == ["db"] else sub[:1]
                if head == "pip":
                    sub = sub[:1]
                out.append((page, ln, tuple(OTHER_HELP[head](sub)), flags))
    return out


@functools.cache
def _has_subcommands(mod: str) -> bool:
    text = help_of((sys.executable, "-m", mod, "--help")) or ""
    return bool(re.search(r"^usage:.*\{[\w,-]+\}", text, re.M | re.S) and "{" in text.split("\n\n")[0])


@pytest.fixture(scope="module", autouse=True)
def _helps_in_parallel():
    """Ask every command for its help at once (about 30 programs, most of them nbgrader's, each
    a second or two to start)."""
    from concurrent.futures import ThreadPoolExecutor

    cmds = {c for _, _, c, _ in commands()} | set(makefile_commands())
    cmds.add((sys.executable, "-m", "autograder", "grade", "--help"))
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(help_of, sorted(c for c in cmds if c[0] != "nbgrader")))


def test_the_pages_name_commands():
    """The scan reads what it should: the README's two commands and the grader's command are found."""
    code = [ln for _, ln in all_code()]
    assert any(ln.startswith("make book") for ln in code) and any(ln.startswith("make test") for ln in code)
    assert any("python -m autograder grade" in ln for ln in code)
    assert len(commands()) > 20


def test_every_make_target_named_exists():
    targets = makefile_targets()
    missing = sorted({(page, t) for page, ln in all_code()
                      for t in re.findall(r"(?:^|&&\s*|;\s*)make\s+([a-z][\w-]*)", ln) if t not in targets})
    assert not missing, f"make targets the pages name that the Makefile lacks: {missing}"


def test_every_python_module_named_is_importable():
    mods = {m for _, ln in all_code() for m in re.findall(r"python3?\s+-m\s+([A-Za-z_][\w.]*)", ln)}
    assert {"autograder", "course.site", "coursekit.selfcheck"} <= mods, mods
    missing = sorted(m for m in mods if importlib.util.find_spec(m) is None)
    assert not missing, f"python -m modules the pages name that do not exist: {missing}"


def test_every_flag_given_to_a_command_is_in_its_help():
    bad = []
    for page, ln, cmd, flags in commands():
        text = help_of(cmd)
        if text is None:  # a program this machine lacks (useradd on a minimal system): nothing to compare
            continue
        for f in flags:
            name = f.split("=")[0]
            if is_trait(name) is not None:
                if not is_trait(name):
                    bad.append(f"{page}: {name} (no nbgrader class has that trait)")
                continue
            if not re.search(re.escape(name) + r"(?![\w-])", text):
                bad.append(f"{page}: {name} (in `{ln.strip()}`; not in `{' '.join(cmd[-3:])}`)")
    assert not bad, "flags the pages give that their command does not have:\n" + "\n".join(bad)


def test_every_flag_named_alone_belongs_to_some_command():
    """A flag written on its own (`--jobs`, `--no-cgroups`) is an option of one of the commands the
    pages run (the grader's above all)."""
    helps = [help_of((sys.executable, "-m", "autograder", "grade", "--help"))]
    helps += [help_of(cmd) for _, _, cmd, _ in commands()] + [help_of(cmd) for cmd in makefile_commands()]
    known = "\n".join(h for h in helps if h)
    alone = {(page, FLAG.findall(ln)[0].split("=")[0]) for page, ln in all_code() if FLAG.match(ln)}
    missing = sorted((p, f) for p, f in alone
                     if not (is_trait(f) if is_trait(f) is not None else re.search(re.escape(f) + r"(?![\w-])", known)))
    assert not missing, f"flags the pages name that no command has: {missing}"
