"""Where the course is published: one setting, and the tool that makes every file follow it.

    python -m course.site                                        # print the setting
    python -m course.site --check                                # exit 1 if a file disagrees with it
    python -m course.site --base-url URL --repo OWNER/NAME       # change it; rewrite and regenerate

The setting is two keys of ``_config.yml``: ``html.baseurl`` (where the built book is served: the
chapters' links in the notebooks, the exercise pages' ``%pip install`` of the runtime's wheel) and
``repository.url`` (the GitHub repository: the book's repository button, the Colab and Binder
links, ``git clone``), with ``repository.branch``. The book reads them when it is built
(``book.build.launch_links``, ``book.build.runtime_install``); the files that name them as text
(the solutions' markdown links to the chapters, the intro's ``git clone``, the README and the
instructors' pages) are rewritten by this tool, and the generated ones (``exercises/`` and
``coursekit/released.json`` by :mod:`course.release`, ``tools/sample_class/`` by
:mod:`tools.sample_class`) are regenerated from them, never edited.

``--check`` reads every tracked text file and fails on a link to the course's site or repository
that is not the setting's: a page of the book (``.../chapters/*.html``), the runtime's wheel or the
student pack, any ``*.github.io`` address, and any ``github.com`` repository other than the
setting's and the few outside projects listed in :data:`OUTSIDE_REPOS`.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: generated from other files: regenerated after a rewrite, never rewritten themselves
GENERATED = ("exercises/", "tools/sample_class/", "coursekit/released.json")
#: folders whose links are examples, not the course's (the tests plant links to other sites)
NOT_SCANNED = ("tests/",)
#: files whose links are not the course's (references to papers and code)
SKIPPED_SUFFIXES = (".bib", ".png", ".jpg", ".svg", ".whl", ".zip", ".db", ".pdf", ".ico")
#: folders never scanned in a copy without git (what .gitignore keeps out)
UNTRACKED = {".git", ".venv", "_build", "node_modules", "__pycache__", ".jupyter_cache", ".mathjax", "_mathjax",
             ".pytest_cache", ".hypothesis", ".ipynb_checkpoints"}
#: github.com repositories a course file may link that are not the course's own
OUTSIDE_REPOS: frozenset[str] = frozenset()

#: an address written as a pattern for the reader to fill in, not a link
PLACEHOLDER = re.compile(r"\b(OWNER|NAME|USER)\b|//(www\.)?example\.(org|com|edu)\b")
URL = re.compile(r"https?://[^\s)\]\"'<>`\\]+")
GITHUB_REPO = re.compile(r"https?://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?(?=[/\s)\]\"'<>`\\#?]|$)")


@dataclass(frozen=True)
class Site:
    base_url: str  # ends with "/"
    repo: str  # "owner/name"
    branch: str = "main"

    @property
    def repo_url(self) -> str:
        return f"https://github.com/{self.repo}"


def _config_path(root: Path) -> Path:
    return Path(root) / "_config.yml"


def normalize_base_url(url: str) -> str:
    if not re.fullmatch(r"https://[^\s/]+(/[^\s]*)?", url):
        raise ValueError(f"the base URL must be an https:// address, not {url!r}")
    return url.rstrip("/") + "/"


def normalize_repo(repo: str) -> str:
    m = re.fullmatch(r"(?:https://github\.com/)?([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?", repo)
    if not m:
        raise ValueError(f"the repository must be OWNER/NAME (a GitHub repository), not {repo!r}")
    return f"{m.group(1)}/{m.group(2)}"


def load(root: Path = ROOT) -> Site:
    """The setting, read from ``_config.yml``."""
    import yaml

    cfg = yaml.safe_load(_config_path(root).read_text())
    repo = cfg["repository"]
    return Site(normalize_base_url(cfg["html"]["baseurl"]), normalize_repo(repo["url"]),
                str(repo.get("branch", "main")))


def tracked_files(root: Path = ROOT) -> list[str]:
    """The repository's text files as git lists them (tracked and not ignored), relative paths."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          cwd=root, capture_output=True, text=True)
    if proc.returncode == 0 and (Path(root) / ".git").exists():
        files = sorted({f for f in proc.stdout.split("\0") if f})
    else:  # a copy without git (tests): every file but build output and environments
        files = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*")
                       if p.is_file() and not set(p.relative_to(root).parts) & UNTRACKED)
    return [f for f in files if not f.endswith(SKIPPED_SUFFIXES) and not f.startswith(NOT_SCANNED)
            and (Path(root) / f).is_file()]


def _is_site_link(url: str) -> bool:
    host = url.split("/")[2].lower()
    path = "/" + "/".join(url.split("/")[3:])
    return (host.endswith(".github.io") or re.search(r"/chapters/[^/]+(/[^/]+)?\.html", path) is not None
            or re.search(r"/coursekit-[^/]*\.whl$|/student-pack\.zip$", path) is not None)


