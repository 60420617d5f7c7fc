"""Execute the book's pages two at a time, into Jupyter Book's cache, before Jupyter Book runs.

Jupyter Book 1.x (myst-nb with ``execute_notebooks: cache``) executes the pages one after
another. Running the pages on both cores of a 2-core machine, longest first, halves the build's
execution time (:func:`prefetch`).

Nothing here decides what the book shows. A page is read into a notebook the way myst-nb reads it
(:func:`read`), executed the way myst-nb's cache mode executes it (jupyter-cache's
``single_nb_execution``, in the page's folder, with the page's own timeout), and stored under the
same key (jupyter-cache hashes the code cells and the kernelspec): Jupyter Book then finds the
page in the cache and does not run it again. A page whose key does not match, or whose run
failed here, is simply executed by Jupyter Book as before, which reports its errors: the
prefetch only ever saves time.
"""
from __future__ import annotations

import functools
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"
#: pages Jupyter Book executes: the toc's files under these folders
FOLDERS = ("chapters", "docs")
#: seconds the longest pages took to execute on this machine (2026-11-28, two at a time): only the
#: order of the prefetch depends on them (longest first), never what a page shows; a page missing
#: here is ordered by its earlier run in the cache, else by its length. Chapter 09 reads its
#: character-model runs from a record (book/experiments/charlm_grid.py) and takes 14 s.
SLOW = {"chapters/12_streams.md": 164, "chapters/05b_in_practice.md": 139,
        "chapters/11b_block_variants.md": 121, "chapters/11_beyond.md": 81,
        "chapters/02_residual.md": 33, "chapters/01_depth.md": 26}


@functools.lru_cache(maxsize=1)
def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def pages() -> list[Path]:
    """The toc's pages that are MyST Markdown notebooks."""
    from myst_nb.core.read import is_myst_markdown_notebook

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(toc.get("parts", []))
    out = []
    for f in files:
        p = ROOT / f"{f}.md"
        if p.is_file() and p.parts[len(ROOT.parts)] in FOLDERS and is_myst_markdown_notebook(p.read_text()):
            out.append(p)
    return out


def read(path: Path):
    """The page as myst-nb reads it for execution (the same notebook, so the same cache key)."""
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    exts = _config().get("parse", {}).get("myst_enable_extensions", [])
    return read_myst_markdown_notebook(path.read_text(), MdParserConfig(enable_extensions=set(exts)),
                                       add_source_map=True, path=str(path))


def _timeout(nb) -> int:
    """The page's own execution timeout (``mystnb: execution_timeout``), else the book's."""
    own = (nb.metadata.get("mystnb") or {}).get("execution_timeout")
    return int(own or _config().get("execute", {}).get("timeout", 600))


def _execute(path: str):
    """In a worker process: (path, the executed notebook or None, seconds, error text)."""
    from jupyter_cache.executors.utils import single_nb_execution

    from book.local_kernels import use_local_sockets

    p = Path(path)
    nb = read(p)
    with tempfile.TemporaryDirectory(prefix="book-kernels-") as folder:  # this worker's own sockets
        use_local_sockets(folder)
        res = single_nb_execution(nb, cwd=str(p.parent), allow_errors=False, timeout=_timeout(nb),
                                  meta_override=True)
    if res.err is not None:
        return path, None, res.time, f"{type(res.err).__name__}: {str(res.err)[:300]}"
    return path, nb, res.time, None


def _hint(cache, path: Path) -> float:
    """How long the page takes: :data:`SLOW`, else its last run in the cache, else its length as a guess."""
    rel = path.relative_to(ROOT).as_posix()
    if rel in SLOW:
        return float(SLOW[rel])
    best = None
    for rec in cache.list_cache_records():
        if rec.uri == str(path):
            best = rec.data.get("execution_seconds", best)
    return float(best) if best is not None else len(path.read_text()) / 1000


def prefetch(jobs: int = 2) -> int:
    """Execute every page missing from the cache, ``jobs`` at a time, longest first; the number of
    pages stored. Never raises for a page: a page that fails here is left to Jupyter Book."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(CACHE))
    todo = []
    for p in pages():
        try:
            cache.match_cache_notebook(read(p))
        except KeyError:
            todo.append(p)
    if len(todo) < 2:
        return 0  # nothing to gain from a second core
    todo.sort(key=lambda p: -_hint(cache, p))
    t0, stored = time.monotonic(), 0
    print(f"book.prefetch: executing {len(todo)} pages, {jobs} at a time", flush=True)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_execute, str(p)) for p in todo]
        for f in as_completed(futures):
            try:
                path, nb, seconds, err = f.result()
            except Exception as e:  # noqa: BLE001 -- a worker that died: Jupyter Book runs the page
                print(f"book.prefetch: a page could not be run here ({type(e).__name__}); Jupyter Book will",
                      flush=True)
                continue
            rel = Path(path).relative_to(ROOT)
            if err:
                print(f"book.prefetch: {rel} failed here ({err}); Jupyter Book will run it and report", flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(nb, path, data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            stored += 1
            print(f"book.prefetch: {rel} executed in {seconds:.1f} s", flush=True)
    print(f"book.prefetch: {stored} of {len(todo)} pages in {time.monotonic() - t0:.1f} s", flush=True)
    return stored


if __name__ == "__main__":
    prefetch()
