"""A class on one server, end to end in a real browser (class_server, docs/class_server.md, "Run a class").

``python -m class_server up`` with a roster of an instructor and two students, on 127.0.0.1:
JupyterHub as root (PAM logins against real unix accounts made for this test, removed at the end),
configurable-http-proxy from npm, one server per user running as that user. Then, as a class would:

1. the instructor generates 01_layernorm (nbgrader's command, as the instructor's unix user) and
   releases it from the formgrader;
2. each student logs in in headless Chromium and fetches it in JupyterLab's Assignments tab; alice
   puts the reference answers in her copy and submits, bob submits the release as fetched, then
   runs its setup cell (torch, coursekit) in his kernel, the class's Python;
3. the instructor collects and grades with the course grader (``python -m autograder grade``, into
   the course's gradebook and autograded/), and sees alice with full marks and bob with 0 in the formgrader;
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
import datetime
import json
import os
import pwd
import re
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


def _full() -> float:
    """Exercise 01's points in the release (every test cell's), whatever the release holds today."""
    from autograder.grade import Course
    from course.release import ROOT
    return float(sum(t.points for t in Course(ROOT).tests(A)))
BUDGET = 900  # seconds for the whole class, every wait bounded by what is left: a bound on a hang, not a
# measure of speed (3 to 4 minutes alone on 2 busy cores; 420 s ran out by 3 s beside another test file under
# make test's two at a time)


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


def test_an_error_quoting_a_users_output_reaches_roots_terminal_without_escape_sequences(capsys, monkeypatch):
    """`up` runs an instructor's nbgrader_config.py and quotes its output when it fails: escape
    sequences in it (a title, OSC 52 to the clipboard, C1 controls) are written out, not sent."""
    import class_server.__main__ as cli
    from class_server.server import ClassError

    def fails(*a, **k):
        raise ClassError("nbgrader db student import failed:\x1b]52;c;aGk=\x07\x1b[2J\x9b21t\nsecond line")

    monkeypatch.setattr(cli, "down", fails)
    assert cli.main(["down", "--dir", "/nonexistent-class"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err and "\x07" not in err, repr(err)
    assert "\\x1b]52;c;aGk=" in err and "\nsecond line" in err, repr(err)


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


def test_a_roster_naming_a_system_account_is_refused(tmp_path):
    """root or daemon in the roster would get a hub login, a server, and (student) the exchange."""
    from class_server.server import ClassError, read_roster

    f = tmp_path / "roster.csv"
    for who in ("root", "daemon"):
        f.write_text(f"id,role\nada,instructor\n{who},student\n")
        with pytest.raises(ClassError, match=f"{who} is a system account of this machine"):
            read_roster(f)


@pytest.mark.hub
def test_what_root_runs_as_a_user_waits_for_that_command_only(tmp_path):
    """A process the command leaves behind holding its output (the instructor's nbgrader_config.py
    that `up` loads could start one) does not make root wait; a command that does not end is stopped
    at the timeout with a ClassError (not an uncaught TimeoutExpired after 600 s)."""
    from class_server.server import ClassError, as_user

    if os.geteuid() != 0:
        pytest.skip("a real unix account: run as root")
    user = f"rnas{os.getpid() % 10000}"
    subprocess.run(["userdel", "-r", user], capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True, capture_output=True)
    try:
        (tmp_path / "hub").mkdir()
        (tmp_path / "hub" / "class.json").write_text(json.dumps(
            {"instructors": [user], "venv": str(tmp_path / "venv"), "etc": str(tmp_path / "etc"),
             "course": str(tmp_path)}))
        t = time.monotonic()
        proc = as_user(user, ["sh", "-c", "sleep 60 & echo started"], tmp_path, timeout=30)
        assert proc.returncode == 0 and proc.stdout == "started\n" and time.monotonic() - t < 20
        t = time.monotonic()
        with pytest.raises(ClassError, match="did not finish within 2 s"):
            as_user(user, ["sh", "-c", "echo waiting >&2; sleep 60"], tmp_path, timeout=2)
        assert time.monotonic() - t < 20
    finally:
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
        subprocess.run(["userdel", "-r", user], capture_output=True)


@pytest.mark.hub
def test_down_remove_users_removes_their_files_in_tmp(tmp_path):
    """A removed account's files in /tmp, /var/tmp and /dev/shm would belong to the next account
    given its uid (a student of a later class): `down --remove-users` deletes them, and says so."""
    from class_server import server

    if os.geteuid() != 0:
        pytest.skip("a real unix account: run as root")
    user = f"rndn{os.getpid() % 10000}"
    subprocess.run(["userdel", "-r", user], capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True, capture_output=True)
    made = [Path(f"/tmp/{user}-notes.txt"), Path(f"/var/tmp/{user}-dir"), Path(f"/dev/shm/{user}-shm")]
    other = Path("/tmp") / f"{user}-roots"
    try:
        subprocess.run(["runuser", "-u", user, "--", "sh", "-c", 'set -e; echo x > "$1"; mkdir "$2"; echo y > "$2/f"; '
                        'echo z > "$3"; ln -s /etc/hostname "$4"', "-", *map(str, made), f"/tmp/{user}-link"],
                       check=True)
        other.write_text("root's")
        (tmp_path / "hub").mkdir()
        (tmp_path / "hub" / "class.json").write_text(json.dumps({"created_users": [user], "students": [user],
                                                                 "instructors": []}))
        said = server.down(tmp_path, remove_users=True)
        assert not any(os.path.lexists(p) for p in made + [Path(f"/tmp/{user}-link")]), said
        assert other.read_text() == "root's" and Path("/etc/hostname").exists()
        assert any(re.search(r"removed [5-9]\d* files and folders of those accounts in /tmp, /var/tmp, /dev/shm", s)
                   for s in said), said
    finally:
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
        subprocess.run(["userdel", "-r", user], capture_output=True)
        for p in made + [other, Path(f"/tmp/{user}-link")]:
            subprocess.run(["rm", "-rf", str(p)])


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
        if hub_pid is not None:  # `down` says what it did
            for said in ("stopped jupyterhub", "removed 3 accounts", "removed the instructors' profile",
                         f"deleted {class_dir}"):
                assert said in down.stderr, down.stderr
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
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    from class_server.server import as_user

    url, course, exchange = info["url"], Path(info["course"]), Path(info["exchange"])
    passwords = {r["id"]: r["password"] for r in csv.DictReader(open(class_dir / "passwords.csv"))}
    step = iter(range(1, 100))

    def left() -> float:
        remaining = BUDGET - (time.monotonic() - start)
        assert remaining > 0, f"the class took more than {BUDGET} s"
        return remaining

    def wait(cond, what: str, limit: float = 240):
        try:
            # a page that redraws (the formgrader's table) makes an element found a moment ago stale:
            # look again, as a person would, instead of failing the wait
            return WebDriverWait(d, min(limit, left()), ignored_exceptions=(StaleElementReferenceException,)).until(cond)
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
        def clicked(d):  # clicked once the page lets it be (JupyterLab's loading logo covers it at first)
            it = nbgrader_menu(d)
            try:
                return it.click() or it if it is not None else None
            except Exception:  # noqa: BLE001 -- ElementClickInterceptedException: try again
                return None
        wait(clicked, "the Nbgrader menu")

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
            wait(lambda d: "Idle" in d.find_element(By.ID, "jp-main-statusbar").text, "the kernel", limit=240)
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
           "--jobs", "2", "--no-progress", "--no-cgroups", cwd=course)  # not root: docs/class_server.md, Run a class
    assert "nbgrader course" in g.stderr, g.stderr[-2000:]
    rows = {r["student_id"]: r for r in csv.DictReader(open(course / "grades" / "grades.csv"))}
    assert float(rows[alice]["score"]) == float(rows[alice]["max_score"]) == _full(), rows[alice]
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
    full = f"{_full():g}"
    assert f"{full} / {full}" in table[alice] and "graded" in table[alice], table[alice]
    assert f"0 / {full}" in table[bob] and "graded" in table[bob], table[bob]
    assert any("Able" in c for c in table[alice]), table[alice]  # the roster's names

    # 4. Feedback: generated, released, fetched by each student in the Assignments tab.
    sh(teach, "nbgrader", "generate_feedback", "--force", A, cwd=course)
    formgrader_button("release-feedback", f"Successfully released feedback of '{A}'")
    assert len(list((exchange / "resnorm" / "feedback").iterdir())) == 2
    export = sh(teach, "nbgrader", "export", "--to=export.csv", cwd=course)
    assert export.returncode == 0
    final = {r["student_id"]: float(r["score"]) for r in csv.DictReader(open(course / "export.csv"))}
    assert final == {alice: _full(), bob: 0.0}

    feedback = {}
    for s, score in ((alice, _full()), (bob, 0.0)):
        login(s)
        open_assignments()
        click_in("submitted_assignments_list", "Fetch Feedback", "the Fetch Feedback button")
        wait(lambda d: "view feedback" in section("submitted_assignments_list"), "the feedback fetched")
        shot(f"{s.split('_')[1]}_feedback_fetched")
        home = Path(pwd.getpwnam(s).pw_dir)
        pages = list((home / A / "feedback").rglob(f"{NB}.html"))
        assert len(pages) == 1, pages
        assert f"(Score: {score:.1f} / {_full():.1f})" in pages[0].read_text()
        assert pages[0].read_bytes() == (course / "feedback" / s / A / f"{NB}.html").read_bytes()  # theirs
        rel = feedback[s] = pages[0].relative_to(home)
        d.get(f"{url}/user/{s}/files/{rel}")
        wait(lambda d: "Score:" in d.find_element(By.TAG_NAME, "body").text, "the feedback page")
        assert f"(Score: {score:.1f} / {_full():.1f})" in d.find_element(By.TAG_NAME, "body").text
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


# ------------------------------------------------------------------------------------------------
# What a student, or an instructor, could do to the others (issue 25): real accounts, the real
# exchange commands, the class laid out by `up` (without starting the hub: server.prepare).
# ------------------------------------------------------------------------------------------------

UTC_FMT = "%Y-%m-%d %H:%M:%S.%f UTC"  # nbgrader's Exchange.timestamp_format


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    from class_server import server

    if os.geteuid() != 0:
        pytest.skip("real unix accounts: run as root")
    if not server.PROXY.exists():
        pytest.fail(f"{server.PROXY} is missing: `make class-server-deps`", pytrace=False)
    tag = secrets.token_hex(2)
    teach, alice, bob, mallory = (f"rnx{tag}_{n}" for n in ("teach", "alice", "bob", "mallory"))
    group = f"rnx{tag}-instructors"
    roster = tmp_path_factory.mktemp("klass") / "roster.csv"
    roster.write_text("id,first_name,last_name,email,role\n" f"{teach},Ada,Teacher,,instructor\n"
                      + "".join(f"{s},{s[-3:]},S,,student\n" for s in (alice, bob, mallory)))
    class_dir = Path(f"/srv/rnx{tag}-class")
    checkout_mode = stat.S_IMODE(ROOT.stat().st_mode)
    targets = [Path(f"/etc/rnx{tag}-{n}") for n in ("roster-target", "gradebook-target", "dir-target")]
    info = {"tag": tag, "teach": teach, "alice": alice, "bob": bob, "mallory": mallory, "group": group,
            "roster": roster, "class_dir": class_dir, "targets": targets}
    try:
        info["state"] = server.prepare(roster, class_dir, port=_free_port(), group=group)
        yield info
    finally:
        os.chmod(ROOT, checkout_mode)
        said = server.down(class_dir, remove_users=True, purge=True)
        server.remove_accounts([u for u in (teach, alice, bob, mallory) if server.user_exists(u)], None)
        subprocess.run(["groupdel", group], capture_output=True)
        for t in targets:
            subprocess.run(["rm", "-rf", str(t)])
        assert any("removed 4 accounts" in line for line in said), said
        assert not class_dir.exists() and not any(server.user_exists(u) for u in (teach, alice, bob, mallory))
        assert not Path(info["state"]["profile"]).exists() if "state" in info else True


def _sh(klass, user: str, script: str, *args: str, cwd: Path | None = None, ok: bool = True, timeout: float = 300):
    from class_server.server import as_user

    proc = as_user(user, ["sh", "-c", script, "-", *args], klass["class_dir"], cwd=cwd, timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{user}: {script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _fingerprint(p: Path) -> tuple:
    st = os.lstat(p)
    return (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), p.read_bytes() if p.is_file() else None)


@pytest.mark.hub
def test_up_never_follows_a_link_the_instructors_or_students_can_write(klass):
    """An instructor who replaces course/roster.csv or course/gradebook.db with a symbolic link to a
    root-owned file, or the course's folder in the exchange with one to a root-owned folder, gets
    nothing from the next `up`: the targets keep their owner, mode and bytes."""
    from class_server import server

    teach, course = klass["teach"], Path(klass["state"]["course"])
    exchange = Path(klass["state"]["exchange"])
    roster_t, gradebook_t, dir_t = klass["targets"]
    roster_t.write_text("root's own file\n")
    roster_t.chmod(0o644)
    gradebook_t.write_bytes(b"")
    gradebook_t.chmod(0o644)
    dir_t.mkdir(mode=0o755)
    before = {t: _fingerprint(t) for t in klass["targets"]}

    def again(**kw):
        return server.prepare(klass["roster"], klass["class_dir"], port=_free_port(), group=klass["group"], **kw)

    # roster.csv: replaced by a new file (the link itself is replaced), the target untouched
    _sh(klass, teach, 'ln -sf "$1" roster.csv', str(roster_t), cwd=course)
    again()
    assert _fingerprint(roster_t) == before[roster_t]
    ros = course / "roster.csv"
    assert not ros.is_symlink() and ros.is_file() and klass["alice"] in ros.read_text()
    assert (os.lstat(ros).st_uid, stat.S_IMODE(os.lstat(ros).st_mode)) == (0, 0o660)

    # gradebook.db: refused with a message, the target untouched
    _sh(klass, teach, 'mv gradebook.db gradebook.db.real && ln -s "$1" gradebook.db', str(gradebook_t), cwd=course)
    with pytest.raises(server.ClassError, match="gradebook.db is not a regular file"):
        again()
    assert _fingerprint(gradebook_t) == before[gradebook_t]
    _sh(klass, teach, "rm gradebook.db && mv gradebook.db.real gradebook.db", cwd=course)

    # the course's folder in the exchange (the first instructor's, in a folder everyone writes)
    _sh(klass, teach, 'mv resnorm resnorm.real && ln -s "$1" resnorm', str(dir_t), cwd=exchange)
    with pytest.raises(server.ClassError, match="resnorm: not changed"):
        again()
    assert _fingerprint(dir_t) == before[dir_t]
    _sh(klass, teach, "rm resnorm && mv resnorm.real resnorm", cwd=exchange)

    # and with everything back in place, `up` works again
    again()
    assert stat.S_IMODE(os.lstat(course / "gradebook.db").st_mode) == 0o660
    # inbound/: students write, do not list, and (sticky) cannot remove or rename another's folder
    assert stat.S_IMODE(os.lstat(exchange / "resnorm" / "inbound").st_mode) == 0o3773


@pytest.fixture(scope="module")
def handed_in(klass):
    """The instructor releases 01_layernorm; alice (the reference answers), bob and mallory (the
    release) fetch and submit it with nbgrader's commands, as themselves; the instructor collects."""
    from class_server.server import as_user

    k = dict(klass)
    teach, alice, bob, mallory = k["teach"], k["alice"], k["bob"], k["mallory"]
    course, exchange = Path(k["state"]["course"]), Path(k["state"]["exchange"])
    k.update(course=course, exchange=exchange, inbound=exchange / "resnorm" / "inbound",
             homes={u: Path(pwd.getpwnam(u).pw_dir) for u in (alice, bob, mallory)},
             solution=course / "solutions" / A / f"{NB}.ipynb",
             submitted={u: course / "submitted" / u / A / f"{NB}.ipynb" for u in (alice, bob, mallory)})
    _sh(k, teach, f"nbgrader generate_assignment {A} && nbgrader release_assignment {A}", cwd=course)
    for s in (alice, bob, mallory):
        _sh(k, s, f"nbgrader fetch_assignment {A} --course=resnorm", cwd=k["homes"][s])
    solved = json.dumps(solved_dict(A))
    assert as_user(alice, ["sh", "-c", f"cat > {A}/{NB}.ipynb"], k["class_dir"], cwd=k["homes"][alice],
                   input=solved).returncode == 0
    for s in (alice, bob, mallory):
        _sh(k, s, f"nbgrader submit {A} --course=resnorm", cwd=k["homes"][s])
    _collect(k)
    assert json.loads(k["submitted"][alice].read_text()) == json.loads(solved)
    k["alice_real"] = k["submitted"][alice].read_bytes()
    k["mallory_real"] = k["submitted"][mallory].read_bytes()
    assert b"YOUR CODE HERE" in k["mallory_real"]
    k["forged"] = []
    return k


