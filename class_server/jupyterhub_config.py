"""JupyterHub's configuration for the class server (``python -m class_server up`` copies it into
``CLASS_DIR/hub/`` and starts ``jupyterhub -f`` on that copy, as root).

Everything specific to one class (ports, users, folders) is read from ``class.json`` beside this
file, written by ``up`` from the roster; nothing here needs editing for a class. To use another
authenticator, replace the ``authenticator_class`` block (docs/class_server.md, "Run a class").
"""
import json
import os

c = get_config()  # noqa: F821 -- injected by JupyterHub

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "class.json")) as f:
    CLASS = json.load(f)
INSTRUCTORS = set(CLASS["instructors"])
STUDENTS = set(CLASS["students"])
VENV = CLASS["venv"]

# The proxy (configurable-http-proxy from npm) listens on ip:port; the hub and the proxy's API on
# 127.0.0.1 only. TLS: put a reverse proxy (nginx, Caddy) with the certificate in front of ip:port.
c.JupyterHub.ip = CLASS["ip"]
c.JupyterHub.port = CLASS["port"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = CLASS["hub_port"]
c.ConfigurableHTTPProxy.command = [CLASS["proxy"]]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{CLASS['proxy_api_port']}"
c.JupyterHub.db_url = "sqlite:///" + os.path.join(HERE, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(HERE, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(HERE, "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server

# Who may log in: the roster, checked against the machine's accounts with PAM (the passwords of the
# unix accounts). Nobody is a hub admin: the admin role can open any user's server, so an
# instructor with it could run code as a student.
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = INSTRUCTORS | STUDENTS
c.Authenticator.admin_users = set()
c.PAMAuthenticator.open_sessions = False

# One server per user, a process running as that unix user (LocalProcessSpawner), in the class's
# Python: the course's venv with the student pack's runtime (coursekit), which is also every
# notebook's kernel (python3 = the server's own interpreter). Each server in a cgroup of its own
# (class_server/spawner.py): its memory, CPU and processes per role, from `up` (class.json's limits).
LIMITS = CLASS.get("limits")
c.JupyterHub.spawner_class = "class_server_spawner.LimitedSpawner"
c.LimitedSpawner.limits = LIMITS is not None
c.Spawner.poll_interval = 10
# every start shows the spawn page with its messages (one may say why the last server was stopped)
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
c.Spawner.cmd = [os.path.join(VENV, "bin", "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.env_keep = ["LANG", "LC_ALL", "TZ"]
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180


def _per_role(spawner):
    """Students get the students' Jupyter config (Assignments tab; no formgrader, no Create
    Assignment); instructors the instructors' (formgrader on the course, started in the course)."""
    name = spawner.user.name
    role = "instructor" if name in INSTRUCTORS else "student"
    spawner.environment.update({
        "PATH": os.pathsep.join([os.path.join(VENV, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
        "JUPYTER_CONFIG_PATH": os.path.join(CLASS["etc"], role),
        "OMP_NUM_THREADS": "1",
    })
    if LIMITS is not None:
        mine = LIMITS[role]
        spawner.mem_limit = int(mine["memory_mb"]) << 20
        spawner.cpu_limit = float(mine["cpus"])
        spawner.pids_limit = int(mine["pids"])
        spawner.delegate = role == "instructor"  # their grader makes a cgroup per submission inside theirs
    if role == "instructor":
        spawner.notebook_dir = CLASS["course"]
        # the course's nbgrader_config.py names course code (the feedback release of
        # autograder/nbgrader/release_feedback.py), which lives in the course, not in the class's Python
        spawner.environment["PYTHONPATH"] = CLASS["course"]


c.Spawner.pre_spawn_hook = _per_role
