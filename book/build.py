"""Build the course book: ``python -m book.build build`` (what ``make book`` runs).

1. MathJax 3 comes from the npm registry (``npm install --prefix .mathjax mathjax@3``), and only
   the files a page uses are copied into ``_mathjax/mathjax/`` (both folders are git-ignored;
   Sphinx serves ``_mathjax/`` as a static path, so the site has ``_static/mathjax/``):
   the ``tex-chtml.js`` bundle, its woff-v2 fonts and the TeX extensions its autoloader may
   fetch. ``_config.yml`` points Sphinx's ``mathjax_path`` there, so no page asks a CDN.
2. The recorded experiments (``book/results/*.json``, written by ``make experiments``) are
   checked against today's code (:func:`book.experiments.recorded.check_pages`): a stale or
   missing record, or a page pinning an older record, fails the build with the command to run.
3. The pages missing from the execution cache run two at a time, longest first, into that cache
   (:mod:`book.prefetch`): jupyter-book executes pages one after another.
4. ``jupyter-book build . --warningiserror --keep-going`` (through :mod:`book.local_kernels`, so
   the chapters' kernels use local sockets, not TCP): every Sphinx warning fails the build,
   all of them are reported. Chapter results are cached (``execute_notebooks: cache``), so a
   rebuild with nothing changed runs no code.
5. While it reads the pages, the Sphinx extension :mod:`book.progress` (loaded by ``_config.yml``)
   prints one line per notebook page as it finishes, with its seconds:
   ``book: [ 9/30] chapters/09_real_models: executed in 303.0 s``.

Exit status: 0 when the book built without a warning, non-zero otherwise.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATHJAX_VERSION = "3.2.2"
NPM_PREFIX = ROOT / ".mathjax"
MATHJAX_PKG = NPM_PREFIX / "node_modules" / "mathjax"
# Not under _static/: Jupyter Book adds every .js file found there to every page.
STATIC_MATHJAX = ROOT / "_mathjax" / "mathjax"
HTML = ROOT / "_build" / "html"

# What tex-chtml.js loads, relative to its own folder (MathJax's "[mathjax]" path).
MATHJAX_FILES = ["es5/tex-chtml.js"]
MATHJAX_DIRS = ["es5/output/chtml/fonts/woff-v2", "es5/input/tex/extensions"]

# Sphinx's default MathJax URL; a built page must never contain it.
CDN_PATTERN = re.compile(r"cdn\.jsdelivr\.net/npm/mathjax|mathjax@3/es5")


def _installed_version() -> str | None:
    pkg = MATHJAX_PKG / "package.json"
    if not pkg.exists():
        return None
    m = re.search(r'"version"\s*:\s*"([^"]+)"', pkg.read_text())
    return m.group(1) if m else None


def ensure_mathjax() -> None:
    """Install MathJax from npm if missing and copy what the pages need into _static/mathjax."""
    if _installed_version() != MATHJAX_VERSION:
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("book.build: npm not found; install Node.js/npm (Debian: apt-get install npm) "
                     "so MathJax can be installed from the npm registry")
        print(f"book.build: npm install mathjax@{MATHJAX_VERSION} into {NPM_PREFIX.name}/", flush=True)
        NPM_PREFIX.mkdir(exist_ok=True)
        subprocess.run([npm, "install", "--prefix", str(NPM_PREFIX), "--no-audit", "--no-fund",
                        "--no-save", "--loglevel=error", f"mathjax@{MATHJAX_VERSION}"], check=True)
    stamp = STATIC_MATHJAX / ".version"
    if stamp.exists() and stamp.read_text() == MATHJAX_VERSION:
        return
    if STATIC_MATHJAX.exists():
        shutil.rmtree(STATIC_MATHJAX)
    for rel in MATHJAX_FILES:
        dst = STATIC_MATHJAX / Path(rel).relative_to("es5")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(MATHJAX_PKG / rel, dst)
    for rel in MATHJAX_DIRS:
        shutil.copytree(MATHJAX_PKG / rel, STATIC_MATHJAX / Path(rel).relative_to("es5"))
    shutil.copy2(MATHJAX_PKG / "LICENSE", STATIC_MATHJAX / "LICENSE")
    stamp.write_text(MATHJAX_VERSION)


def check_no_cdn(html_dir: Path = HTML) -> list[str]:
    """Built pages that still mention Sphinx's default MathJax CDN URL."""
    return [str(p.relative_to(html_dir)) for p in html_dir.rglob("*.html")
            if CDN_PATTERN.search(p.read_text(encoding="utf-8", errors="replace"))]