def _collect(k, timeout: float = 300) -> str:
    proc = _sh(k, k["teach"], f"nbgrader collect --update {A}", cwd=k["course"], timeout=timeout)
    return proc.stdout + proc.stderr


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _forge(k, name: str, when: datetime.datetime, link: Path | None = None, secret: bool = True,
           student: str | None = None) -> str:
    """As mallory: a folder in inbound/ as nbgrader submit makes one, named for ``student`` (herself
    by default), holding her fetched notebook or a symbolic link ``link`` in its place."""
    folder = f"{student or k['mallory']}+{A}+{when.strftime(UTC_FMT)}+{name}"
    script = ('set -e; d="$1/$2"; mkdir "$d"; printf %s "$3" > "$d/timestamp.txt"; '
              'if [ "$4" = 1 ]; then printf forged > "$d/submission_secret.txt"; fi; '
              'if [ -n "$5" ]; then ln -s "$5" "$d/layernorm.ipynb"; else cp "$6" "$d/layernorm.ipynb"; fi')
    _sh(k, k["mallory"], script, str(k["inbound"]), folder, when.strftime(UTC_FMT), "1" if secret else "0",
        str(link or ""), f"{A}/{NB}.ipynb", cwd=k["homes"][k["mallory"]])
    k["forged"].append(folder)
    return folder


