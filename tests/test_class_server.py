"""A class on one server, end to end in a real browser (class_server, README "Run a class").

``python -m class_server up`` with a roster of an instructor and two students, on 127.0.0.1:
JupyterHub as root (PAM logins against real unix accounts made for this test, removed at the end),
configurable-http-proxy from npm, one server per user running as that user. Then, as a class would:

1. the instructor generates 01_layernorm (nbgrader's command, as the instructor's unix user) and
   releases it from the formgrader;
2. each student logs in in headless Chromium and fetches it in JupyterLab's Assignments tab; alice
   puts the reference answers in her copy and submits, bob submits the release as fetched, then
   runs its setup cell (torch, coursekit) in his kernel, the class's Python;
3. the instructor collects and grades with the course grader (``python -m autograder grade``, into
   the course's gradebook and autograded/), and sees alice 15/15 and bob 0/15 in the formgrader;
4. the instructor generates feedback and releases it from the formgrader; each student fetches it
   in the Assignments tab and gets their own (on disk: in their home only; in the browser: their
   score);
5. bob cannot read alice's home, her submission in the exchange, the exchange's listings, the
   course (solutions/, gradebook.db), this checkout's solutions/ and hidden checks, nor open
   alice's files or the formgrader in the browser.

Everything is stopped at the end, failure or not (``class_server down --remove-users --purge``):
the hub, the proxy, every process of the test's users, the users, the class's folder. Screenshots
of each step: _build/artifacts/hub/.
"""
from __future__ import annotations

import csv
import json
import os
import pwd
import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import chrome

from course.release import venv_env
from tools.fixture_class import solved_dict

ROOT = Path(__file__).resolve().parent.parent
ART = ROOT / "_build" / "artifacts" / "hub"
A, NB = "01_layernorm", "layernorm"
BUDGET = 420  # seconds for the whole class (3 to 4 minutes measured on 2 busy cores); every wait is bounded by what is left


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def driver():
    d = chrome(width=1400, height=900, page_load_timeout=120)
    try:
        yield d
    finally:
        d.quit()


def test_roster_reads_nbgraders_columns_and_a_role(tmp_path):
    from class_server.server import ClassError, read_roster

    f = tmp_path / "roster.csv"
    f.write_text("id,first_name,last_name,email,role\nada,Ada,L,ada@x.org,instructor\nbo,Bo,B,,\n")
    assert [(p["id"], p["role"]) for p in read_roster(f)] == [("ada", "instructor"), ("bo", "student")]
    for bad, why in (("id,first_name\nbo,Bo\n", "no instructor"), ("id,role\nAda,instructor\n", "unix user name"),
                     ("id,role\nada,instructor\nada,student\n", "twice"), ("id,role\nada,teacher\n", "role must"),
                     ("name\nada\n", "header")):
        f.write_text(bad)
        with pytest.raises(ClassError, match=why):
            read_roster(f)


@pytest.mark.hub
@pytest.mark.slow
def test_a_class_on_one_server(tmp_path, driver):
    from class_server import server

    if os.geteuid() != 0:
        pytest.skip("the class server creates unix accounts and runs each user's server as that user: run as root")
    if not server.PROXY.exists():
        pytest.fail(f"{server.PROXY} is missing: `make class-server-deps` installs configurable-http-proxy from npm",
                    pytrace=False)
    ART.mkdir(parents=True, exist_ok=True)
    for old in ART.glob("*.png"):
        old.unlink()
    tag = secrets.token_hex(2)
    teach, alice, bob = (f"rnh{tag}_{n}" for n in ("teach", "alice", "bob"))
    roster = tmp_path / "roster.csv"
    roster.write_text("id,first_name,last_name,email,role\n"
                      f"{teach},Ada,Teacher,,instructor\n{alice},Alice,Able,,student\n{bob},Bob,Baker,,student\n")
    class_dir = Path(f"/srv/rnh{tag}-class")
    checkout_mode = stat.S_IMODE(ROOT.stat().st_mode)
    start = time.monotonic()
    hub_pid = None

    def cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
        """The commands `make class-server` and `make class-server-stop` run."""
        return subprocess.run([sys.executable, "-m", "class_server", *args, "--dir", str(class_dir)],
                              capture_output=True, text=True, env=venv_env(), cwd=ROOT, timeout=timeout)

    try:
        up = cli("up", str(roster), "--port", str(_free_port()), "--group", f"rnh{tag}-instructors", timeout=200)
        pid_file = class_dir / "hub" / "up.pid"
        hub_pid = int(pid_file.read_text()) if pid_file.exists() else None
        assert up.returncode == 0, up.stderr[-3000:]
        info = dict(json.loads((class_dir / "hub" / "class.json").read_text()), url=up.stdout.strip())
        assert info["url"] == f"http://127.0.0.1:{info['port']}"
        _class(driver, info, class_dir, teach, alice, bob, start)
    finally:
        os.chmod(ROOT, checkout_mode)  # `up` locked this checkout; the test gives it its mode back
        uids = [pwd.getpwnam(u).pw_uid for u in (teach, alice, bob) if server.user_exists(u)]
        down = cli("down", "--remove-users", "--purge", timeout=90)
        assert down.returncode == 0, down.stderr[-3000:]
        server.remove_accounts([u for u in (teach, alice, bob) if server.user_exists(u)], None)  # if `up` failed early
        subprocess.run(["groupdel", f"rnh{tag}-instructors"], capture_output=True)
        assert not server.user_pids(set(uids)), "processes of the class's users survived `down`"
        if hub_pid is not None:  # the hub, the proxy and whatever else the hub started
            assert not server.group_pids(hub_pid), "processes of the hub survived `down`"
        assert not any(server.user_exists(u) for u in (teach, alice, bob)) and not class_dir.exists()
    assert time.monotonic() - start < BUDGET + 60


