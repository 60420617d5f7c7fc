"""Run a class on one server: JupyterHub, one unix account per student, nbgrader's exchange and the
course grader (``make class-server ROSTER=roster.csv``, ``make class-server-stop``).

``python -m class_server up ROSTER`` (as root) lays out ``CLASS_DIR`` (default ``/srv/resnorm``):

    venv/       the class's Python: the course's .venv (hard links, no editable install of this
                checkout) with the student pack's coursekit wheel; every user's server and kernel
    python/     a copy (hard links) of .venv's interpreter, made only when other users cannot run
                the original (a pyenv under /root)
    course/     the instructors' nbgrader course (config, solutions/, exercises/, the grader;
                gradebook.db, submitted/, autograded/, feedback/ as they come): root, group
                <instructors>, 2770, nobody else
    exchange/   nbgrader's exchange, 1777 (root); exchange/<course_id>/ is the instructors' (2775)
    etc/        the Jupyter config of each role (JUPYTER_CONFIG_PATH of its servers)
    hub/        JupyterHub's config, database, secrets and log (root, 0700)
    passwords.csv  the first password of every account ``up`` created (root, 0600)

and starts JupyterHub (PAM logins, LocalProcessSpawner) with configurable-http-proxy.
``python -m class_server down`` stops it and every process of the class's users.
"""