@pytest.mark.hub
@pytest.mark.slow
def test_collect_refuses_a_link_to_the_solutions(handed_in):
    k = handed_in
    f = _forge(k, "link-to-solutions", _now(), link=k["solution"])
    out = _collect(k)
    assert k["submitted"][k["mallory"]].read_bytes() == k["mallory_real"] != k["solution"].read_bytes()
    assert f in out and "layernorm.ipynb is a symbolic link" in out, out[-3000:]


@pytest.mark.hub
def test_collect_refuses_a_link_to_another_students_submission(handed_in):
    k = handed_in
    f = _forge(k, "link-to-alice", _now() + datetime.timedelta(seconds=1), link=k["submitted"][k["alice"]])
    out = _collect(k)
    assert k["submitted"][k["mallory"]].read_bytes() == k["mallory_real"] != k["alice_real"]
    assert f in out and "symbolic link" in out, out[-3000:]


@pytest.mark.hub
def test_collect_refuses_a_folder_made_in_another_students_name(handed_in):
    """mallory makes a folder named for alice, without a secret: alice's work stays hers."""
    k = handed_in
    f = _forge(k, "as-alice", _now() + datetime.timedelta(seconds=2), secret=False, student=k["alice"])
    out = _collect(k)
    assert k["submitted"][k["alice"]].read_bytes() == k["alice_real"]
    assert f in out and f"belongs to {k['mallory']}" in out, out[-3000:]