def _class(d, info, class_dir: Path, teach: str, alice: str, bob: str, start: float) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from class_server.server import as_user

    url, course, exchange = info["url"], Path(info["course"]), Path(info["exchange"])
    passwords = {r["id"]: r["password"] for r in csv.DictReader(open(class_dir / "passwords.csv"))}
    step = iter(range(1, 100))

    def left() -> float:
        remaining = BUDGET - (time.monotonic() - start)
        assert remaining > 0, f"the class took more than {BUDGET} s"
        return remaining

    def wait(cond, what: str, limit: float = 120):
        try:
            return WebDriverWait(d, min(limit, left())).until(cond)
        except Exception:
            shot(f"FAILED-{what}")
            raise AssertionError(f"timed out: {what}; page text:\n{d.find_element(By.TAG_NAME, 'body').text[-2000:]}")

    def shot(name: str) -> None:
        d.save_screenshot(str(ART / f"{next(step):02d}_{name}.png"))

    def sh(user: str, *argv: str, cwd: Path | None = None, ok: bool = True):
        proc = as_user(user, list(argv), class_dir, cwd=cwd, timeout=min(300, left()))
        if ok:
            assert proc.returncode == 0, f"{user}: {' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def login(user: str) -> None:
        d.get(f"{url}/hub/logout")
        d.delete_all_cookies()
        d.get(f"{url}/hub/login")
        wait(lambda d: d.find_elements(By.ID, "username_input"), "login page")
        d.find_element(By.ID, "username_input").send_keys(user)
        d.find_element(By.ID, "password_input").send_keys(passwords[user])
        shot(f"{user.split('_')[1]}_login")
        d.find_element(By.ID, "login_submit").click()
        wait(lambda d: f"/user/{user}/lab" in d.current_url and d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item"),
             f"{user}'s JupyterLab", limit=180)

    def open_assignments() -> None:
        def nbgrader_menu(d):
            for it in d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item"):
                if it.text.strip() == "Nbgrader":
                    return it
        wait(nbgrader_menu, "the Nbgrader menu").click()

        def item(d):
            for it in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-item"):
                if it.text.strip().startswith("Assignment List"):
                    return it
        entry = wait(item, "Nbgrader > Assignment List")
        labels = [it.text.strip() for it in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-item") if it.is_displayed()]
        assert not any(x.startswith("Formgrader") for x in labels), labels  # students have no formgrader
        entry.click()
        wait(lambda d: d.find_elements(By.ID, "nbgrader-assignment-list"), "the Assignments tab")

    def section(name: str) -> str:
        els = d.find_elements(By.ID, name)
        return els[0].text if els else ""

    def click_in(list_id: str, label: str, what: str) -> None:
        def button(d):
            for b in d.find_elements(By.CSS_SELECTOR, f"#{list_id} button"):
                if b.text.strip() == label and b.is_enabled():
                    return b
        wait(button, what).click()

    def formgrader_button(cell: str, done: str) -> None:
        """Click an assignment's button on the formgrader's Manage Assignments page."""
        d.get(f"{url}/user/{teach}/formgrader/manage_assignments")
        def button(d):
            for tr in d.find_elements(By.CSS_SELECTOR, "#main-table tr"):
                if tr.text.startswith(A):
                    return next(iter(tr.find_elements(By.CSS_SELECTOR, f"td.{cell} a")), None)
        wait(button, f"the formgrader's {cell} button for {A}").click()
        wait(lambda d: done in d.find_element(By.TAG_NAME, "body").text, f"the formgrader saying {done!r}")
        shot(f"teach_formgrader_{cell.replace('-', '_')}")

    # 1. The instructor generates the assignment (a terminal in the instructor's JupyterLab runs these
    #    commands in the course, as the instructor) and releases it from the formgrader.
    sh(teach, "nbgrader", "generate_assignment", A, cwd=course)
    login(teach)
    formgrader_button("release", f"Successfully released '{A}'")
    assert (exchange / "resnorm" / "outbound" / A / f"{NB}.ipynb").is_file()

    # 2. Each student logs in, fetches it in the Assignments tab and submits.
    for s in (alice, bob):
        login(s)
        open_assignments()
        wait(lambda d: A in section("released_assignments_list"), "the released assignment listed")
        shot(f"{s.split('_')[1]}_assignments_released")
        click_in("released_assignments_list", "Fetch", "the Fetch button")
        wait(lambda d: A in section("fetched_assignments_list"), "the fetched assignment listed")
        fetched = Path(pwd.getpwnam(s).pw_dir) / A / f"{NB}.ipynb"
        assert fetched.is_file() and fetched.stat().st_uid == pwd.getpwnam(s).pw_uid
        assert fetched.read_bytes() == (course / "exercises" / A / f"{NB}.ipynb").read_bytes()
        if s == alice:  # she works on it: the reference answers, written as her
            proc = as_user(s, ["sh", "-c", f"cat > {A}/{NB}.ipynb"], class_dir, cwd=fetched.parent.parent,
                           input=json.dumps(solved_dict(A)))
            assert proc.returncode == 0, proc.stderr
        shot(f"{s.split('_')[1]}_fetched")
        click_in("fetched_assignments_list", "Submit", "the Submit button")
        wait(lambda d: A in section("submitted_assignments_list"), "the submission listed")
        shot(f"{s.split('_')[1]}_submitted")
        if s == bob:  # his kernel is the class's Python: the setup cell imports torch and coursekit
            d.get(f"{url}/user/{s}/lab/tree/{A}/{NB}.ipynb")
            wait(lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell .cm-content"), "the notebook")
            wait(lambda d: "Idle" in d.find_element(By.ID, "jp-main-statusbar").text, "the kernel", limit=120)
            d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell .cm-content")[0].click()
            ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
            first = lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell")[0]  # noqa: E731
            wait(lambda d: "[1]" in first(d).find_element(By.CSS_SELECTOR, ".jp-InputPrompt").text, "the setup cell",
                 limit=120)
            shot(f"{s.split('_')[1]}_kernel_ran_the_setup_cell")
            assert not first(d).find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"), first(d).text

    inbound = exchange / "resnorm" / "inbound"
    subs = {p.name.split("+")[0]: p for p in inbound.iterdir()}
    assert sorted(subs) == sorted([alice, bob])
    for s, p in subs.items():  # each submission: the student's, readable by the instructors only
        assert p.stat().st_uid == pwd.getpwnam(s).pw_uid and p.stat().st_gid == course.stat().st_gid
        assert stat.S_IMODE(p.stat().st_mode) & 0o007 == 0 and stat.S_IMODE(p.stat().st_mode) == 0o770

    # 3. The instructor collects and grades with the course grader, into the course.
    sh(teach, "nbgrader", "collect", A, cwd=course)
    g = sh(teach, "python", "-m", "autograder", "grade", "submitted", "--out", "grades", "--assignment", A,
           "--jobs", "2", "--no-progress", "--no-cgroups", cwd=course)  # not root: README, Run a class
    assert "nbgrader course" in g.stderr, g.stderr[-2000:]
    rows = {r["student_id"]: r for r in csv.DictReader(open(course / "grades" / "grades.csv"))}
    assert float(rows[alice]["score"]) == float(rows[alice]["max_score"]) == 15.0, rows[alice]
    assert float(rows[bob]["score"]) == 0.0, rows[bob]
    assert rows[alice]["review"] == "" and rows[bob]["review"] == ""  # nothing flagged to review
    for s in (alice, bob):
        assert (course / "autograded" / s / A / f"{NB}.ipynb").is_file()

    login(teach)
    shot("teach_lab")
    d.get(f"{url}/user/{teach}/formgrader/manage_assignments")
    wait(lambda d: A in d.find_element(By.ID, "main-table").text, "the formgrader's assignments")
    shot("teach_formgrader_assignments")
    d.get(f"{url}/user/{teach}/files/grades/report.html")
    wait(lambda d: alice in d.find_element(By.TAG_NAME, "body").text, "the grader's class report")
    shot("teach_grader_report")
    d.get(f"{url}/user/{teach}/formgrader/manage_submissions/{A}")
    wait(lambda d: bob in d.find_element(By.ID, "main-table").text
         and "Loading" not in d.find_element(By.ID, "main-table").text, "the formgrader's submissions")
    table = {}
    for tr in d.find_elements(By.CSS_SELECTOR, "#main-table tr"):
        cells = [td.text.strip() for td in tr.find_elements(By.TAG_NAME, "td")]
        for who in (alice, bob):
            if who in cells:
                table[who] = cells
    shot("teach_formgrader_submissions")
    assert sorted(table) == sorted([alice, bob]), table
    assert "15 / 15" in table[alice] and "graded" in table[alice], table[alice]
    assert "0 / 15" in table[bob] and "graded" in table[bob], table[bob]
    assert any("Able" in c for c in table[alice]), table[alice]  # the roster's names

    # 4. Feedback: generated, released, fetched by each student in the Assignments tab.
    sh(teach, "nbgrader", "generate_feedback", "--force", A, cwd=course)
    formgrader_button("release-feedback", f"Successfully released feedback of '{A}'")
    assert len(list((exchange / "resnorm" / "feedback").iterdir())) == 2
    export = sh(teach, "nbgrader", "export", "--to=export.csv", cwd=course)
    assert export.returncode == 0
    final = {r["student_id"]: float(r["score"]) for r in csv.DictReader(open(course / "export.csv"))}
    assert final == {alice: 15.0, bob: 0.0}

    feedback = {}
    for s, score in ((alice, 15.0), (bob, 0.0)):
        login(s)
        open_assignments()
        click_in("submitted_assignments_list", "Fetch Feedback", "the Fetch Feedback button")
        wait(lambda d: "view feedback" in section("submitted_assignments_list"), "the feedback fetched")
        shot(f"{s.split('_')[1]}_feedback_fetched")
        home = Path(pwd.getpwnam(s).pw_dir)
        pages = list((home / A / "feedback").rglob(f"{NB}.html"))
        assert len(pages) == 1, pages
        assert f"(Score: {score:.1f} / 15.0)" in pages[0].read_text()
        assert pages[0].read_bytes() == (course / "feedback" / s / A / f"{NB}.html").read_bytes()  # theirs
        rel = feedback[s] = pages[0].relative_to(home)
        d.get(f"{url}/user/{s}/files/{rel}")
        wait(lambda d: "Score:" in d.find_element(By.TAG_NAME, "body").text, "the feedback page")
        assert f"(Score: {score:.1f} / 15.0)" in d.find_element(By.TAG_NAME, "body").text
        shot(f"{s.split('_')[1]}_feedback_page")
        other = bob if s == alice else alice
        # the other student's server (their files, their feedback) is not theirs to open: the hub refuses
        theirs = f"{A}/{NB}.ipynb" if s == alice else str(feedback[alice])
        d.get(f"{url}/user/{other}/files/{theirs}")
        wait(lambda d: "403" in d.find_element(By.TAG_NAME, "body").text, f"the hub refusing {s} {other}'s files")
        shot(f"{s.split('_')[1]}_opens_{other.split('_')[1]}s_files")
        d.get(f"{url}/user/{s}/formgrader")
        wait(lambda d: "404" in d.find_element(By.TAG_NAME, "body").text, f"no formgrader for {s}")
        shot(f"{s.split('_')[1]}_has_no_formgrader")
    for s in (alice, bob):  # on disk: each home holds its own feedback, and only that
        other = bob if s == alice else alice
        text = "".join(p.read_text() for p in (Path(pwd.getpwnam(s).pw_dir)).rglob("*.html"))
        assert ("passed layernorm_matches_torch" in text) == (s == alice)
        assert other not in text

    # 5. What a student cannot read.
    alice_sub = subs[alice]
    for target in (Path(pwd.getpwnam(alice).pw_dir), Path(pwd.getpwnam(alice).pw_dir) / A / f"{NB}.ipynb",
                   inbound, alice_sub, alice_sub / f"{NB}.ipynb", alice_sub / "submission_secret.txt",
                   exchange / "resnorm" / "feedback", course, course / "solutions" / A / f"{NB}.ipynb",
                   course / "gradebook.db", course / "submitted" / alice / A / f"{NB}.ipynb",
                   course / "course" / "hidden", ROOT / "solutions" / A / f"{NB}.ipynb", ROOT / "course" / "hidden"):
        proc = sh(bob, "sh", "-c", 'if [ -d "$1" ]; then ls "$1"; else cat "$1"; fi', "-", str(target), ok=False)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (target, proc.stdout[:300], proc.stderr)
    proc = sh(bob, "python", "-c", "import course.hidden", ok=False)
    assert proc.returncode != 0
    proc = sh(bob, "python", "-c", "import coursekit, torch; print(coursekit.__file__)")  # the student pack's runtime
    assert proc.stdout.startswith(str(class_dir / "venv"))