def build(all_pages: bool = False) -> int:
    # the recorded long experiments (book/experiments/recorded.py) must be today's code's, and the
    # pages must pin them as they are: checked here, since a page served from the execution cache
    # would not run its own check
    from book.experiments import recorded
    try:
        recorded.check_pages()
    except recorded.StaleResults as e:
        print(f"book.build: the recorded experiments are stale, so the book would show results of "
              f"other code:\n{e}", file=sys.stderr)
        return 1
    ensure_mathjax()
    # Sphinx re-reads only changed pages, so a warning from an unchanged page would not come
    # back on the next build and that build would pass. After a failed build, re-read every
    # page (notebook results still come from the cache, so this costs seconds, not minutes).
    failed_marker = ROOT / "_build" / ".last-build-failed"
    if failed_marker.exists():
        all_pages = True
    # the pages missing from the cache, two at a time (book/prefetch.py): jupyter-book then finds
    # them there; a page that fails in the prefetch is run and reported by jupyter-book itself
    try:
        from book.prefetch import prefetch
        prefetch()
    except Exception as e:  # noqa: BLE001 -- only ever a saving: jupyter-book runs what is missing
        print(f"book.build: the prefetch stopped ({type(e).__name__}: {e}); jupyter-book runs every page",
              flush=True)
    # jupyter-book itself, with the chapters' kernels on local sockets (book/local_kernels.py)
    cmd = [sys.executable, "-m", "book.local_kernels", "build", str(ROOT),
           "--warningiserror", "--keep-going"]
    if all_pages:
        cmd.append("--all")
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    print(f"book.build: jupyter-book finished in {time.monotonic() - t0:.1f} s (exit {rc})", flush=True)
    if rc == 0:
        bad = check_no_cdn()
        if bad:
            print(f"book.build: pages still reference the MathJax CDN: {bad}", file=sys.stderr)
            rc = 1
    else:
        print("book.build: the build failed or had warnings (they are errors here); see above",
              file=sys.stderr)
    if rc != 0:
        failed_marker.parent.mkdir(parents=True, exist_ok=True)
        failed_marker.write_text("the last build failed: the next one re-reads every page\n")
    else:
        failed_marker.unlink(missing_ok=True)
    return rc


def tests_table(notebook: str | Path) -> str:
    """A Markdown table of a student notebook's graded test cells, for the exercise pages.

    Read from the notebook itself when the book is built, so the page always lists what the
    notebook tests: grade id, points, the cell's one-line docstring, and whether the test is
    visible in the notebook or hidden (run only when the submission is graded).
    """
    import ast
    import json

    from course import cells

    nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
    rows, total = [], 0.0
    for cell in nb["cells"]:
        if cells.role(cell) != "test":
            continue
        src = cells.source(cell)
        try:
            doc = ast.get_docstring(ast.parse(src)) or ""
        except SyntaxError:
            doc = ""
        visible = "run(" in src
        points = cells.points(cell)
        total += points
        doc = doc.strip().replace("|", "\\|") or "-"
        rows.append(f"| `{cells.grade_id(cell) or '?'}` | {points:g} | {doc} | "
                    f"{'in the notebook' if visible else 'hidden, at grading'} |")
    head = ["| test (grade id) | points | what it checks | when it runs |", "|---|---|---|---|"]
    return "\n".join(head + rows + [f"| **total** | **{total:g}** | | |"])


def launch_links(notebook: str, config: Path = ROOT / "_config.yml") -> str:
    """Markdown links that open an exercise notebook itself in Colab and in Binder (JupyterLab).

    Built from one setting, ``repository.url`` (and ``repository.branch``) in ``_config.yml``:
    ``notebook`` is the notebook's path in that repository (``exercises/01_layernorm/layernorm.ipynb``).
    The theme's own launch buttons would open the page's ``.md`` source, which Colab cannot open,
    so the book turns them off and the exercise pages carry these links instead.
    """
    import yaml

    repo = yaml.safe_load(Path(config).read_text())["repository"]
    url, branch = repo["url"].rstrip("/"), repo.get("branch", "main")
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url)
    if not m:
        raise ValueError(f"_config.yml repository.url must be a GitHub repository URL, not {url!r}")
    org, name = m.groups()
    colab = f"https://colab.research.google.com/github/{org}/{name}/blob/{branch}/{notebook}"
    binder = f"https://mybinder.org/v2/gh/{org}/{name}/{branch}?labpath={notebook}"
    return f"[Open in Colab]({colab}) · [Open in Binder (JupyterLab)]({binder})"


def runtime_install(config: Path = ROOT / "_config.yml") -> str:
    """Markdown: how to install the notebooks' runtime (``coursekit``) locally and in Colab.

    The wheel is published at the book's root (``html.baseurl`` in ``_config.yml``), where
    ``make student-pack`` leaves it for the build (``html_extra_path``).
    """
    import yaml

    from course.pack import PIP_LINE, PIP_LINE_QUICK, WHEEL

    base = yaml.safe_load(Path(config).read_text())["html"]["baseurl"].rstrip("/")
    return (f"In a fresh Python, in the unzipped student pack's folder:\n\n```bash\n{PIP_LINE}\n```\n\n"
            f"Where PyTorch's index is blocked, pip retries it silently for ten minutes and more: if the line "
            f"seems stuck, stop it and run this one, which gives up on that index after a few minutes of 'WARNING: Retrying' lines (one or two per package) and takes "
            f"PyTorch from PyPI:\n\n```bash\n{PIP_LINE_QUICK}\n```\n\n"
            f"In Colab (or any hosted notebook), run this in the notebook's first cell, then restart "
            f"the runtime:\n\n```\n%pip install {base}/{WHEEL}\n```")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m book.build", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build _build/html (warnings are errors)")
    b.add_argument("--all", action="store_true", help="rebuild every page, not only changed ones")
    sub.add_parser("mathjax", help="only install and copy MathJax")
    args = ap.parse_args(argv)
    if args.cmd == "mathjax":
        ensure_mathjax()
        return 0
    return build(all_pages=args.all)


if __name__ == "__main__":
    sys.exit(main())