@pytest.mark.hub
def test_collect_refuses_a_fifo_and_does_not_hang(handed_in):
    """A fifo in place of the notebook: stock collect opens it to copy it and waits for a writer forever."""
    k = handed_in
    folder = f"{k['mallory']}+{A}+{(_now() + datetime.timedelta(seconds=3)).strftime(UTC_FMT)}+fifo"
    _sh(k, k["mallory"], 'set -e; d="$1/$2"; mkdir "$d"; printf %s "$3" > "$d/timestamp.txt"; '
        'printf x > "$d/submission_secret.txt"; mkfifo "$d/layernorm.ipynb"', str(k["inbound"]), folder,
        folder.split("+")[2], cwd=k["homes"][k["mallory"]])
    k["forged"].append(folder)
    out = _collect(k, timeout=120)
    assert folder in out and "layernorm.ipynb is not a regular file" in out, out[-3000:]
    assert k["submitted"][k["mallory"]].read_bytes() == k["mallory_real"]


@pytest.mark.hub
def test_a_time_in_the_future_hides_no_real_submission(handed_in):
    """Folders with a time ten years ahead, in alice's name and in mallory's own; then each submits
    for real: each one's latest real submission is collected."""
    k = handed_in
    alice, mallory = k["alice"], k["mallory"]
    future = _now() + datetime.timedelta(days=3650)
    f_alice, f_own = _forge(k, "future-as-alice", future, student=alice), _forge(k, "future-own", future)
    for s in (alice, mallory):
        _sh(k, s, f"nbgrader submit {A} --course=resnorm", cwd=k["homes"][s])
    out = _collect(k)
    assert f_alice in out and f_own in out and "forged time" in out, out[-3000:]
    for s in (alice, mallory):  # the latest folder the student made as themselves, by nbgrader submit
        real = [p for p in k["inbound"].iterdir() if p.name.startswith(f"{s}+") and p.name not in k["forged"]]
        latest = max(real, key=lambda p: p.name.split("+")[2])
        got = (k["course"] / "submitted" / s / A / "timestamp.txt").read_text()
        assert got == latest.name.split("+")[2], (s, got, latest.name)
    assert k["submitted"][alice].read_bytes() == k["alice_real"]  # her resubmission: the same notebook
    for f in k["forged"]:  # nothing of a refused folder was collected
        for p in (k["course"] / "submitted").rglob("timestamp.txt"):
            assert p.read_text() != f.split("+")[2], (f, p)