def disagreements(site: Site, root: Path = ROOT, files: list[str] | None = None) -> list[str]:
    """``path:line: url`` for every link to a course site or repository that is not ``site``'s."""
    found = []
    base = site.base_url.rstrip("/")
    for rel in tracked_files(root) if files is None else files:
        try:
            text = (Path(root) / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for url in URL.findall(line):
                url = url.rstrip(".,;:")
                if PLACEHOLDER.search(url):
                    continue
                if _is_site_link(url) and not (url == base or url.startswith(base + "/")):
                    found.append(f"{rel}:{n}: {url} (the site is {site.base_url})")
            for m in GITHUB_REPO.finditer(line):
                repo = f"{m.group(1)}/{m.group(2)}"
                if PLACEHOLDER.search(m.group(0)):
                    continue
                if repo != site.repo and repo not in OUTSIDE_REPOS:
                    found.append(f"{rel}:{n}: {m.group(0)} (the repository is {site.repo})")
    return found


def _replacements(old: Site, new: Site) -> list[tuple[re.Pattern, str]]:
    reps = []
    if old.base_url != new.base_url:
        reps.append((re.compile(re.escape(old.base_url.rstrip("/")) + r"(?![\w.-])"), new.base_url.rstrip("/")))
    if old.repo != new.repo:
        reps.append((re.compile(r"(?<=github\.com/)" + re.escape(old.repo) + r"(?![\w-])"), new.repo))
    return reps


def rewrite(new: Site, root: Path = ROOT) -> list[str]:
    """Set ``_config.yml`` to ``new`` and replace the old setting's links in every tracked text file
    that is not generated. Returns the files changed."""
    old = load(root)
    changed = []
    reps = _replacements(old, new)
    for rel in tracked_files(root):
        if rel.startswith(GENERATED):
            continue
        path = Path(root) / rel
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out = text
        for pat, repl in reps:
            out = pat.sub(repl, out)
        if rel == "_config.yml":
            out = re.sub(r"(?m)^(\s+branch:\s*).*$", lambda m: m.group(1) + new.branch, out, count=1)
        if out != text:
            path.write_text(out, encoding="utf-8")
            changed.append(rel)
    got = load(root)
    if got != new:
        raise RuntimeError(f"_config.yml says {got} after the rewrite, not {new}")
    return changed


def regenerate(root: Path = ROOT) -> None:
    """The generated files, from the rewritten sources: exercises/ and coursekit/released.json
    (what ``make exercises`` does) and the sample class (``python -m tools.sample_class``)."""
    from course import release
    from tools import sample_class

    with tempfile.TemporaryDirectory() as tmp:
        fresh = release.generate(Path(tmp), root)
        release.sync_tree(fresh, Path(root) / "exercises", check=False, stale="", done="regenerated exercises/")
        if Path(root).resolve() == ROOT:
            release.sync_released_cells(fresh, check=False)
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "sample_class"
        sample_class.build(dest, Path(root))
        release.sync_tree(dest, Path(root) / "tools" / "sample_class", check=False, stale="",
                          done="regenerated tools/sample_class/")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course.site", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", metavar="URL", help="where the book is served, e.g. https://OWNER.github.io/NAME/")
    ap.add_argument("--repo", metavar="OWNER/NAME", help="the course's GitHub repository")
    ap.add_argument("--branch", help="the repository's branch the launch links open (default: unchanged)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a file links another site or repository")
    ap.add_argument("--expect-base-url", metavar="URL",
                    help="with --check: also exit 1 unless the setting's base URL is URL (CI: GitHub Pages' address)")
    ap.add_argument("--no-regenerate", action="store_true",
                    help="rewrite the sources only; then run `make exercises` and `python -m tools.sample_class`")
    ap.add_argument("--get", choices=["base-url", "repo", "repo-url", "branch"], help="print one value of the setting")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # a copy of the course (tests)
    args = ap.parse_args(argv)
    root = args.root.resolve()
    site = load(root)
    if args.get:
        print({"base-url": site.base_url, "repo": site.repo, "repo-url": site.repo_url, "branch": site.branch}[args.get])
        return 0
    if args.base_url or args.repo or args.branch:
        if args.check:
            ap.error("--check does not change the setting: run it without --base-url/--repo/--branch")
        try:
            new = Site(normalize_base_url(args.base_url) if args.base_url else site.base_url,
                       normalize_repo(args.repo) if args.repo else site.repo, args.branch or site.branch)
        except ValueError as e:
            ap.error(str(e))
        changed = rewrite(new, root)
        print(f"set the site to {new.base_url} and the repository to {new.repo} ({new.branch}); "
              f"rewrote {len(changed)} files: {', '.join(changed) or 'none'}")
        if not args.no_regenerate:
            regenerate(root)
        site = new
    if args.check or args.expect_base_url:
        bad = disagreements(site, root)
        if args.expect_base_url and normalize_base_url(args.expect_base_url) != site.base_url:
            bad.insert(0, f"_config.yml: html.baseurl is {site.base_url}, but the site is served at "
                          f"{normalize_base_url(args.expect_base_url)}: run python -m course.site --base-url "
                          f"{normalize_base_url(args.expect_base_url)} --repo {site.repo}")
        if bad:
            print(f"{len(bad)} links disagree with the setting (_config.yml: {site.base_url}, {site.repo}); "
                  "run python -m course.site --base-url URL --repo OWNER/NAME:")
            print("\n".join(f"  {b}" for b in bad[:50]))
            return 1
        print(f"every link follows the setting: {site.base_url}, {site.repo_url}")
        return 0
    if not (args.base_url or args.repo or args.branch):
        print(f"base URL:   {site.base_url}\nrepository: {site.repo_url} (branch {site.branch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