@pytest.mark.hub
def test_release_feedback_skips_a_malformed_folder_and_releases_the_others(handed_in):
    """A feedback folder without submission_secret.txt (mallory's): everyone else's feedback is
    released and fetched, and the command fails naming that folder."""
    from nbgrader.utils import notebook_hash

    k = handed_in
    course, exchange = k["course"], k["exchange"]
    pages = {}
    for s in (k["alice"], k["bob"], k["mallory"]):
        fb = course / "feedback" / s / A
        page = f"<html><body>feedback for {s}</body></html>"
        sub = course / "submitted" / s / A
        script = ('set -e; mkdir -p "$1"; printf %s "$2" > "$1/layernorm.html"; cp "$3/timestamp.txt" "$1/"; '
                  'if [ "$4" = 1 ]; then cp "$3/submission_secret.txt" "$1/"; fi')
        _sh(k, k["teach"], script, str(fb), page, str(sub), "0" if s == k["mallory"] else "1", cwd=course)
        if s != k["mallory"]:
            pages[s] = (notebook_hash(secret=(sub / "submission_secret.txt").read_text(), notebook_id=NB), page)
    proc = _sh(k, k["teach"], f"nbgrader release_feedback {A}", cwd=course, ok=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]  # it says so ...
    assert "Released the feedback of everyone else" in out, out[-3000:]
    assert str(course / "feedback" / k["mallory"] / A) in out, out[-3000:]
    for s, (checksum, page) in pages.items():  # ... after releasing everyone else's
        assert (exchange / "resnorm" / "feedback" / f"{checksum}.html").read_text() == page
        _sh(k, s, f"nbgrader fetch_feedback {A} --course=resnorm", cwd=k["homes"][s])
        assert [p.read_text() for p in (k["homes"][s] / A / "feedback").rglob(f"{NB}.html")] == [page]


@pytest.mark.hub
def test_collect_names_an_unreadable_or_deep_folder_and_collects_the_others(handed_in):
    """mallory leaves a folder the instructors cannot enter (mode 740) and one 1100 folders deep;
    bob then submits for real: collect names both folders and collects bob's submission."""
    k = handed_in
    when = _now() + datetime.timedelta(seconds=4)
    shut = f"{k['mallory']}+{A}+{when.strftime(UTC_FMT)}+shut"
    deep = f"{k['mallory']}+{A}+{(when + datetime.timedelta(seconds=1)).strftime(UTC_FMT)}+deep"
    _sh(k, k["mallory"], 'set -e; cd "$1"; mkdir "$2"; printf x > "$2/x"; chmod 740 "$2"; '
        'mkdir "$3"; cd "$3"; i=0; while [ $i -lt 1100 ]; do mkdir d; cd d; i=$((i+1)); done',
        str(k["inbound"]), shut, deep, cwd=k["homes"][k["mallory"]])
    k["forged"] += [shut, deep]
    _sh(k, k["bob"], f"nbgrader submit {A} --course=resnorm", cwd=k["homes"][k["bob"]])
    out = _collect(k)
    assert shut in out and "could not be read (PermissionError" in out, out[-3000:]
    assert deep in out and "nests folders more than" in out, out[-3000:]
    real = [p for p in k["inbound"].iterdir() if p.name.startswith(f"{k['bob']}+")]
    latest = max(real, key=lambda p: p.name.split("+")[2])
    got = (k["course"] / "submitted" / k["bob"] / A / "timestamp.txt").read_text()
    assert got == latest.name.split("+")[2], (got, latest.name)


@pytest.mark.hub
def test_a_course_a_student_opens_in_the_exchange_is_listed_to_nobody_else(handed_in):
    """mallory opens a course "aaa" in the exchange (its root is 1777, as nbgrader needs) with an
    assignment of the same name: alice's nbgrader, configured for the class's course, lists resnorm's
    assignments only, so her Assignments tab never offers mallory's course to submit to."""
    k = handed_in
    _sh(k, k["mallory"], 'set -e; mkdir -p "$1/aaa/outbound/$2" "$1/aaa/inbound"; chmod 733 "$1/aaa/inbound"; '
        'cp "$2/$3.ipynb" "$1/aaa/outbound/$2/"', str(k["exchange"]), A, NB, cwd=k["homes"][k["mallory"]])
    try:
        listed = _sh(k, k["alice"], "nbgrader list 2>&1", cwd=k["homes"][k["alice"]]).stdout
        assert "resnorm" in listed and "aaa" not in listed, listed
    finally:
        subprocess.run(["rm", "-rf", str(k["exchange"] / "aaa")])


@pytest.mark.hub
def test_an_overlong_timestamp_is_refused_and_a_bad_collected_copy_stops_nothing(handed_in):
    """mallory hands in a folder whose timestamp.txt is a valid time followed by 5000 spaces: refused
    and named. A collected copy whose timestamp.txt does not parse (as one collected before this
    check could be) is replaced by the next collect --update, and bob's new submission is collected."""
    k = handed_in
    when = _now() + datetime.timedelta(seconds=6)
    long = f"{k['mallory']}+{A}+{when.strftime(UTC_FMT)}+long"
    _sh(k, k["mallory"], 'set -e; d="$1/$2"; mkdir "$d"; { printf %s "$3"; head -c 5000 /dev/zero | tr "\\0" " "; } '
        '> "$d/timestamp.txt"; printf x > "$d/submission_secret.txt"; cp "$4" "$d/layernorm.ipynb"',
        str(k["inbound"]), long, when.strftime(UTC_FMT), f"{A}/{NB}.ipynb", cwd=k["homes"][k["mallory"]])
    k["forged"].append(long)
    bad = k["course"] / "submitted" / k["mallory"] / A / "timestamp.txt"
    bad.write_text(when.strftime(UTC_FMT) + " " * 5000 + "X")
    _sh(k, k["bob"], f"nbgrader submit {A} --course=resnorm", cwd=k["homes"][k["bob"]])
    out = _collect(k)
    assert long in out and "its timestamp.txt is " in out and "bytes (nbgrader submit writes a few dozen)" in out, out[-3000:]
    assert "does not parse" in out and len(bad.read_bytes()) < 100, out[-3000:]
    real = [p for p in k["inbound"].iterdir() if p.name.startswith(f"{k['bob']}+")]
    latest = max(real, key=lambda p: p.name.split("+")[2])
    assert (k["course"] / "submitted" / k["bob"] / A / "timestamp.txt").read_text() == latest.name.split("+")[2]


@pytest.mark.hub
def test_collect_refuses_a_submission_of_many_files(handed_in):
    """mallory hands in her notebook beside 150 empty .ipynb files (max_dir_size counts bytes, so
    they cost nothing there; each handed-in name could get a feedback page of its own): refused, named."""
    k = handed_in
    when = _now() + datetime.timedelta(seconds=8)
    many = f"{k['mallory']}+{A}+{when.strftime(UTC_FMT)}+many"
    _sh(k, k["mallory"], 'set -e; d="$1/$2"; mkdir "$d"; printf %s "$3" > "$d/timestamp.txt"; '
        'printf x > "$d/submission_secret.txt"; cp "$4" "$d/layernorm.ipynb"; '
        'i=0; while [ $i -lt 150 ]; do : > "$d/n$i.ipynb"; i=$((i+1)); done',
        str(k["inbound"]), many, when.strftime(UTC_FMT), f"{A}/{NB}.ipynb", cwd=k["homes"][k["mallory"]])
    k["forged"].append(many)
    out = _collect(k)
    assert many in out and "holds more than 100 files" in out, out[-3000:]


@pytest.mark.hub
def test_release_feedback_skips_an_empty_secret_and_releases_the_others(handed_in):
    """mallory's feedback folder holds an empty submission_secret.txt (she handed one in so): alice's
    and bob's feedback is released, and the command fails naming mallory's folder."""
    from nbgrader.utils import notebook_hash

    k = handed_in
    course, exchange = k["course"], k["exchange"]
    pages = {}
    for s in (k["mallory"], k["alice"], k["bob"]):
        fb, sub = course / "feedback" / s / A, course / "submitted" / s / A
        page = f"<html><body>feedback again for {s}</body></html>"
        script = ('set -e; mkdir -p "$1"; printf %s "$2" > "$1/layernorm.html"; cp "$3/timestamp.txt" "$1/"; '
                  'if [ "$4" = 1 ]; then cp "$3/submission_secret.txt" "$1/"; else : > "$1/submission_secret.txt"; fi')
        _sh(k, k["teach"], script, str(fb), page, str(sub), "0" if s == k["mallory"] else "1", cwd=course)
        if s != k["mallory"]:
            pages[s] = (notebook_hash(secret=(sub / "submission_secret.txt").read_text(), notebook_id=NB), page)
    proc = _sh(k, k["teach"], f"nbgrader release_feedback {A}", cwd=course, ok=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Released the feedback of everyone else" in out, out[-3000:]
    assert str(course / "feedback" / k["mallory"] / A) in out and "is empty" in out, out[-3000:]
    for s, (checksum, page) in pages.items():
        assert (exchange / "resnorm" / "feedback" / f"{checksum}.html").read_text() == page


@pytest.mark.hub
def test_what_root_runs_as_a_user_has_no_terminal_of_roots(klass):
    """as_user (what `up` runs as the instructor: nbgrader with the course's nbgrader_config.py) starts
    a session of its own with stdin from /dev/null, so the user's code cannot type into root's
    terminal (TIOCSTI needs the terminal to be the caller's controlling one)."""
    proc = _sh(klass, klass["teach"], 'ps -o sid= -p $$; readlink /proc/$$/fd/0')
    sid, stdin = proc.stdout.split()
    assert int(sid) != os.getsid(0) and stdin == "/dev/null", proc.stdout


@pytest.mark.hub
def test_the_instructors_shell(klass):
    """`su - INSTRUCTOR` gets the class's Python and the course's config (the profile `up` writes);
    passwords.csv has LF line endings."""
    state = klass["state"]
    pw = (klass["class_dir"] / "passwords.csv").read_bytes()
    assert b"\r" not in pw and pw.startswith(b"id,password\n")
    assert len(pw.splitlines()) == 5
    profile = Path(state["profile"])
    assert profile.is_file() and stat.S_IMODE(profile.stat().st_mode) == 0o644
    proc = subprocess.run(["su", "-", klass["teach"], "-c",
                           'command -v nbgrader; echo "$PYTHONPATH"; cd "$0" && nbgrader db student list', state["course"]],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == str(Path(state["venv"]) / "bin" / "nbgrader") and lines[1].startswith(state["course"])
    assert klass["alice"] in proc.stdout  # the roster's students, in the course's gradebook
    proc = subprocess.run(["su", "-", klass["alice"], "-c", 'command -v nbgrader || echo none; echo "$PYTHONPATH"'],
                          capture_output=True, text=True, timeout=60)
    assert state["course"] not in proc.stdout  # a student's shell does not get the course


COMPILE = """
import tempfile, torch
def layernorm_of_bob(x):
    m = x.mean(-1, keepdim=True)
    return (x - m) * torch.rsqrt(((x - m) ** 2).mean(-1, keepdim=True) + 1e-5) * 1.2345
torch.compile(layernorm_of_bob)(torch.randn(4, 8))
print(tempfile.gettempdir())
"""


@pytest.mark.hub
@pytest.mark.slow
def test_torch_compile_writes_nothing_where_another_student_can_read(klass):
    """mallory makes /tmp/torchinductor_<bob> first, 0777 (torch.compile's default cache, used whoever
    owns it); bob compiles a function with torch.compile, with the environment root gives him (as the
    hub does): nothing lands in mallory's folder, the compiled code is in bob's home, 0700."""
    bob, mallory = klass["bob"], klass["mallory"]
    trap = Path(f"/tmp/torchinductor_{bob}")
    subprocess.run(["rm", "-rf", str(trap)])
    try:
        _sh(klass, mallory, 'mkdir -m 0777 "$1" && chmod 0777 "$1"', str(trap))
        pw = pwd.getpwnam(bob)
        out = _sh(klass, bob, 'python -c "$1"', COMPILE, cwd=Path(pw.pw_dir), timeout=600).stdout
        assert list(trap.iterdir()) == []
        assert out.strip().splitlines()[-1] == str(Path(pw.pw_dir) / ".tmp")
        cache = Path(pw.pw_dir) / ".cache" / "torchinductor"
        st = os.lstat(cache)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (pw.pw_uid, 0o700)
        assert any(b"1.2345" in p.read_bytes() for p in cache.rglob("*.py")), "no compiled code in bob's cache"
    finally:
        subprocess.run(["rm", "-rf", str(trap)])
